// Aligned file I/O for the disk tier (block_io.h): O_DIRECT with a buffered fallback, transfers
// retried until whole, and the two engines that run them (io_uring, and the pread/pwrite pool).
#include "util/block_io.h"

#ifndef ZOF_HAVE_URING
#define ZOF_HAVE_URING 0  // CMake defines it 1 where pkg-config found liburing
#endif
#if ZOF_HAVE_URING
#include <liburing.h>
#endif
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "util/files.h"
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
    : BlockFile(path, bytes, {{0, (bytes + kIoAlign - 1) / kIoAlign * kIoAlign}}, try_direct,
                false) {}

BlockFile::BlockFile(const fs::path& path, uint64_t bytes,
                     const std::vector<std::pair<uint64_t, uint64_t>>& reserve, bool try_direct,
                     bool existing)
    : path_(path), size_((bytes + kIoAlign - 1) / kIoAlign * kIoAlign) {
  const fs::path parent = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  auto no_space = [&](uint64_t need, uint64_t room) {
    return Error("no space for " + path.string() + ": the blocks beyond --host-mem need " +
                 std::to_string(need) + " bytes on its file system, which has " +
                 std::to_string(room) + " free; free space, choose another --offload-dir or "
                 "raise --host-mem");
  };
  uint64_t need = 0;
  for (const auto& r : reserve) need += r.second;
  if (existing) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    ZOF_CHECK(fd_ >= 0, "cannot open the disk tier's store " + path.string() + ": " +
                            errno_text(errno) + "; the checkpoint's blocks are in it: restore "
                            "it, or start a new run");
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || (uint64_t)st.st_size != size_) {
      ::close(fd_);
      fd_ = -1;
      throw Error("the disk tier's store " + path.string() + " is " +
                  std::to_string((uint64_t)st.st_size) + " bytes, not the " +
                  std::to_string(size_) + " the checkpoint's layout makes: it was changed or "
                  "is another run's; restore it, or start a new run");
    }
    // One process at a time: a run resumed twice at once, or a copy of its run directory
    // resumed beside it, would write the same slots (the lock goes with the descriptor).
    // (A file system without flock, ENOLCK or EOPNOTSUPP, goes without the lock.)
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      const int e = errno;
      ::close(fd_);
      fd_ = -1;
      throw Error("the disk tier's store " + path.string() + " is in use by another process (" +
                  errno_text(e) + "): the same run, or a copy of its run directory, resumed "
                  "twice at once; stop the other one, or start a new run");
    }
  } else {
    // A store larger than the free space is refused before anything is allocated (fallocate
    // would fill the file system first, under every other process on it).
    const uint64_t room = free_space(parent);
    if (need > room) throw no_space(need, room);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ZOF_CHECK(fd_ >= 0, "cannot create " + path.string() + ": " + errno_text(errno) +
                            "; choose a writable --offload-dir");
    (void)::flock(fd_, LOCK_EX | LOCK_NB);  // a new file: nobody else has it open
  }
  try {
    if (!existing && size_ > 0)
      ZOF_CHECK(::ftruncate(fd_, (off_t)size_) == 0,
                "cannot size " + path.string() + ": " + errno_text(errno));
    // The new file's name durable too: a checkpoint that names the store must find it after
    // a power loss.
    if (!existing) fsync_path(parent);
    for (const auto& [off, n] : reserve) {
      if (n == 0) continue;
      const int e = ::posix_fallocate(fd_, (off_t)off, (off_t)n);
      // A file system without fallocate (EOPNOTSUPP) gets its blocks as they are written.
      if (e == ENOSPC) throw no_space(need, free_space(parent));
      if (e != 0 && e != EOPNOTSUPP && e != EINVAL)
        throw Error("cannot reserve " + std::to_string(n) + " bytes for " + path.string() +
                    ": " + errno_text(e));
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
    // Some file systems accept the flag and refuse the transfers: an aligned transfer tells (a
    // read of a store that holds blocks, which must not change; a write of a new one).
    AlignedBuffer probe(kIoAlign);
    const char op = existing ? 'r' : 'w';
    const ssize_t w = size_ >= kIoAlign ? transfer(dfd, op, probe.data, kIoAlign, 0) : -2;
    if (w == (ssize_t)kIoAlign) {
      lock_fd_ = fd_;  // kept open: it holds the lock
      fd_ = dfd;
      direct_ = true;
      return;
    }
    note_ = w == -2 ? std::string("the file is smaller than one aligned block")
                    : std::string("the file system refused an O_DIRECT ") +
                          (existing ? "read (" : "write (") + errno_text(w < 0 ? errno : EIO) +
                          ")";
    ::close(dfd);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    if (!existing) fs::remove(path_, ec);
    throw;
  }
}

