// The communicator between GPU ranks over NCCL (see make_nccl in zof/dist.h). The communicator is
// non-blocking (NCCL's config.blocking = 0): no NCCL call waits inside the library, so every call
// here waits by polling the communicator's state and its stream. That is what lets a call that
// waits on its peers longer than the timeout end the job, as the MPI communicator's watchdog
// does, and an error NCCL notices (a peer's connection lost) be reported with the call that met
// it. Every NCCL and CUDA status goes through ZOF_NCCL_CHECK / ZOF_NCCL_CUDA_CHECK, which end the
// whole job through the bootstrap communicator: the other ranks would otherwise wait for ever.
#ifdef ZOF_WITH_NCCL
#include "comm/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "zof/error.h"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0),
              "zof needs NCCL 2.14 or newer (non-blocking communicators)");

namespace zof::dist {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string nccl_version() {
  int v = 0;  // major * 10000 + minor * 100 + patch since 2.9
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL";
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

// cuda_common.cuh's CUDA_CHECK is for .cu files (it carries device code) and aborts this rank
// only; a failure inside a communicator call must end every rank.
#define ZOF_NCCL_CHECK(expr) settle((expr), #expr, __LINE__)
#define ZOF_NCCL_CUDA_CHECK(expr) cuda_check((expr), #expr, __LINE__)

class NcclComm final : public Communicator {
 public:
  NcclComm(Communicator* boot, std::unique_ptr<Communicator> owned, int device, double timeout_s)
      : boot_(boot),
        owned_(std::move(owned)),
        device_(device),
        timeout_s_(timeout_s),
        rank_(boot->rank()),
        size_(boot->size()) {
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    {
      Waiting w(*this, "ncclGetUniqueId");
      if (rank_ == 0) ZOF_NCCL_CHECK(ncclGetUniqueId(&id));
    }
    boot_->broadcast(&id, sizeof id, 0);  // under the bootstrap's own timeout
    use();
    ZOF_NCCL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    Waiting w(*this, "the NCCL communicator's creation (ncclCommInitRankConfig)");
    ZOF_NCCL_CHECK(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
    name_ = nccl_version() + " on cuda:" + std::to_string(device_) + ", " +
            std::to_string(size_) + (size_ == 1 ? " rank" : " ranks") + " (bootstrap: " +
            boot_->name() + ")";
  }

  ~NcclComm() override {
    if (comm_) {
      use();
      if (std::uncaught_exceptions() == 0) {
        // Finalize waits until the peers are done with this communicator too: under the timeout.
        Waiting w(*this, "the NCCL communicator's teardown (ncclCommFinalize)");
        ZOF_NCCL_CHECK(ncclCommFinalize(comm_));
        const ncclResult_t r = ncclCommDestroy(comm_);  // local, never waits after Finalize
        if (r != ncclSuccess && r != ncclInProgress) fail(r, "ncclCommDestroy(comm_)", __LINE__);
      } else {
        // This rank is leaving early (an error is on its way out): no teardown at all. The
        // peers may never reach it, and ncclCommAbort can itself wait on a lost peer; the
        // process exit releases the communicator and its buffers.
        return;
      }
    }
    if (dev_) cudaFree(dev_);
    if (host_) cudaFreeHost(host_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return boot_->local_size(); }
  int local_rank() const override { return boot_->local_rank(); }
  std::string name() const override { return name_; }
  bool buffers_on_device() const override { return true; }

  // Host v; every rank adds the gathered rows in rank order itself (NCCL's all-reduce adds in
  // its ring or tree order, which would not give one process's bits).
  void allreduce_sum_ordered(double* v, int n) override {
    ZOF_ASSERT(n >= 0);
    if (n == 0) return;
    Waiting w(*this, "the per-step reduction (ncclAllGather)");
    use();
    const size_t row = (size_t)n * sizeof(double);
    reserve(row * size_);
    auto* all = static_cast<double*>(host_);  // (size, n)
    auto* dall = static_cast<double*>(dev_);  // (size, n)
    const size_t mine = (size_t)rank_ * n;
    std::memcpy(all + mine, v, row);
    ZOF_NCCL_CUDA_CHECK(
        cudaMemcpyAsync(dall + mine, all + mine, row, cudaMemcpyHostToDevice, stream_));
    ZOF_NCCL_CHECK(ncclAllGather(dall + mine, dall, (size_t)n, ncclDouble, comm_, stream_));
    ZOF_NCCL_CUDA_CHECK(cudaMemcpyAsync(all, dall, row * size_, cudaMemcpyDeviceToHost, stream_));
    wait();
    for (int i = 0; i < n; ++i) {
      double s = all[i];
      for (int r = 1; r < size_; ++r) s += all[(size_t)r * n + i];
      v[i] = s;
    }
    bytes_sent_ += (uint64_t)n * sizeof(double) * (rank_ == 0 ? size_ - 1 : 1);
  }

  // Host data, staged through the device buffer in chunks.
  void broadcast(void* data, size_t bytes, int root) override {
    ZOF_ASSERT(root >= 0 && root < size_);
    if (bytes == 0) return;
    use();
    reserve(std::min(bytes, kChunk));
    auto* p = static_cast<char*>(data);
    for (size_t off = 0; off < bytes; off += kChunk) {
      Waiting w(*this, "ncclBroadcast");
      const size_t c = std::min(kChunk, bytes - off);
      if (rank_ == root) {
        std::memcpy(host_, p + off, c);
        ZOF_NCCL_CUDA_CHECK(cudaMemcpyAsync(dev_, host_, c, cudaMemcpyHostToDevice, stream_));
      }
      ZOF_NCCL_CHECK(ncclBroadcast(dev_, dev_, c, ncclUint8, root, comm_, stream_));
      if (rank_ != root)
        ZOF_NCCL_CUDA_CHECK(cudaMemcpyAsync(host_, dev_, c, cudaMemcpyDeviceToHost, stream_));
      wait();
      if (rank_ != root) std::memcpy(p + off, host_, c);
    }
    if (rank_ == root) bytes_sent_ += bytes * (size_ - 1);
  }

  void send(const float* buf, int64_t n, int dest, int tag) override {
    check_p2p(buf, n, dest, "send");
    if (n == 0) return;
    Waiting w(*this, "ncclSend of activations");
    use();
    ZOF_NCCL_CHECK(ncclSend(buf, (size_t)n, ncclFloat, dest, comm_, stream_));
    wait();
    bytes_sent_ += (uint64_t)n * sizeof(float);
  }

  void recv(float* buf, int64_t n, int src, int tag) override {
    check_p2p(buf, n, src, "recv");
    if (n == 0) return;
    Waiting w(*this, "ncclRecv of activations");
    use();
    ZOF_NCCL_CHECK(ncclRecv(buf, (size_t)n, ncclFloat, src, comm_, stream_));
    wait();
  }

  void barrier() override {
    Waiting w(*this, "the barrier (ncclAllReduce of one value)");
    use();
    reserve(sizeof(int32_t));
    ZOF_NCCL_CUDA_CHECK(cudaMemsetAsync(dev_, 0, sizeof(int32_t), stream_));
    ZOF_NCCL_CHECK(ncclAllReduce(dev_, dev_, 1, ncclInt32, ncclSum, comm_, stream_));
    wait();
  }

  // Rank 0's lone work is host work: its heartbeat goes through the bootstrap.
  void run_on_root(const char* what, const std::function<void()>& fn) override {
    boot_->run_on_root(what, fn);
  }

  // Through the bootstrap (MPI_Abort ends every rank). ncclCommAbort is not called first: it
  // can itself wait on a lost network peer, and the process exit releases the communicator.
  [[noreturn]] void abort(int code, const std::string& why) override {
    boot_->abort(code, why);
    std::_Exit(code);  // bootstrap's abort does not return; this is for the compiler
  }

 private:
  static constexpr size_t kChunk = size_t(16) << 20;  // bytes per staged broadcast step

  // Marks the call this rank is in, and since when, for the timeout and the messages.
  struct Waiting {
    Waiting(NcclComm& c, const char* op) : c_(c), prev_op_(c.op_), prev_since_(c.since_) {
      c_.op_ = op;
      c_.since_ = now_s();
    }
    ~Waiting() {
      c_.op_ = prev_op_;
      c_.since_ = prev_since_;
    }
    NcclComm& c_;
    const char* prev_op_;
    double prev_since_;
  };

  void use() const { cudaSetDevice(device_); }

  // A non-blocking communicator answers ncclInProgress while a call is still being set up
  // (the connections to its peers, say); its state says when that is done.
  void settle(ncclResult_t r, const char* expr, int line) {
    for (int turns = 0; r == ncclInProgress;) {
      pause(turns);
      const ncclResult_t q = ncclCommGetAsyncError(comm_, &r);
      if (q != ncclSuccess) r = q;
    }
    if (r != ncclSuccess) fail(r, expr, line);
  }

  // Until the work queued on stream_ is done, or a peer's failure shows in the communicator.
  void wait() {
    for (int turns = 0;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) cuda_check(e, "cudaStreamQuery(stream_)", __LINE__);
      ncclResult_t state = ncclSuccess;
      ZOF_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclSuccess && state != ncclInProgress)
        fail(state, "the operation in flight (ncclCommGetAsyncError)", __LINE__);
      pause(turns);
    }
  }

