// Aligned file I/O for the disk tier (block_io.h): O_DIRECT with a buffered fallback, transfers
// retried until whole, and the worker pool that runs them.
#include "util/block_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "zof/error.h"

namespace zof {
namespace fs = std::filesystem;

namespace {

std::mutex g_hook_mu;
IoFaultHook g_hook;

// The hook's verdict for one call: -1 run it as asked; else what it returns.
long hooked(char op, size_t n, uint64_t off) {
  std::lock_guard<std::mutex> l(g_hook_mu);
  return g_hook ? g_hook(op, n, off) : -1;
}

std::string errno_text(int e) { return std::strerror(e); }

// One pread/pwrite, as the hook has it.
ssize_t transfer(int fd, char op, char* buf, size_t n, uint64_t off) {
  const long h = hooked(op, n, off);
  if (h < -1) {
    errno = (int)-h;
    return -1;
  }
  if (h >= 0) n = std::min(n, (size_t)h);
  return op == 'r' ? ::pread(fd, buf, n, (off_t)off) : ::pwrite(fd, buf, n, (off_t)off);
}

}  // namespace

void set_io_fault_hook(IoFaultHook hook) {
  std::lock_guard<std::mutex> l(g_hook_mu);
  g_hook = std::move(hook);
}

AlignedBuffer::AlignedBuffer(size_t bytes) : size((bytes + kIoAlign - 1) / kIoAlign * kIoAlign) {
  void* p = nullptr;
  if (::posix_memalign(&p, kIoAlign, std::max(size, kIoAlign)) != 0) throw std::bad_alloc();
  data = static_cast<char*>(p);
  std::memset(data, 0, size);
}

AlignedBuffer::~AlignedBuffer() { std::free(data); }

uint64_t free_space(const fs::path& dir) {
  struct statvfs s {};
  ZOF_CHECK(::statvfs(dir.c_str(), &s) == 0,
            "cannot read the free space of " + dir.string() + ": " + errno_text(errno));
  return (uint64_t)s.f_bavail * (uint64_t)s.f_frsize;
}

BlockFile::BlockFile(const fs::path& path, uint64_t bytes, bool try_direct)
    : path_(path), size_((bytes + kIoAlign - 1) / kIoAlign * kIoAlign) {
  // A store larger than the free space is refused before anything is allocated (fallocate
  // would fill the file system first, under every other process on it).
  const uint64_t room = free_space(path.parent_path().empty() ? fs::path(".") : path.parent_path());
  ZOF_CHECK(size_ <= room,
            "no space for " + path.string() + ": the blocks beyond --host-mem need " +
                std::to_string(size_) + " bytes on its file system, which has " +
                std::to_string(room) + " free; free space, choose another --offload-dir or "
                "raise --host-mem");
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ZOF_CHECK(fd_ >= 0, "cannot create " + path.string() + ": " + errno_text(errno) +
                          "; choose a writable --offload-dir");
  try {
    if (size_ > 0) {
      const int e = ::posix_fallocate(fd_, 0, (off_t)size_);
      // A file system without fallocate (EOPNOTSUPP) gets its blocks as they are written.
      if (e == ENOSPC)
        throw Error("no space for " + path.string() + ": the blocks beyond --host-mem need " +
                    std::to_string(size_) + " bytes on its file system, which has " +
                    std::to_string(free_space(path.parent_path())) +
                    " free; free space, choose another --offload-dir or raise --host-mem");
      if (e != 0 && e != EOPNOTSUPP && e != EINVAL)
        throw Error("cannot reserve " + std::to_string(size_) + " bytes for " + path.string() +
                    ": " + errno_text(e));
      if (e != 0) ZOF_CHECK(::ftruncate(fd_, (off_t)size_) == 0,
                            "cannot size " + path.string() + ": " + errno_text(errno));
    }
    if (!try_direct) {
      note_ = "O_DIRECT not asked for";
      return;
    }
    const int dfd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (dfd < 0) {
      note_ = "the file system refused O_DIRECT (" + errno_text(errno) + ")";
      return;
    }
    // Some file systems accept the flag and refuse the transfers: an aligned write tells.
    AlignedBuffer probe(kIoAlign);
    const ssize_t w = size_ >= kIoAlign ? transfer(dfd, 'w', probe.data, kIoAlign, 0) : -2;
    if (w == (ssize_t)kIoAlign) {
      ::close(fd_);
      fd_ = dfd;
      direct_ = true;
      return;
    }
    note_ = w == -2 ? std::string("the file is smaller than one aligned block")
                    : "the file system refused an O_DIRECT write (" +
                          errno_text(w < 0 ? errno : EIO) + ")";
    ::close(dfd);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    fs::remove(path_, ec);
    throw;
  }
}

BlockFile::~BlockFile() {
  if (fd_ >= 0) ::close(fd_);
}

void BlockFile::remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  std::error_code ec;
  fs::remove(path_, ec);
}

