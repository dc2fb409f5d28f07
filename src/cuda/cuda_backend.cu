// make_cuda_backend: the Backend on one GPU. Memory comes from the device's stream-ordered pool
// (freed blocks stay cached), pinned host memory from cudaHostAlloc; streams are non-blocking
// and each owns its cuBLASLt workspace. Each op entry checks shapes, then calls its launcher
// (src/cuda/<op>.cu) on the stream.
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda/attention.cuh"
#include "cuda/cross_entropy.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/jvp.cuh"
#include "cuda/matmul.cuh"
#include "cuda/norms.cuh"
#include "cuda/pointwise.cuh"
#include "cuda/rope.cuh"
#include "cuda/zo.cuh"
#include "zof/cuda.h"

namespace zof::cuda {

void cuda_fail(cudaError_t e, const char* expr, const char* file, int line) {
  const std::string what = std::string(expr) + " failed: " + cudaGetErrorName(e) + ": " +
                           cudaGetErrorString(e);
  ::zof::abort_at(file, line, what.c_str());
}

void cublas_fail(cublasStatus_t s, const char* expr, const char* file, int line) {
  const std::string what = std::string(expr) + " failed: cuBLAS status " + std::to_string(int(s));
  ::zof::abort_at(file, line, what.c_str());
}

namespace {

// The backend's handles behind the opaque zof::Stream / zof::Event.
struct CudaStream {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;        // Matmul::kWorkspaceBytes for cuBLASLt on this stream
  cudaEvent_t drained = nullptr;    // recorded before a free, so the free waits for this stream
};
struct CudaEvent {
  cudaEvent_t event = nullptr;
};

const bf16* as_bf16(const uint16_t* p) { return reinterpret_cast<const bf16*>(p); }
bf16* as_bf16(uint16_t* p) { return reinterpret_cast<bf16*>(p); }

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

class CudaBackendImpl final : public CudaBackend {
 public:
  explicit CudaBackendImpl(int device) : device_(device) {
    const int n = cuda_device_count();
    ZOF_CHECK(device >= 0 && device < n,
              "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                  " visible); pick one below the count or check CUDA_VISIBLE_DEVICES and the driver");
    use();
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device_));
    uint64_t keep = UINT64_MAX;  // keep freed blocks cached in the pool: a caching allocator
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    matmul_ = std::make_unique<Matmul>();
    new_stream();
  }