uint64_t hash_bytes(const void* p, size_t n, uint64_t seed) {
  constexpr uint64_t k1 = 0x9E3779B185EBCA87ull, k2 = 0xC2B2AE3D27D4EB4Full;
  auto round = [](uint64_t acc, uint64_t v) {
    acc += v * k2;
    return ((acc << 31) | (acc >> 33)) * k1;
  };
  const char* c = static_cast<const char*>(p);
  uint64_t a[4] = {seed + k1 + k2, seed + k2, seed, seed - k1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t v[4];
    std::memcpy(v, c + i, 32);
    for (int l = 0; l < 4; ++l) a[l] = round(a[l], v[l]);
  }
  uint64_t h = (uint64_t)n;
  for (uint64_t x : a) h = round(h, x);
  for (; i < n; ++i) h = round(h, (unsigned char)c[i]);
  h ^= h >> 33;
  h *= k2;
  h ^= h >> 29;
  return h;
}

void BlockFile::sync() const {
  ZOF_CHECK(::fdatasync(fd_) == 0,
            "cannot sync " + path_.string() + ": " + errno_text(errno) +
                "; free space or choose another --offload-dir");
}

void BlockFile::punch(uint64_t off, uint64_t n) const {
  if (n > 0) (void)::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)n);
}

BlockFile::~BlockFile() {
  if (fd_ >= 0) ::close(fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void BlockFile::remove() {
  std::error_code ec;
  fs::remove(path_, ec);  // gone before the lock is
  if (fd_ >= 0) ::close(fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
  fd_ = lock_fd_ = -1;
}

size_t BlockFile::settle(char op, size_t n, uint64_t off, size_t done, long r) const {
  if (r == -EINTR || r == -EAGAIN) return 0;
  if (op == 'r') {
    ZOF_CHECK(r >= 0, "cannot read " + std::to_string(n) + " bytes at offset " +
                          std::to_string(off) + " of " + path_.string() + ": " +
                          errno_text((int)-r));
    struct stat st {};
    ZOF_CHECK(r > 0 || ::fstat(fd_, &st) != 0 || (uint64_t)st.st_size > off + done,
              path_.string() + " was truncated under the run: it is " +
                  std::to_string(st.st_size) + " bytes, and a block is stored at bytes " +
                  std::to_string(off) + " to " + std::to_string(off + n) +
                  "; the disk tier's store must not be changed while the run goes");
    ZOF_CHECK(r > 0, "cannot read " + path_.string() + " at offset " +
                         std::to_string(off + done) + ": end of file");
    return (size_t)r;
  }
  if (r == -ENOSPC)
    throw Error("no space left writing " + path_.string() + " (" + std::to_string(n) +
                " bytes at offset " + std::to_string(off) +
                "): free space on its file system, choose another --offload-dir or raise "
                "--host-mem");
  ZOF_CHECK(r > 0, "cannot write " + std::to_string(n) + " bytes at offset " +
                       std::to_string(off) + " of " + path_.string() + ": " +
                       errno_text(r < 0 ? (int)-r : EIO));
  return (size_t)r;
}

void BlockFile::read(void* buf, size_t n, uint64_t off) const {
  char* p = static_cast<char*>(buf);
  for (size_t done = 0; done < n;) {
    const ssize_t r = transfer(fd_, 'r', p + done, n - done, off + done);
    done += settle('r', n, off, done, r < 0 ? -(long)errno : (long)r);
  }
}

void BlockFile::write(const void* buf, size_t n, uint64_t off) const {
  char* p = const_cast<char*>(static_cast<const char*>(buf));
  for (size_t done = 0; done < n;) {
    const ssize_t w = transfer(fd_, 'w', p + done, n - done, off + done);
    done += settle('w', n, off, done, w < 0 ? -(long)errno : (long)w);
  }
}

// ---- completion, the pool and the engines -------------------------------------------------------

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

std::shared_ptr<IoTicket> IoEngine::new_ticket(int transfers) {
  auto t = std::make_shared<IoTicket>();
  t->remaining_ = transfers;
  return t;
}

void IoEngine::finish(IoTicket& t, const std::string& error) {
  {
    std::lock_guard<std::mutex> l(t.mu_);
    if (!error.empty() && t.error_.empty()) t.error_ = error;
    --t.remaining_;
  }
  t.cv_.notify_all();
}

namespace {

// The fallback: each transfer a closure on the pool, looping over pread/pwrite until whole.
class PoolEngine final : public IoEngine {
 public:
  explicit PoolEngine(int threads) : pool_(threads) {}
  const char* name() const override { return "pread/pwrite"; }
  int threads() const { return pool_.threads(); }
  std::shared_ptr<IoTicket> submit(std::vector<IoTransfer> transfers) override {
    std::vector<std::function<void()>> jobs;
    jobs.reserve(transfers.size());
    for (IoTransfer& t : transfers)
      jobs.push_back([t = std::move(t)] {
        if (t.op == 'r')
          t.file->read(t.buf, t.bytes, t.off);
        else
          t.file->write(t.buf, t.bytes, t.off);
        if (t.then) t.then();
      });
    return pool_.submit(std::move(jobs));
  }

 private:
  IoPool pool_;
};

#if ZOF_HAVE_URING
// One ring, owned by one thread: it moves queued transfers into submission entries (at most
// kUringDepth in flight), submits, waits for completions and settles each through
// BlockFile::settle, resubmitting the rest of a short transfer and an EINTR/EAGAIN. New work that
// arrives while requests are in flight is taken at the next completion; an idle thread sleeps on
// the queue's condition variable, not in the kernel.
class UringEngine final : public IoEngine {
 public:
  // 0, or -errno from io_uring_queue_init (then the engine must not be used).
  int init() {
    const int e = io_uring_queue_init(kUringDepth, &ring_, 0);
    if (e < 0) return e;
    ready_ = true;
    thread_ = std::thread([this] { run(); });
    return 0;
  }
  ~UringEngine() override {
    if (!ready_) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    io_uring_queue_exit(&ring_);
  }
  const char* name() const override { return "io_uring"; }
  std::shared_ptr<IoTicket> submit(std::vector<IoTransfer> transfers) override {
    auto t = new_ticket((int)transfers.size());
    {
      std::lock_guard<std::mutex> l(mu_);
      for (IoTransfer& x : transfers) queue_.push_back(new Op{std::move(x), 0, t});
    }
    cv_.notify_all();
    return t;
  }

 private:
  struct Op {
    IoTransfer t;
    size_t done;  // bytes moved so far
    std::shared_ptr<IoTicket> ticket;
  };

  // The rest of o as one request, as the fault hook has it (a failure the hook makes is settled
  // here, as its completion would be).
  void issue(Op* o) {
    const size_t rest = o->t.bytes - o->done;
    const uint64_t off = o->t.off + o->done;
    const long h = hooked(o->t.op, rest, off);
    if (h < -1) {
      complete(o, h);
      return;
    }
    // A request moves at most 1 GiB (the kernel's limit is just under 2 GiB); the rest follows.
    const unsigned n = (unsigned)std::min<size_t>(h >= 0 ? std::min(rest, (size_t)h) : rest,
                                                  size_t(1) << 30);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    ZOF_ASSERT(sqe != nullptr);  // at most kUringDepth prepared between submits
    if (o->t.op == 'r')
      io_uring_prep_read(sqe, fd(*o->t.file), o->t.buf + o->done, n, off);
    else
      io_uring_prep_write(sqe, fd(*o->t.file), o->t.buf + o->done, n, off);
    io_uring_sqe_set_data(sqe, o);
    ++inflight_;
    ++unsubmitted_;
  }

  // o's request returned res (bytes or -errno): the rest again, or its ticket told.
  void complete(Op* o, long res) {
    try {
      const size_t got = settle(*o->t.file, o->t.op, o->t.bytes, o->t.off, o->done, res);
      o->done += got;
      if (o->done < o->t.bytes) {  // short, EINTR or EAGAIN: the rest at the next round
        again_.push_back(o);
        return;
      }
      if (o->t.then) o->t.then();
      finish(*o->ticket, "");
    } catch (const std::exception& e) {
      finish(*o->ticket, e.what());
    }
    delete o;
  }

  void submit_prepared() {
    int idle = 0;  // rounds in a row that the kernel took nothing with nothing to wait for
    while (unsubmitted_ > 0) {
      const int r = io_uring_submit(&ring_);
      if (r > 0) {
        unsubmitted_ -= std::min(unsubmitted_, r);
        continue;
      }
      // The kernel took none, or is short of memory for requests (EAGAIN, EBUSY): let some
      // complete first.
      if ((r == 0 || r == -EAGAIN || r == -EBUSY) && inflight_ > unsubmitted_) {
        reap(true);
        continue;
      }
      // Short of memory with nothing of ours in flight: the kernel's other users must finish
      // first; wait for them a while (10 s) rather than spin.
      if (r == -EINTR) continue;
      if ((r == -EAGAIN || r == -EBUSY) && ++idle < 10000) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      ZOF_ABORT(("io_uring_submit failed: " +
                 (r == 0 ? std::string("no request taken") : errno_text(-r))).c_str());
    }
  }

  // Settles every completion there is; wait: at least one.
  void reap(bool wait) {
    io_uring_cqe* cqe = nullptr;
    if (wait) {
      int e;
      while ((e = io_uring_wait_cqe(&ring_, &cqe)) == -EINTR) {
      }
      if (e != 0) ZOF_ABORT(("io_uring_wait_cqe failed: " + errno_text(-e)).c_str());
    }
    while (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe) {
      Op* o = static_cast<Op*>(io_uring_cqe_get_data(cqe));
      const long res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --inflight_;
      complete(o, res);
    }
  }

  void run() {
    for (;;) {
      std::vector<Op*> take;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty() || inflight_ > 0 || !again_.empty(); });
        if (stop_ && queue_.empty() && inflight_ == 0 && again_.empty()) return;
        // What was cut short goes first: its ticket has waited longest.
        size_t room = kUringDepth - (size_t)inflight_;
        room = room > again_.size() ? room - again_.size() : 0;
        while (room-- > 0 && !queue_.empty()) {
          take.push_back(queue_.front());
          queue_.pop_front();
        }
      }
      std::deque<Op*> again;
      again.swap(again_);
      while (!again.empty() && inflight_ < (int)kUringDepth) {
        issue(again.front());
        again.pop_front();
      }
      for (Op* o : take) issue(o);
      for (Op* o : again) again_.push_back(o);  // no room this round
      submit_prepared();
      // Blocks for a completion unless a retry waits with room to issue it.
      if (inflight_ > 0) reap(again_.empty() || inflight_ >= (int)kUringDepth);
    }
  }

  io_uring ring_{};
  bool ready_ = false;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op*> queue_;  // submitted, not yet issued (under mu_)
  bool stop_ = false;      // under mu_
  // The ring's thread's own:
  std::deque<Op*> again_;  // cut short or interrupted: the rest to issue
  int inflight_ = 0;       // prepared or submitted, completion not yet seen
  int unsubmitted_ = 0;    // prepared, not yet submitted
};
#endif

}  // namespace