void BlockFile::read(void* buf, size_t n, uint64_t off) const {
  char* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = transfer(fd_, 'r', p + done, n - done, off + done);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    ZOF_CHECK(r >= 0, "cannot read " + std::to_string(n) + " bytes at offset " +
                          std::to_string(off) + " of " + path_.string() + ": " +
                          errno_text(errno));
    struct stat st {};
    ZOF_CHECK(r > 0 || ::fstat(fd_, &st) != 0 || (uint64_t)st.st_size > off + done,
              path_.string() + " was truncated under the run: it is " +
                  std::to_string(st.st_size) + " bytes, and a block is stored at bytes " +
                  std::to_string(off) + " to " + std::to_string(off + n) +
                  "; the disk tier's store must not be changed while the run goes");
    ZOF_CHECK(r > 0, "cannot read " + path_.string() + " at offset " +
                         std::to_string(off + done) + ": end of file");
    done += (size_t)r;
  }
}

void BlockFile::write(const void* buf, size_t n, uint64_t off) const {
  const char* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = transfer(fd_, 'w', const_cast<char*>(p) + done, n - done, off + done);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w < 0 && errno == ENOSPC)
      throw Error("no space left writing " + path_.string() + " (" + std::to_string(n) +
                  " bytes at offset " + std::to_string(off) +
                  "): free space on its file system, choose another --offload-dir or raise "
                  "--host-mem");
    ZOF_CHECK(w > 0, "cannot write " + std::to_string(n) + " bytes at offset " +
                         std::to_string(off) + " of " + path_.string() + ": " +
                         errno_text(w < 0 ? errno : EIO));
    done += (size_t)w;
  }
}

// ---- completion and the pool ----------------------------------------------------------------

bool IoTicket::done() const {
  std::lock_guard<std::mutex> l(mu_);
  return remaining_ == 0;
}

void IoTicket::wait() const {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return remaining_ == 0; });
  if (!error_.empty()) throw Error(error_);
}

std::string IoTicket::error() const {
  std::lock_guard<std::mutex> l(mu_);
  return error_;
}

IoPool::IoPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) workers_.emplace_back([this] { work(); });
}

IoPool::~IoPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

std::shared_ptr<IoTicket> IoPool::submit(std::vector<std::function<void()>> jobs) {
  auto t = std::make_shared<IoTicket>();
  t->remaining_ = (int)jobs.size();
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& j : jobs) queue_.emplace_back(std::move(j), t);
  }
  cv_.notify_all();
  return t;
}

void IoPool::work() {
  for (;;) {
    std::pair<std::function<void()>, std::shared_ptr<IoTicket>> job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string err;
    try {
      job.first();
    } catch (const std::exception& e) {
      err = e.what();
    }
    IoTicket& t = *job.second;
    {
      std::lock_guard<std::mutex> l(t.mu_);
      if (!err.empty() && t.error_.empty()) t.error_ = err;
      --t.remaining_;
    }
    t.cv_.notify_all();
  }
}

}  // namespace zof
