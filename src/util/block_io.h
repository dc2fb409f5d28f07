// Aligned file I/O for the disk tier (zof/disk_tier.h): a file opened with O_DIRECT where the
// file system takes it (else buffered, saying why), positioned reads and writes that retry short
// transfers and EINTR and turn every other failure into a zof::Error naming the file, and a small
// pool of threads that runs transfers as descriptors with explicit completion (the shape of
// DeepSpeed's csrc/aio). Plain pread/pwrite: io_uring is not used yet.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zof {

// O_DIRECT's alignment of buffers, offsets and lengths: 4096 covers every logical block size in
// use (512 and 4096).
constexpr size_t kIoAlign = 4096;

// A test hook, called before each pread/pwrite with the operation ('r' or 'w'), the bytes asked
// for and the file offset. It returns -1 to let the call run, a count n >= 0 to make it move only
// min(n, asked) bytes (a short transfer), or -errno to make it fail so (EINTR, ENOSPC, EINVAL).
using IoFaultHook = std::function<long(char op, size_t bytes, uint64_t offset)>;
void set_io_fault_hook(IoFaultHook hook);  // empty: none

// A file of fixed size for aligned transfers.
class BlockFile {
 public:
  // Creates path (it must not exist) with `bytes` reserved on the file system (posix_fallocate:
  // a full one is refused here, naming the path and the bytes), opened with O_DIRECT when
  // try_direct and the file system accepts it (an aligned write at offset 0 tells), else
  // buffered with note() saying why. The file is removed again when this throws.
  BlockFile(const std::filesystem::path& path, uint64_t bytes, bool try_direct = true);
  ~BlockFile();  // closes; remove() deletes the file
  BlockFile(const BlockFile&) = delete;
  BlockFile& operator=(const BlockFile&) = delete;

  bool direct() const { return direct_; }
  const std::string& note() const { return note_; }  // why not O_DIRECT ("" when direct)
  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }
  void remove();

  // n bytes at offset off, all of them (short transfers and EINTR retried). With O_DIRECT, buf,
  // n and off must be multiples of kIoAlign. A read past the file's end (the file truncated
  // under the run) or any other failure: zof::Error naming the file, the offset and the cause.
  void read(void* buf, size_t n, uint64_t off) const;
  void write(const void* buf, size_t n, uint64_t off) const;

 private:
  std::filesystem::path path_;
  uint64_t size_ = 0;
  int fd_ = -1;
  bool direct_ = false;
  std::string note_;
};

// Bytes of free space on the file system holding dir (statvfs f_bavail).
uint64_t free_space(const std::filesystem::path& dir);

// Completion of a group of transfers: wait() returns when all are done and throws the first
// one's error (a zof::Error) if any failed.
class IoTicket {
 public:
  bool done() const;
  void wait() const;
  std::string error() const;  // "" while none

 private:
  friend class IoPool;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int remaining_ = 0;
  std::string error_;
};

// Worker threads that run transfers (closures calling BlockFile::read/write) from one FIFO queue.
class IoPool {
 public:
  explicit IoPool(int threads);
  ~IoPool();  // runs what is queued, then joins
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;
  int threads() const { return (int)workers_.size(); }
  // Queues the jobs as one group; the ticket completes when every job has run.
  std::shared_ptr<IoTicket> submit(std::vector<std::function<void()>> jobs);

 private:
  void work();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<IoTicket>>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// A buffer aligned to kIoAlign (free()d when it goes).
struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data = nullptr;
  size_t size = 0;
};

}  // namespace zof