  ~CudaBackendImpl() override {
    use();
    for (auto& s : streams_) cudaStreamSynchronize(s->stream);
    for (auto& s : streams_) {
      cudaFree(s->workspace);
      cudaEventDestroy(s->drained);
      cudaStreamDestroy(s->stream);
    }
    for (auto& e : events_) cudaEventDestroy(e->event);
    matmul_.reset();
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  int device() const override { return device_; }

  // ---- memory ----
  void* alloc(size_t bytes) override {
    use();
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 256, pool_, def());
    if (e == cudaErrorMemoryAllocation || e == cudaErrorInvalidValue) {  // invalid: beyond any pool
      cudaGetLastError();
      throw Error("out of GPU memory allocating " + mib(bytes) + " on " + name() + " (" +
                  mib(free_memory()) + " free); use a smaller model, batch or sequence length");
    }
    CUDA_CHECK(e);
    // Blocks freed earlier may still be read by work queued before their free (see free());
    // once the default stream has drained, the block is safe on every stream.
    CUDA_CHECK(cudaStreamSynchronize(def()));
    return p;
  }
  void free(void* ptr) override {
    if (!ptr) return;
    use();
    // The free is ordered after all work queued so far on every stream of this backend.
    for (size_t i = 1; i < streams_.size(); ++i) {
      CUDA_CHECK(cudaEventRecord(streams_[i]->drained, streams_[i]->stream));
      CUDA_CHECK(cudaStreamWaitEvent(def(), streams_[i]->drained, 0));
    }
    CUDA_CHECK(cudaFreeAsync(ptr, def()));
  }
  void* alloc_host_pinned(size_t bytes) override {
    use();
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 64, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error("out of pinned host memory allocating " + mib(bytes) +
                  "; use a smaller model or batch, or raise the locked-memory limit (ulimit -l)");
    }
    CUDA_CHECK(e);
    return p;
  }
  bool register_host(void* ptr, size_t bytes) override {
    if (!ptr || !bytes) return false;
    use();
    const cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();  // not fatal: the copies run synchronously instead
    return false;
  }
  void unregister_host(void* ptr) override {
    use();
    CUDA_CHECK(cudaHostUnregister(ptr));
  }
  void free_host_pinned(void* ptr) override {
    if (ptr) CUDA_CHECK(cudaFreeHost(ptr));
  }
  size_t free_memory() const override {
    cudaSetDevice(device_);
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    uint64_t reserved = 0, used = 0;  // cached in the pool, free for our allocations
    CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
    CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used));
    return free + size_t(reserved - used);
  }

  // ---- streams and events ----
  Stream* default_stream() override { return reinterpret_cast<Stream*>(streams_[0].get()); }
  Stream* create_stream() override {
    use();
    return reinterpret_cast<Stream*>(new_stream());
  }
  void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st(s)));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes, Stream* s) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st(s)));
  }
  void copy_device(void* dst, const void* src, size_t bytes, Stream* s) override {
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st(s)));
  }
  void copy_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                      size_t rows, Stream* s) override {
    if (width && rows)
      CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                   cudaMemcpyDeviceToDevice, st(s)));
  }
  Event* create_event() override {
    use();
    auto e = std::make_unique<CudaEvent>();
    CUDA_CHECK(cudaEventCreateWithFlags(&e->event, cudaEventDisableTiming));
    events_.push_back(std::move(e));
    return reinterpret_cast<Event*>(events_.back().get());
  }
  void record(Event* e, Stream* s) override {
    CUDA_CHECK(cudaEventRecord(reinterpret_cast<CudaEvent*>(e)->event, st(s)));
  }
  void wait(Stream* s, Event* e) override {
    CUDA_CHECK(cudaStreamWaitEvent(st(s), reinterpret_cast<CudaEvent*>(e)->event, 0));
  }
  void synchronize(Stream* s) override { CUDA_CHECK(cudaStreamSynchronize(st(s))); }
  void* native_stream(Stream* s) override { return st(s); }

  // ---- fp32 ops ----
  void matmul(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t N,
              int64_t K, Stream* s) override {
    ZOF_ASSERT(M >= 0 && N >= 0 && K >= 0);
    use();
    matmul_->run(GemmType::F32, x, w, bias, y, M, N, K, handle(s)->workspace, st(s));
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                Stream* s) override {
    ZOF_ASSERT(rows >= 0 && dim >= 0);
    use();
    cuda::rms_norm(x, w, y, rows, dim, eps, st(s));
  }
  void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                  int64_t dim, float eps, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && dim >= 0 && w && b);
    use();
    cuda::layer_norm(x, w, b, y, rows, dim, eps, st(s));
  }
  void rope(float* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
            int64_t rotary_dim, const float* inv_freq, Stream* s) override {
    ZOF_ASSERT(rotary_dim % 2 == 0 && rotary_dim <= head_dim && rows >= 0 && n_heads >= 0);
    use();
    cuda::rope(x, pos, rows, n_heads, head_dim, rotary_dim, inv_freq, st(s));
  }
  void attention(const float* q, const float* k, const float* v, float* out,
                 const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                 int64_t Hkv, int64_t D, int64_t q_offset, float scale, Stream* s) override {
    check_attention(B, Tq, Tk, H, Hkv, D, q_offset);
    use();
    cuda::attention(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, st(s));
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n, Stream* s) override {
    use();
    cuda::silu_mul(gate, up, out, n, st(s));
  }
  void gelu_tanh(float* x, int64_t n, Stream* s) override {
    use();
    cuda::gelu_tanh(x, n, st(s));
  }
  void gelu_erf(float* x, int64_t n, Stream* s) override {
    use();
    cuda::gelu_erf(x, n, st(s));
  }
  void relu(float* x, int64_t n, Stream* s) override {
    use();
    cuda::relu(x, n, st(s));
  }
  void add(float* y, const float* x, int64_t n, Stream* s) override {
    use();
    cuda::add(y, x, n, st(s));
  }
  void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
                 bool accumulate, Stream* s) override {
    ZOF_ASSERT(n >= 0 && dim >= 0);
    use();
    cuda::embedding(ids, table, out, n, dim, accumulate, st(s));
  }
  void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                     int64_t vocab, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && vocab > 0);
    use();
    cuda::cross_entropy(logits, targets, nll, rows, vocab, st(s));
  }
  void zo_pass(float* theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
               int n_update, float lr_wd, const ZKey* cur, float eps, float* plus, float* minus,
               Stream* s) override {
    ZOF_ASSERT(n >= 0 && first >= 0 && n_update >= 0 && (n_update == 0 || upd));
    // the Philox counter holds the group index in 32 bits
    ZOF_ASSERT(first + n <= (int64_t(1) << 34));
    use();
    cuda::zo_pass(theta, n, tensor, first, upd, n_update, lr_wd, cur, eps, plus, minus, st(s));
  }
  void zo_rows(const float* theta, int64_t width, const int32_t* rows, int64_t n_rows,
               uint32_t tensor, const ZKey& cur, float eps, float* plus, float* minus,
               Stream* s) override {
    ZOF_ASSERT(width >= 0 && n_rows >= 0);
    use();
    cuda::zo_rows(theta, width, rows, n_rows, tensor, cur, eps, plus, minus, st(s));
  }
  void zo_update_state(float* theta, float* m, float* v, int64_t n, uint32_t tensor,
                       int64_t first, const ZOUpdateTerm* upd, int n_update,
                       const ZOOptimizer& o, Stream* s) override {
    ZOF_ASSERT(n >= 0 && first >= 0 && n_update >= 0 && (n_update == 0 || upd));
    ZOF_ASSERT(first + n <= (int64_t(1) << 34));
    use();
    cuda::zo_update_state(theta, m, v, n, tensor, first, upd, n_update, o, st(s));
  }
  void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows, int64_t n,
                           int64_t v0, float* max, float* sum, float* target, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && n >= 0);
    use();
    cuda::cross_entropy_chunk(logits, targets, rows, n, v0, max, sum, target, st(s));
  }

  // ---- fp32 tangents ----
  void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                    int64_t rows, int64_t dim, float eps, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && dim >= 0);
    use();
    cuda::rms_norm_jvp(x, dx, w, dw, dy, rows, dim, eps, st(s));
  }
  void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                      const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                      Stream* s) override {
    ZOF_ASSERT(rows >= 0 && dim >= 0);
    use();
    cuda::layer_norm_jvp(x, dx, w, dw, db, dy, rows, dim, eps, st(s));
  }
  void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                     const float* v, const float* dv, float* dout, const uint8_t* key_mask,
                     int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                     Stream* s) override {
    check_attention(B, S, S, H, Hkv, D, 0);
    ZOF_CHECK(D <= cuda::kMaxJvpHeadDim,
              "the CUDA attention tangent takes head_dim <= " +
                  std::to_string(cuda::kMaxJvpHeadDim) + ", not " + std::to_string(D) +
                  ": use the SPSA estimator (--estimator spsa) for this model");
    use();
    cuda::attention_jvp(q, dq, k, dk, v, dv, dout, key_mask, B, S, H, Hkv, D, scale, st(s));
  }
  void silu_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                    float* dout, int64_t n, Stream* s) override {
    use();
    cuda::silu_mul_jvp(gate, dgate, up, dup, dout, n, st(s));
  }
  void gelu_tanh_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override {
    use();
    cuda::activation_jvp(cuda::JvpAct::GeluTanh, x, dx, dy, n, st(s));
  }
  void gelu_erf_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override {
    use();
    cuda::activation_jvp(cuda::JvpAct::GeluErf, x, dx, dy, n, st(s));
  }
  void relu_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override {
    use();
    cuda::activation_jvp(cuda::JvpAct::ReLU, x, dx, dy, n, st(s));
  }
  void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* targets,
                         float* dnll, int64_t rows, int64_t vocab, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && vocab > 0);
    use();
    cuda::cross_entropy_jvp(logits, dlogits, targets, dnll, rows, vocab, st(s));
  }

  // ---- bf16 ops ----
  void matmul_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* y,
                   int64_t M, int64_t N, int64_t K, Stream* s) override {
    ZOF_ASSERT(M >= 0 && N >= 0 && K >= 0);
    use();
    matmul_->run(GemmType::BF16, x, w, bias, y, M, N, K, handle(s)->workspace, st(s));
  }
  void attention_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, uint16_t* out,
                      const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                      int64_t Hkv, int64_t D, int64_t q_offset, float scale, Stream* s) override {
    check_attention(B, Tq, Tk, H, Hkv, D, q_offset);
    use();
    cuda::attention(as_bf16(q), as_bf16(k), as_bf16(v), as_bf16(out), key_mask, B, Tq, Tk, H, Hkv,
                    D, q_offset, scale, st(s));
  }
  void rms_norm_bf16(const uint16_t* x, const float* w, uint16_t* y, int64_t rows, int64_t dim,
                     float eps, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && dim >= 0);
    use();
    cuda::rms_norm(as_bf16(x), w, as_bf16(y), rows, dim, eps, st(s));
  }
  void layer_norm_bf16(const uint16_t* x, const float* w, const float* b, uint16_t* y,
                       int64_t rows, int64_t dim, float eps, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && dim >= 0 && w && b);
    use();
    cuda::layer_norm(as_bf16(x), w, b, as_bf16(y), rows, dim, eps, st(s));
  }
  void rope_bf16(uint16_t* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
                 int64_t rotary_dim, const float* inv_freq, Stream* s) override {
    ZOF_ASSERT(rotary_dim % 2 == 0 && rotary_dim <= head_dim && rows >= 0 && n_heads >= 0);
    use();
    cuda::rope(as_bf16(x), pos, rows, n_heads, head_dim, rotary_dim, inv_freq, st(s));
  }
  void silu_mul_bf16(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n,
                     Stream* s) override {
    use();
    cuda::silu_mul(as_bf16(gate), as_bf16(up), as_bf16(out), n, st(s));
  }
  void relu_bf16(uint16_t* x, int64_t n, Stream* s) override {
    use();
    cuda::relu(as_bf16(x), n, st(s));
  }
  void add_bf16(uint16_t* y, const uint16_t* x, int64_t n, Stream* s) override {
    use();
    cuda::add(as_bf16(y), as_bf16(x), n, st(s));
  }
  void to_bf16(const float* x, uint16_t* y, int64_t n, Stream* s) override {
    use();
    cuda::to_bf16(x, as_bf16(y), n, st(s));
  }
  void to_f32(const uint16_t* x, float* y, int64_t n, Stream* s) override {
    use();
    cuda::to_f32(as_bf16(x), y, n, st(s));
  }

 private:
  void use() const { CUDA_CHECK(cudaSetDevice(device_)); }
  CudaStream* handle(Stream* s) {
    return s ? reinterpret_cast<CudaStream*>(s) : streams_[0].get();
  }
  cudaStream_t st(Stream* s) { return handle(s)->stream; }
  cudaStream_t def() { return streams_[0]->stream; }

  CudaStream* new_stream() {
    auto s = std::make_unique<CudaStream>();
    CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&s->drained, cudaEventDisableTiming));
    const cudaError_t e = cudaMalloc(&s->workspace, Matmul::kWorkspaceBytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error("out of GPU memory for a stream's " + mib(Matmul::kWorkspaceBytes) +
                  " matmul workspace on " + name());
    }
    CUDA_CHECK(e);
    streams_.push_back(std::move(s));
    return streams_.back().get();
  }

  static void check_attention(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv,
                              int64_t D, int64_t q_offset) {
    ZOF_ASSERT(B >= 0 && Tq >= 0 && Tk >= 0 && q_offset >= 0);
    ZOF_ASSERT(Hkv > 0 && H % Hkv == 0);
    ZOF_CHECK(D > 0 && D <= kMaxHeadDim, "head_dim " + std::to_string(D) +
                                             " is not supported by the CUDA attention kernel "
                                             "(1.." + std::to_string(kMaxHeadDim) + ")");
  }

  int device_;
  cudaMemPool_t pool_ = nullptr;
  std::unique_ptr<Matmul> matmul_;
  std::vector<std::unique_ptr<CudaStream>> streams_;  // [0] is the default stream
  std::vector<std::unique_ptr<CudaEvent>> events_;
};