  // One turn of a wait: a yield at first (the per-step scalars take microseconds), 50 us sleeps
  // after; the end of the job once the call has waited longer than the timeout.
  void pause(int& turns) {
    if (++turns < 2000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (timeout_s_ <= 0) return;
    const double waited = now_s() - since_;
    if (waited < timeout_s_) return;
    char msg[512];
    std::snprintf(msg, sizeof msg,
                  "%s: no word from the other ranks for %.0f s (--dist-timeout %g): a rank "
                  "died or hung; aborting the job. Resume from the last checkpoint with "
                  "zof finetune --resume RUN_DIR",
                  op_ ? op_ : "an NCCL call", waited, timeout_s_);
    abort(3, msg);
  }

  [[noreturn]] void fail(ncclResult_t r, const char* expr, int line) {
    std::string why = std::string(expr) + " failed at " + __FILE__ + ":" + std::to_string(line) +
                      " in " + (op_ ? op_ : "an NCCL call") + ": " + ncclGetErrorString(r);
    const char* last = ncclGetLastError(comm_);
    if (last && *last) why += " (" + std::string(last) + ")";
    if (r == ncclRemoteError) why += "; a peer rank died or its connection was lost";
    abort(2, why + "; aborting the job");
  }

  void cuda_check(cudaError_t e, const char* expr, int line) {
    if (e == cudaSuccess) return;
    abort(2, std::string(expr) + " failed at " + __FILE__ + ":" + std::to_string(line) + " in " +
                 (op_ ? op_ : "the NCCL communicator") + ": " + cudaGetErrorName(e) + ": " +
                 cudaGetErrorString(e) + "; aborting the job");
  }

  // The buffer contract of send/recv: device memory on this rank's GPU, another rank.
  void check_p2p(const void* buf, int64_t n, int peer, const char* what) const {
    ZOF_ASSERT(n >= 0);
    if (n > 0 && !on_device(buf)) {
      const std::string m = std::string("NCCL ") + what + ": the buffer is not device memory on cuda:" +
                            std::to_string(device_) +
                            " (the NCCL communicator's send/recv move activations that live on "
                            "the GPU; host buffers go through the MPI communicator)";
      ::zof::abort_at(__FILE__, __LINE__, m.c_str());
    }
    if (peer == rank_) {
      const std::string m = std::string("NCCL ") + what + " with rank " + std::to_string(rank_) +
                            " itself: a blocking send to itself would wait for ever for its own "
                            "recv (one rank has no other rank to exchange with)";
      ::zof::abort_at(__FILE__, __LINE__, m.c_str());
    }
    if (peer < 0 || peer >= size_) {
      const std::string m = std::string("NCCL ") + what + " with rank " + std::to_string(peer) +
                            ", outside the job's " + std::to_string(size_) + " ranks";
      ::zof::abort_at(__FILE__, __LINE__, m.c_str());
    }
  }

  bool on_device(const void* p) const {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();  // not a pointer CUDA knows: host memory
      return false;
    }
    return (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) &&
           a.device == device_;
  }

