// The communicator over MPI_COMM_WORLD. Every MPI call goes through ZOF_MPI_CHECK (the world's
// error handler is MPI_ERRORS_RETURN, so a failure is reported with the call and rank, then the
// job is aborted). A watchdog thread aborts the job when one call waits on its peers longer
// than the timeout: a rank that dies is normally noticed by mpirun, which ends the job, but a
// rank that hangs (or a lost peer on a fabric that does not notice) would otherwise leave every
// other rank blocked for ever.
#ifdef ZOF_WITH_MPI
#include "comm/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "zof/error.h"

namespace zof::dist {
namespace {

[[noreturn]] void mpi_fail(int rc, const char* call, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "zof: error: rank %d: %s failed at %s:%d: %s; aborting the job\n", rank,
               call, file, line, msg);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::_Exit(2);  // MPI_Abort does not return; this is for the compiler
}

#define ZOF_MPI_CHECK(call)                                                       \
  do {                                                                            \
    const int zof_mpi_rc_ = (call);                                               \
    if (zof_mpi_rc_ != MPI_SUCCESS) mpi_fail(zof_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class MpiWorld : public Communicator {
 public:
  explicit MpiWorld(double timeout_s) : timeout_s_(timeout_s) {
    int inited = 0;
    ZOF_MPI_CHECK(MPI_Initialized(&inited));
    ZOF_ASSERT(!inited);  // one MPI world per process
    ZOF_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level_));
    ZOF_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    ZOF_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    ZOF_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MPI_Comm local;
    ZOF_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
    ZOF_MPI_CHECK(MPI_Comm_size(local, &local_size_));
    ZOF_MPI_CHECK(MPI_Comm_rank(local, &local_rank_));
    ZOF_MPI_CHECK(MPI_Comm_free(&local));
    char ver[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int len = 0;
    ZOF_MPI_CHECK(MPI_Get_library_version(ver, &len));
    std::string v(ver, (size_t)len);
    v = v.substr(0, std::min(v.find(','), v.find('\n')));
    name_ = "MPI (" + v + "), " + std::to_string(size_) + " ranks";
    if (timeout_s_ > 0) watchdog_ = std::thread([this] { watch(); });
  }

  ~MpiWorld() override {
    if (watchdog_.joinable()) {
      {
        std::lock_guard<std::mutex> g(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      watchdog_.join();
    }
    // While an exception unwinds this rank is leaving early; MPI_Finalize would wait for peers
    // that may never arrive. Exiting without it makes mpirun end the job.
    if (std::uncaught_exceptions() == 0) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  int local_rank() const override { return local_rank_; }
  std::string name() const override { return name_; }

  void allreduce_sum_ordered(double* v, int n) override {
    if (size_ == 1) return;
    Waiting w(*this, "the per-step reduction (MPI_Gather + MPI_Bcast)");
    std::vector<double> all(rank_ == 0 ? (size_t)n * size_ : 0);
    ZOF_MPI_CHECK(MPI_Gather(v, n, MPI_DOUBLE, all.data(), n, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    if (rank_ == 0) {
      for (int i = 0; i < n; ++i) {
        double s = all[i];
        for (int r = 1; r < size_; ++r) s += all[(size_t)r * n + i];
        v[i] = s;
      }
    }
    ZOF_MPI_CHECK(MPI_Bcast(v, n, MPI_DOUBLE, 0, MPI_COMM_WORLD));
    bytes_sent_ += (uint64_t)n * sizeof(double) * (rank_ == 0 ? size_ - 1 : 1);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (size_ == 1) return;
    Waiting w(*this, "MPI_Bcast");
    auto* p = (char*)data;
    for (size_t off = 0; off < bytes; off += kChunk) {
      const int n = (int)std::min(kChunk, bytes - off);
      ZOF_MPI_CHECK(MPI_Bcast(p + off, n, MPI_BYTE, root, MPI_COMM_WORLD));
    }
    if (rank_ == root) bytes_sent_ += bytes * (size_ - 1);
  }

  void send(const float* buf, int64_t n, int dest, int tag) override {
    Waiting w(*this, "MPI_Send of activations");
    for (int64_t off = 0; off < n; off += (int64_t)kChunk) {
      const int c = (int)std::min<int64_t>((int64_t)kChunk, n - off);
      ZOF_MPI_CHECK(MPI_Send(buf + off, c, MPI_FLOAT, dest, tag, MPI_COMM_WORLD));
    }
    bytes_sent_ += (uint64_t)n * sizeof(float);
  }

  void recv(float* buf, int64_t n, int src, int tag) override {
    Waiting w(*this, "MPI_Recv of activations");
    for (int64_t off = 0; off < n; off += (int64_t)kChunk) {
      const int c = (int)std::min<int64_t>((int64_t)kChunk, n - off);
      MPI_Status st;
      ZOF_MPI_CHECK(MPI_Recv(buf + off, c, MPI_FLOAT, src, tag, MPI_COMM_WORLD, &st));
      int got = 0;
      ZOF_MPI_CHECK(MPI_Get_count(&st, MPI_FLOAT, &got));
      ZOF_ASSERT(got == c);  // both sides derive the size from the same batch
    }
  }

  void barrier() override {
    if (size_ == 1) return;
    Waiting w(*this, "MPI_Barrier");
    ZOF_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  }

  void run_on_root(const char* what, const std::function<void()>& fn) override {
    if (size_ == 1) {
      fn();
      return;
    }
    if (rank_ != 0) {
      wait_for_root(what);
      return;
    }
    std::exception_ptr failed;
    try {
      Heartbeat beat(*this);
      fn();
    } catch (...) {  // the others learn of it below instead of waiting for a heartbeat
      failed = std::current_exception();
    }
    // After the last heartbeat on the same tag: messages between two ranks with one tag arrive
    // in the order sent.
    const char done = failed ? kRootFailed : kRootDone;
    for (int r = 1; r < size_; ++r)
      ZOF_MPI_CHECK(MPI_Send(&done, 1, MPI_CHAR, r, kRootTag, MPI_COMM_WORLD));
    if (failed) std::rethrow_exception(failed);
  }

  [[noreturn]] void abort(int code, const std::string& why) override {
    std::fprintf(stderr, "zof: error: rank %d of %d: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  static constexpr size_t kChunk = size_t(1) << 30;  // elements per MPI call (int counts)

  // Marks this rank as waiting on its peers in `op` for the watchdog.
  struct Waiting {
    Waiting(MpiWorld& w, const char* op) : w_(w) {
      w_.since_.store(now_s());
      w_.op_.store(op, std::memory_order_release);
    }
    ~Waiting() { w_.op_.store(nullptr, std::memory_order_release); }
    MpiWorld& w_;
  };

  // run_on_root's messages from rank 0: a heartbeat, or the end of its work.
  static constexpr int kRootTag = 30001;  // beside job.cpp's 30000, below MPI's least MPI_TAG_UB
  static constexpr char kRootBeat = 0, kRootDone = 1, kRootFailed = 2;

  // Rank 0, while it works alone: a thread sends a heartbeat to every rank every quarter of the
  // timeout. Without MPI_THREAD_MULTIPLE (no second thread may call MPI), or without a timeout,
  // it sends none and the others wait unwatched (wait_for_root).
  class Heartbeat {
   public:
    explicit Heartbeat(MpiWorld& w) : w_(w) {
      if (!w_.beats()) return;
      thread_ = std::thread([this] {
        const auto period = std::chrono::duration<double>(std::max(0.01, w_.timeout_s_ / 4));
        std::unique_lock<std::mutex> lk(mu_);
        while (!cv_.wait_for(lk, period, [this] { return stop_; })) {
          for (int r = 1; r < w_.size_; ++r)
            ZOF_MPI_CHECK(MPI_Send(&kRootBeat, 1, MPI_CHAR, r, kRootTag, MPI_COMM_WORLD));
        }
      });
    }
    ~Heartbeat() {
      if (!thread_.joinable()) return;
      {
        std::lock_guard<std::mutex> g(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }

   private:
    MpiWorld& w_;
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
  };

  bool beats() const { return timeout_s_ > 0 && thread_level_ >= MPI_THREAD_MULTIPLE; }

  // A rank other than 0 until rank 0's work ends: each heartbeat restarts the watchdog's clock.
  void wait_for_root(const char* what) {
    // The watchdog may be reading an earlier wait's text: each text is made once and kept.
    std::string& text = root_waits_[what];
    if (text.empty()) text = std::string("waiting for rank 0's ") + what + " (it sends a heartbeat)";
    for (;;) {
      char m = kRootBeat;
      {
        std::optional<Waiting> w;
        if (beats()) w.emplace(*this, text.c_str());
        MPI_Status st;
        ZOF_MPI_CHECK(MPI_Recv(&m, 1, MPI_CHAR, 0, kRootTag, MPI_COMM_WORLD, &st));
      }
      if (m == kRootDone) return;
      ZOF_CHECK(m == kRootBeat, "rank 0 failed during its " + std::string(what) +
                                    " (its own message says why); this rank stops too");
    }
  }

  void watch() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(100));
      const char* op = op_.load(std::memory_order_acquire);
      if (!op || stop_) continue;
      const double waited = now_s() - since_.load();
      if (waited < timeout_s_) continue;
      char msg[512];
      std::snprintf(msg, sizeof msg,
                    "%s: no word from the other ranks for %.0f s (--dist-timeout %g): a rank "
                    "died or hung; aborting the job. Resume from the last checkpoint with "
                    "zof finetune --resume RUN_DIR",
                    op, waited, timeout_s_);
      if (thread_level_ >= MPI_THREAD_MULTIPLE) abort(3, msg);
      // Without thread support MPI may not be called from here; leaving without MPI_Finalize
      // makes mpirun end the job just the same.
      std::fprintf(stderr, "zof: error: rank %d of %d: %s\n", rank_, size_, msg);
      std::fflush(stderr);
      std::_Exit(3);
    }
  }

  double timeout_s_;
  int rank_ = 0, size_ = 1, local_size_ = 1, local_rank_ = 0, thread_level_ = 0;
  std::string name_;
  std::map<std::string, std::string> root_waits_;  // wait_for_root's texts (stable c_str)
  std::atomic<const char*> op_{nullptr};
  std::atomic<double> since_{0};
  std::thread watchdog_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world(double timeout_s) {
  return std::make_unique<MpiWorld>(timeout_s);
}

}  // namespace zof::dist
#endif  // ZOF_WITH_MPI