// Datasheet dense bf16 peaks, where the name tells the part; otherwise SMs x clock x the
// per-SM rate of the architecture (4096 flop/clk on sm_90, 2048 on sm_80, 1024 elsewhere).
double bf16_peak_tflops(const cudaDeviceProp& p, int clock_khz) {
  const std::string n = p.name;
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("H100") && (has("PCIe") || has("PCIE"))) return 756.0;
  if (has("H100") || has("H200") || has("GH200")) return 989.4;  // SXM
  if (has("A100")) return 312.0;
  if (has("A800")) return 312.0;
  const double per_sm = p.major == 9 ? 4096 : (p.major == 8 && p.minor == 0) ? 2048 : 1024;
  return per_sm * p.multiProcessorCount * (clock_khz * 1e3) / 1e12;
}

}  // namespace
}  // namespace zof::cuda

namespace zof {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error for a query
    return 0;
  }
  return n;
}

CudaDeviceInfo cuda_device_info(int device) {
  const int n = cuda_device_count();
  ZOF_CHECK(device >= 0 && device < n,
            "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                " visible" +
                (n == 0 ? ": no NVIDIA GPU or driver here, or CUDA_VISIBLE_DEVICES hides them; "
                          "run on the CPU (--device cpu)"
                        : "") +
                ")");
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  int clock_khz = 0, driver = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  CudaDeviceInfo info;
  info.device = device;
  info.name = p.name;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.sm_count = p.multiProcessorCount;
  info.total_memory = p.totalGlobalMem;
  info.bf16_dense_tflops = cuda::bf16_peak_tflops(p, clock_khz);
  info.driver = std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
  return info;
}

std::unique_ptr<CudaBackend> make_cuda_backend(int device) {
  return std::make_unique<cuda::CudaBackendImpl>(device);
}

}  // namespace zof