  // The device buffer and its pinned host twin, grown on demand. The stream is idle here: every
  // call waits for its work before it returns.
  void reserve(size_t bytes) {
    if (bytes <= cap_) return;
    if (dev_) ZOF_NCCL_CUDA_CHECK(cudaFree(dev_));
    if (host_) ZOF_NCCL_CUDA_CHECK(cudaFreeHost(host_));
    dev_ = host_ = nullptr;
    cap_ = std::max(bytes, size_t(4096));
    ZOF_NCCL_CUDA_CHECK(cudaMalloc(&dev_, cap_));
    ZOF_NCCL_CUDA_CHECK(cudaMallocHost(&host_, cap_));
  }

  Communicator* boot_;
  std::unique_ptr<Communicator> owned_;  // the bootstrap, when this communicator owns it
  int device_;
  double timeout_s_;
  int rank_, size_;
  std::string name_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* dev_ = nullptr;   // cap_ bytes on device_
  void* host_ = nullptr;  // cap_ bytes, pinned
  size_t cap_ = 0;
  const char* op_ = nullptr;  // the call this rank is in (Waiting)
  double since_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_comm(Communicator* bootstrap,
                                             std::unique_ptr<Communicator> owned, int device,
                                             double timeout_s) {
  ZOF_ASSERT(bootstrap && (!owned || owned.get() == bootstrap));
  return std::make_unique<NcclComm>(bootstrap, std::move(owned), device, timeout_s);
}

}  // namespace zof::dist
#endif  // ZOF_WITH_NCCL