IoEngineKind io_engine_from_env() {
  const char* v = std::getenv("ZOF_IO");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return IoEngineKind::Auto;
  if (s == "pool") return IoEngineKind::Pool;
  if (s == "uring") return IoEngineKind::Uring;
  throw Error("ZOF_IO=" + s + " is not an I/O engine: use auto (io_uring where the kernel takes "
              "it, else the pread/pwrite pool), uring or pool");
}

bool io_uring_built() { return ZOF_HAVE_URING != 0; }

std::string io_uring_unavailable() {
#if ZOF_HAVE_URING
  io_uring ring{};
  const int e = io_uring_queue_init(kUringDepth, &ring, 0);
  if (e < 0) return "io_uring_queue_init: " + errno_text(-e);
  io_uring_queue_exit(&ring);
  return "";
#else
  return "built without liburing";
#endif
}

std::unique_ptr<IoEngine> make_io_engine(int threads, IoEngineKind kind) {
  std::string why_not;  // why the pool runs
  if (kind == IoEngineKind::Pool) {
    why_not = "ZOF_IO=pool";
  } else {
#if ZOF_HAVE_URING
    auto u = std::make_unique<UringEngine>();
    const int e = u->init();
    if (e == 0) {
      u->describe_ = "io_uring, queue depth " + std::to_string(kUringDepth);
      return u;
    }
    why_not = "io_uring refused: io_uring_queue_init: " + errno_text(-e);
#else
    why_not = "io_uring refused: built without liburing";
#endif
    if (kind == IoEngineKind::Uring)
      throw Error("ZOF_IO=uring, but " + why_not +
                  "; use ZOF_IO=pool (pread/pwrite threads) or leave ZOF_IO unset");
  }
  auto p = std::make_unique<PoolEngine>(threads);
  p->describe_ = "pread/pwrite on " + std::to_string(p->threads()) + " threads (" + why_not + ")";
  return p;
}

}  // namespace zof
