// Aligned file I/O for the disk tier (zof/disk_tier.h): a file opened with O_DIRECT where the
// file system takes it (else buffered, saying why), positioned reads and writes that retry short
// transfers, EINTR and EAGAIN and turn every other failure into a zof::Error naming the file, and
// an engine that runs transfers as descriptors with explicit completion (the shape of DeepSpeed's
// csrc/aio). Two engines behind one interface: io_uring (liburing, one ring, many requests in
// flight) where the build has liburing and the kernel takes it, else a pool of pread/pwrite
// threads; both settle each step of a transfer through the same rules, so they fail alike.
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

// A test hook, called before each pread/pwrite (or io_uring request, at its submission) with the
// operation ('r' or 'w'), the bytes asked for and the file offset. It returns -1 to let the call
// run, a count n >= 0 to make it move only min(n, asked) bytes (a short transfer), or -errno to
// make it fail so (EINTR, EAGAIN, ENOSPC, EINVAL): io_uring then gets no request and the error
// is settled as its completion would be.
using IoFaultHook = std::function<long(char op, size_t bytes, uint64_t offset)>;
void set_io_fault_hook(IoFaultHook hook);  // empty: none

// A file of fixed size for aligned transfers.
class BlockFile {
 public:
  friend class IoEngine;
  // Creates path (it must not exist) with `bytes` reserved on the file system (posix_fallocate:
  // a full one is refused here, naming the path and the bytes), opened with O_DIRECT when
  // try_direct and the file system accepts it (an aligned write at offset 0 tells), else
  // buffered with note() saying why. The file is removed again when this throws.
  BlockFile(const std::filesystem::path& path, uint64_t bytes, bool try_direct = true);
  // A run's store (zof/disk_tier.h DiskStore): a file of `bytes` whose space is reserved only
  // for the `reserve` ranges (offset, length; the rest is a hole until written). existing: the
  // file is opened as it is and must be `bytes` long (else zof::Error: it was changed or is
  // another's), its ranges reserved now (nothing read or written; O_DIRECT probed by an aligned
  // read); else it is created as above (it must not exist).
  BlockFile(const std::filesystem::path& path, uint64_t bytes,
            const std::vector<std::pair<uint64_t, uint64_t>>& reserve, bool try_direct,
            bool existing);
  ~BlockFile();  // closes; remove() deletes the file
  BlockFile(const BlockFile&) = delete;
  BlockFile& operator=(const BlockFile&) = delete;

  bool direct() const { return direct_; }
  const std::string& note() const { return note_; }  // why not O_DIRECT ("" when direct)
  const std::filesystem::path& path() const { return path_; }
  uint64_t size() const { return size_; }
  void remove();
  // Every write done so far durable (fdatasync); zof::Error naming the file on failure.
  void sync() const;
  // The file system's space of a range given back (a hole reads as zeros): best effort.
  void punch(uint64_t off, uint64_t n) const;

  // n bytes at offset off, all of them (short transfers, EINTR and EAGAIN retried). With
  // O_DIRECT, buf, n and off must be multiples of kIoAlign. A read past the file's end (the file
  // truncated under the run) or any other failure: zof::Error naming the file, the offset and
  // the cause.
  void read(void* buf, size_t n, uint64_t off) const;
  void write(const void* buf, size_t n, uint64_t off) const;

 private:
  // One step of a transfer of n bytes at off, `done` of them moved before it, returned r (bytes
  // moved, or -errno): the bytes it moved, 0 to run it again (EINTR, EAGAIN); any other failure
  // throws the zof::Error naming the file, the offset and the cause. Both engines call it.
  size_t settle(char op, size_t n, uint64_t off, size_t done, long r) const;
  std::filesystem::path path_;
  uint64_t size_ = 0;
  int fd_ = -1;
  int lock_fd_ = -1;  // the first descriptor, holding the flock, where fd_ is the O_DIRECT one
  bool direct_ = false;
  std::string note_;
};

// A 64-bit hash of n bytes (four lanes of 64-bit words, then the tail), chained from seed:
// what a checkpoint records of each block in the disk tier's store, checked on resume.
uint64_t hash_bytes(const void* p, size_t n, uint64_t seed);

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
  friend class IoEngine;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int remaining_ = 0;
  std::string error_;
};

// Worker threads that run closures (the pool engine's BlockFile::read/write) from one FIFO queue.
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

// One transfer: `bytes` bytes between buf and file at offset off, all of them. With O_DIRECT,
// buf, bytes and off are multiples of kIoAlign. then (optional) runs on the engine's thread once
// the transfer is whole (a partial page's copy out of its own page), never after a failure; it
// and what it captures live until the transfer is done, whatever the outcome (a partial page's
// own buffer is kept so).
struct IoTransfer {
  char op = 'r';  // 'r' file -> buf, 'w' buf -> file
  const BlockFile* file = nullptr;
  char* buf = nullptr;
  size_t bytes = 0;
  uint64_t off = 0;
  std::function<void()> then;
};

// Auto: io_uring where it runs, else the pool (saying why); Pool and Uring force one.
enum class IoEngineKind { Auto, Pool, Uring };

// The engine ZOF_IO asks for: unset, "" or "auto" Auto, "pool" Pool, "uring" Uring; anything
// else is a zof::Error naming the values. Read when a tier starts (make_io_engine's callers).
IoEngineKind io_engine_from_env();
// Whether this build has liburing (ZOF_HAVE_URING).
bool io_uring_built();
// "" where io_uring runs here (a ring of the engine's depth is set up and torn down again), else
// why not: "built without liburing", or io_uring_queue_init's error (ENOSYS on an old kernel,
// EPERM under seccomp or kernel.io_uring_disabled).
std::string io_uring_unavailable();

// Runs transfers and completes their tickets. The destructor waits for every transfer submitted.
class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Queues the transfers as one group; the ticket completes when each one is whole or has
  // failed (wait() then throws the first failure's zof::Error).
  virtual std::shared_ptr<IoTicket> submit(std::vector<IoTransfer> transfers) = 0;
  // "io_uring" or "pread/pwrite".
  virtual const char* name() const = 0;
  // One line for the tier's start: the engine, its depth or threads, and why the pool where
  // io_uring was not used ("pread/pwrite on 2 threads (io_uring refused: ...)").
  const std::string& describe() const { return describe_; }

 protected:
  friend std::unique_ptr<IoEngine> make_io_engine(int, IoEngineKind);
  static std::shared_ptr<IoTicket> new_ticket(int transfers);
  static void finish(IoTicket& t, const std::string& error);  // one transfer done ("" ok)
  static int fd(const BlockFile& f) { return f.fd_; }
  static size_t settle(const BlockFile& f, char op, size_t n, uint64_t off, size_t done, long r) {
    return f.settle(op, n, off, done, r);
  }
  std::string describe_;
};

// io_uring's queue depth: requests in flight at once (the tier cuts blocks into 4 MiB pieces).
constexpr unsigned kUringDepth = 64;

// The engine of that kind: Auto takes io_uring where io_uring_unavailable() is "", else the
// pool with the reason in describe(); Uring where it cannot run is a zof::Error saying why.
// threads: the pool's (io_uring runs one completion thread whatever it is).
std::unique_ptr<IoEngine> make_io_engine(int threads, IoEngineKind kind);

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
