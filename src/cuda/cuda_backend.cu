// make_cuda_backend: the Backend on one GPU. Memory comes from the device's stream-ordered pool
// (freed blocks stay cached), pinned host memory from cudaHostAlloc; streams are non-blocking
// and each owns its cuBLASLt workspace, the bf16 copy of a bf16 matmul's input and the staging
// slots of the ZO passes' update terms. Each op entry checks shapes, then calls its launcher
// (src/cuda/<op>.cu) on the stream.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
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
#include "cuda/cuda_backend.h"

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

// One call's update terms on their way to a ZO kernel: staged in pinned memory, copied to the
// device on the stream, read there by the kernel.
struct TermSlot {
  ZOUpdateTerm* host = nullptr;  // kMaxZOTerms terms, pinned
  ZOUpdateTerm* dev = nullptr;   // kMaxZOTerms terms, device
  cudaEvent_t done = nullptr;    // recorded after the kernel that last read the slot
};
constexpr size_t kTermSlotBytes = sizeof(ZOUpdateTerm) * kMaxZOTerms;
constexpr size_t kTermSlotsPerBlock = 16;  // slots added at a time (one allocation of each kind)
constexpr size_t kMaxTermSlots = 1024;     // then the host waits for the oldest instead

// The backend's handles behind the opaque zof::Stream / zof::Event.
struct CudaStream {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;        // Matmul::kWorkspaceBytes for cuBLASLt on this stream
  cudaEvent_t drained = nullptr;    // recorded before a free, so the free waits for this stream
  // The bf16 copy of the input of a matmul with bf16 weights (only this stream uses it, so a
  // product may reuse it as soon as the previous one is queued); grown, never shrunk.
  void* x16 = nullptr;
  size_t x16_bytes = 0;
  // The ZO passes' update terms: a ring of slots used in turn (so in the order their kernels
  // run), a slot reused once its event says its kernel is done, slots added before the oldest
  // while every one is still in flight. The host does not wait for the device here (until
  // kMaxTermSlots calls are in flight on this stream).
  std::vector<TermSlot> slots;
  size_t next_slot = 0;                 // the oldest slot: the next to reuse
  std::vector<void*> slot_host_blocks;  // the pinned and device allocations behind the slots
  std::vector<void*> slot_dev_blocks;
};
struct CudaEvent {
  cudaEvent_t event = nullptr;
};

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The frees of one backend that may still be ahead of its default stream (see alloc()).
struct PendingFree {
  cudaEvent_t freed = nullptr;  // recorded on the backend's default stream after its latest free
  bool pending = false;         // that free may not have been reached yet
};
// Every backend on one device allocates from the device's default pool, which may hand one
// backend a block that another has just freed: alloc() and free() of all of them go through one
// lock, and alloc() looks at the pending frees of each.
struct DeviceFrees {
  std::mutex mu;
  std::vector<PendingFree*> backends;
};
DeviceFrees& device_frees(int device) {
  static std::mutex mu;
  static std::map<int, DeviceFrees> all;  // never shrinks: one entry per device used
  std::lock_guard<std::mutex> lock(mu);
  return all[device];
}

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(int device, bool tf32) : device_(device), tf32_(tf32) {
    const int n = cuda_device_count();
    ZOF_CHECK(device >= 0 && device < n,
              "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                  " visible); pick one below the count or check CUDA_VISIBLE_DEVICES and the driver");
    use();
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, device_));
    device_name_ = p.name;
    cc_major_ = p.major;
    cc_minor_ = p.minor;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device_));
    uint64_t keep = UINT64_MAX;  // keep freed blocks cached in the pool: a caching allocator
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    CUDA_CHECK(cudaEventCreateWithFlags(&frees_.freed, cudaEventDisableTiming));
    matmul_ = std::make_unique<Matmul>();
    new_stream();
    DeviceFrees& d = device_frees(device_);
    std::lock_guard<std::mutex> lock(d.mu);
    d.backends.push_back(&frees_);
  }

  ~CudaBackendImpl() override {
    use();
    for (auto& s : streams_) cudaStreamSynchronize(s->stream);  // every free done
    {
      DeviceFrees& d = device_frees(device_);
      std::lock_guard<std::mutex> lock(d.mu);
      d.backends.erase(std::find(d.backends.begin(), d.backends.end(), &frees_));
    }
    for (auto& s : streams_) {
      cudaFree(s->workspace);
      if (s->x16) cudaFreeAsync(s->x16, s->stream);
      for (void* p : s->slot_dev_blocks) cudaFreeAsync(p, s->stream);
      cudaStreamSynchronize(s->stream);
      for (void* p : s->slot_host_blocks) cudaFreeHost(p);
      for (auto& t : s->slots) cudaEventDestroy(t.done);
      cudaEventDestroy(s->drained);
      cudaStreamDestroy(s->stream);
    }
    for (auto& e : events_) cudaEventDestroy(e->event);
    cudaEventDestroy(frees_.freed);
    matmul_.reset();
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  int device() const override { return device_; }

  // ---- memory ----
  void* alloc(size_t bytes) override {
    use();
    DeviceFrees& d = device_frees(device_);
    std::lock_guard<std::mutex> lock(d.mu);
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes ? bytes : 256, pool_, def());
    if (e == cudaErrorMemoryAllocation || e == cudaErrorInvalidValue) {  // invalid: beyond any pool
      cudaGetLastError();
      throw Error("out of GPU memory allocating " + mib(bytes) + " on " + name() + " (" +
                  mib(free_memory()) + " free); use a smaller model, batch or sequence length");
    }
    CUDA_CHECK(e);
    // The pool may hand out a block that free() returned while work queued before that free
    // still reads it: safe on the default stream, where this allocation comes after the free,
    // but not on the other streams, nor on streams this backend does not know (NCCL's), nor
    // for another backend on this device, which may all use the memory at once. So while a free
    // may be pending, the host waits until that backend's default stream has passed its last
    // free (free() orders it after the work queued on every stream; the work queued after it
    // is not waited for). With no free pending, which is every allocation before the first free
    // and any made once the frees are done, no block of the pool is still in use by queued
    // work, and the memory is safe everywhere at once: no wait. (This used to synchronize the
    // default stream on every call.)
    for (PendingFree* f : d.backends) {
      if (!f->pending) continue;
      CUDA_CHECK(cudaEventSynchronize(f->freed));
      f->pending = false;
    }
    return p;
  }
  void free(void* ptr) override {
    if (!ptr) return;
    use();
    DeviceFrees& d = device_frees(device_);
    std::lock_guard<std::mutex> lock(d.mu);
    // The free is ordered after all work queued so far on every stream of this backend.
    for (size_t i = 1; i < streams_.size(); ++i) {
      CUDA_CHECK(cudaEventRecord(streams_[i]->drained, streams_[i]->stream));
      CUDA_CHECK(cudaStreamWaitEvent(def(), streams_[i]->drained, 0));
    }
    CUDA_CHECK(cudaFreeAsync(ptr, def()));
    CUDA_CHECK(cudaEventRecord(frees_.freed, def()));  // alloc() waits for it while pending
    frees_.pending = true;
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
  using Backend::matmul;   // the fp32 overload, next to the override below
  using Backend::zo_pass;  // likewise
  // The overloads without Gemma's variants (w_offset 0, no window, no softcap), likewise.
  using Backend::rms_norm;
  using Backend::attention;
  using Backend::rms_norm_jvp;
  using Backend::attention_jvp;

  ComputeInfo compute_info() const override {
    ComputeInfo c;
    c.bf16_fast = cc_major_ >= 8;  // bf16 tensor cores from Ampere (sm_80) on
    c.isa = device_name_ + " (sm_" + std::to_string(cc_major_) + std::to_string(cc_minor_) + ")" +
            (c.bf16_fast ? " tensor cores" : ", no bf16 tensor cores") +
            (tf32_ ? ", fp32 products in TF32" : "");
    return c;
  }

  void matmul(const float* x, const void* w, DType wt, const float* bias, float* y, int64_t M,
              int64_t N, int64_t K, Stream* s) override {
    ZOF_ASSERT(M >= 0 && N >= 0 && K >= 0);
    use();
    CudaStream* h = handle(s);
    if (wt == DType::F32) {
      matmul_->run(tf32_ ? GemmType::TF32 : GemmType::F32, x, w, bias, y, M, N, K, h->workspace,
                   h->stream);
      return;
    }
    ZOF_CHECK(wt == DType::BF16,
              std::string("the CUDA backend multiplies fp32 or bf16 weights, not ") +
                  dtype_name(wt) + "; convert them to one of those at load");
    // x rounded to bf16 (nearest even, as zof::f32_to_bf16) into this stream's scratch, then
    // bf16 x bf16 products on the tensor cores, accumulated, biased and written in fp32.
    const void* xb = x;  // not read when the product is empty (K == 0 gives y = bias)
    if (M > 0 && N > 0 && K > 0) {
      bf16* x16 = bf16_scratch(*h, M * K);
      cuda::to_bf16(x, x16, M * K, h->stream);
      xb = x16;
    }
    matmul_->run(GemmType::BF16_F32OUT, xb, w, bias, y, M, N, K, h->workspace, h->stream);
  }
  void widen(const void* x, DType xt, float* y, int64_t n, Stream* s) override {
    ZOF_ASSERT(n >= 0);
    use();
    if (xt == DType::F32) {
      if (n > 0 && x != y)
        CUDA_CHECK(cudaMemcpyAsync(y, x, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                   st(s)));
      return;
    }
    ZOF_CHECK(xt == DType::BF16, std::string("widen reads fp32 or bf16, not ") + dtype_name(xt));
    if (n > 0) cuda::to_f32(static_cast<const bf16*>(x), y, n, st(s));
  }
  void cast(const float* x, void* y, DType yt, int64_t n, Stream* s) override {
    ZOF_ASSERT(n >= 0);
    use();
    switch (yt) {
      case DType::F32:
        if (n > 0)
          CUDA_CHECK(cudaMemcpyAsync(y, x, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice,
                                     st(s)));
        return;
      case DType::BF16:
        cuda::to_bf16(x, static_cast<bf16*>(y), n, st(s));
        return;
      case DType::F16:
        cuda::to_f16(x, static_cast<__half*>(y), n, st(s));
        return;
    }
    ZOF_ABORT("cast to an unknown dtype");
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                float w_offset, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && dim >= 0);
    use();
    cuda::rms_norm(x, w, y, rows, dim, eps, w_offset, st(s));
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
                 int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
                 float softcap, DType t, Stream* s) override {
    check_attention(B, Tq, Tk, H, Hkv, D, q_offset);
    ZOF_ASSERT(window >= 0 && softcap >= 0.0f);
    ZOF_CHECK(t == DType::F32 || t == DType::BF16,
              std::string("attention computes on fp32 or bf16 inputs, not ") + dtype_name(t));
    use();
    if (t == DType::F32) {
      cuda::attention(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, window,
                      softcap, st(s));
      return;
    }
    // bf16: q * scale, k and v rounded (nearest even, as zof::f32_to_bf16) into this stream's
    // scratch, the tensor-core kernel (the generic one with a window, a soft-cap or another
    // head_dim) on them with scale 1, its bf16 out widened into out.
    const int64_t nq = B * Tq * H * D, nk = B * Tk * Hkv * D;
    if (nq == 0) return;
    CudaStream* h = handle(s);
    bf16* q16 = bf16_scratch(*h, 2 * nq + 2 * nk);
    bf16 *k16 = q16 + nq, *v16 = k16 + nk, *o16 = v16 + nk;
    cuda::to_bf16_scaled(q, scale, q16, nq, h->stream);
    if (nk > 0) {
      cuda::to_bf16(k, k16, nk, h->stream);
      cuda::to_bf16(v, v16, nk, h->stream);
    }
    cuda::attention(q16, k16, v16, o16, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, 1.0f, window,
                    softcap, h->stream);
    cuda::to_f32(o16, out, nq, h->stream);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n, Stream* s) override {
    use();
    cuda::silu_mul(gate, up, out, n, st(s));
  }
  void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n,
                     Stream* s) override {
    use();
    cuda::gelu_tanh_mul(gate, up, out, n, st(s));
  }
  void mul_scalar(float* x, float a, int64_t n, Stream* s) override {
    use();
    cuda::mul_scalar(x, a, n, st(s));
  }
  void softcap(const float* x, float* y, float cap, int64_t n, Stream* s) override {
    ZOF_ASSERT(cap > 0.0f);
    use();
    cuda::softcap(x, y, cap, n, st(s));
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
  void zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
               int n_update, float lr_wd, const ZKey* round, const ZKey* cur, float eps,
               void* plus, void* minus, DType copy_t, Stream* s) override {
    ZOF_CHECK(theta.dtype == DType::F32 || theta.dtype == DType::BF16,
              std::string("the CUDA ZO passes read fp32 or bf16 masters, not ") +
                  dtype_name(theta.dtype));
    ZOF_ASSERT(n >= 0 && first >= 0 && n_update >= 0 && (n_update == 0 || upd));
    // the Philox counter holds the group index in 32 bits
    ZOF_ASSERT(first + n <= (int64_t(1) << 34));
    cuda::check_zo_terms(n_update);
    ZOF_CHECK(copy_t == DType::F32 || copy_t == DType::BF16,
              std::string("the CUDA ZO pass writes fp32 or bf16 perturbed copies, not ") +
                  dtype_name(copy_t));
    if (n <= 0 || (n_update <= 0 && !cur)) return;  // nothing to launch
    use();
    CudaStream* h = handle(s);
    TermSlot* slot = n_update > 0 ? &stage_terms(*h, upd, n_update) : nullptr;
    cuda::zo_pass(theta.p, theta.dtype, n, tensor, first, slot ? slot->dev : nullptr, n_update, lr_wd, round,
                  cur, eps, plus, minus, copy_t, h->stream);
    if (slot) CUDA_CHECK(cudaEventRecord(slot->done, h->stream));
  }
  void round_bf16_stochastic(float* x, int64_t n, uint32_t tensor, int64_t first, const ZKey& key,
                             Stream* s) override {
    ZOF_ASSERT(n >= 0 && first >= 0 && first + n <= (int64_t(1) << 34));
    use();
    cuda::round_bf16_stochastic(x, n, tensor, first, key, st(s));
  }
  void zo_rows(Theta theta, int64_t width, const int32_t* rows, int64_t n_rows,
               uint32_t tensor, const ZKey& cur, float eps, float* plus, float* minus,
               Stream* s) override {
    ZOF_CHECK(theta.dtype == DType::F32 || theta.dtype == DType::BF16,
              std::string("the CUDA ZO passes read fp32 or bf16 masters, not ") +
                  dtype_name(theta.dtype));
    ZOF_ASSERT(width >= 0 && n_rows >= 0);
    use();
    cuda::zo_rows(theta.p, theta.dtype, width, rows, n_rows, tensor, cur, eps, plus, minus, st(s));
  }
  void zo_update_state(Theta theta, float* m, float* v, int64_t n, uint32_t tensor,
                       int64_t first, const ZOUpdateTerm* upd, int n_update,
                       const ZOOptimizer& o, const ZKey* round, Stream* s) override {
    ZOF_CHECK(theta.dtype == DType::F32 || theta.dtype == DType::BF16,
              std::string("the CUDA ZO passes read fp32 or bf16 masters, not ") +
                  dtype_name(theta.dtype));
    ZOF_ASSERT(n >= 0 && first >= 0 && n_update >= 0 && (n_update == 0 || upd));
    ZOF_ASSERT(first + n <= (int64_t(1) << 34));
    cuda::check_zo_terms(n_update);
    if (n <= 0 || n_update <= 0) return;  // nothing to launch
    use();
    CudaStream* h = handle(s);
    TermSlot& slot = stage_terms(*h, upd, n_update);
    cuda::zo_update_state(theta.p, theta.dtype, m, v, n, tensor, first, slot.dev, n_update, o, round,
                          h->stream);
    CUDA_CHECK(cudaEventRecord(slot.done, h->stream));
  }
  void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows, int64_t n,
                           int64_t v0, float* max, float* sum, float* target, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && n >= 0);
    use();
    cuda::cross_entropy_chunk(logits, targets, rows, n, v0, max, sum, target, st(s));
  }

  // ---- fp32 tangents ----
  void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                    int64_t rows, int64_t dim, float eps, float w_offset, Stream* s) override {
    ZOF_ASSERT(rows >= 0 && dim >= 0);
    use();
    cuda::rms_norm_jvp(x, dx, w, dw, dy, rows, dim, eps, w_offset, st(s));
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
                     int64_t window, float softcap, Stream* s) override {
    check_attention(B, S, S, H, Hkv, D, 0);
    ZOF_ASSERT(window >= 0 && softcap >= 0.0f);
    ZOF_CHECK(D <= cuda::kMaxJvpHeadDim,
              "the CUDA attention tangent takes head_dim <= " +
                  std::to_string(cuda::kMaxJvpHeadDim) + ", not " + std::to_string(D) +
                  ": use the SPSA estimator (--estimator spsa) for this model");
    use();
    cuda::attention_jvp(q, dq, k, dk, v, dv, dout, key_mask, B, S, H, Hkv, D, scale, window,
                        softcap, st(s));
  }
  void silu_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                    float* dout, int64_t n, Stream* s) override {
    use();
    cuda::silu_mul_jvp(gate, dgate, up, dup, dout, n, st(s));
  }
  void gelu_tanh_mul_jvp(const float* gate, const float* dgate, const float* up,
                         const float* dup, float* dout, int64_t n, Stream* s) override {
    use();
    cuda::gelu_tanh_mul_jvp(gate, dgate, up, dup, dout, n, st(s));
  }
  void softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n,
                   Stream* s) override {
    ZOF_ASSERT(cap > 0.0f);
    use();
    cuda::softcap_jvp(x, dx, dy, cap, n, st(s));
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

 private:
  void use() const { CUDA_CHECK(cudaSetDevice(device_)); }
  CudaStream* handle(Stream* s) {
    return s ? reinterpret_cast<CudaStream*>(s) : streams_[0].get();
  }
  cudaStream_t st(Stream* s) { return handle(s)->stream; }
  cudaStream_t def() { return streams_[0]->stream; }

  // This stream's bf16 scratch of at least n elements. Grown by half again at least (a few
  // growths reach the largest input), in whole MiB; the old block is freed after the work queued
  // so far, on every stream. The new one comes from the pool in this stream's order: only this
  // stream uses it, so neither the host nor another stream waits.
  bf16* bf16_scratch(CudaStream& h, int64_t n) {
    const size_t need = size_t(n) * sizeof(bf16);
    if (need > h.x16_bytes) {
      constexpr size_t kGrain = size_t(1) << 20;
      const size_t grown = std::max(need, h.x16_bytes + h.x16_bytes / 2);
      const size_t bytes = (grown + kGrain - 1) / kGrain * kGrain;
      void* p = nullptr;
      const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool_, h.stream);
      if (e == cudaErrorMemoryAllocation || e == cudaErrorInvalidValue) {
        cudaGetLastError();
        throw Error("out of GPU memory allocating the " + mib(bytes) +
                    " bf16 copy of a matrix product's or attention's inputs on " + name() + " (" +
                    mib(free_memory()) + " free); use a smaller batch or sequence length");
      }
      CUDA_CHECK(e);
      void* old = h.x16;
      h.x16 = p;
      h.x16_bytes = bytes;
      free(old);
    }
    return static_cast<bf16*>(h.x16);
  }

  // A slot holding upd[0, n_update) on the device in stream h's order: staged in its pinned half
  // and copied on the stream. The caller launches the kernel that reads slot.dev and then records
  // slot.done on the stream. upd may be freed once this returns.
  TermSlot& stage_terms(CudaStream& h, const ZOUpdateTerm* upd, int n_update) {
    TermSlot& t = term_slot(h);
    const size_t bytes = size_t(n_update) * sizeof(ZOUpdateTerm);
    std::memcpy(static_cast<void*>(t.host), upd, bytes);
    CUDA_CHECK(cudaMemcpyAsync(t.dev, t.host, bytes, cudaMemcpyHostToDevice, h.stream));
    return t;
  }
  // The oldest slot of h when its kernel is done (its pinned half may then be rewritten and its
  // device half is read by no queued kernel), else a fresh one inserted before it, so the ring
  // keeps the order of use. Only past kMaxTermSlots slots does the host wait for the oldest.
  TermSlot& term_slot(CudaStream& h) {
    if (!h.slots.empty()) {
      TermSlot& oldest = h.slots[h.next_slot];
      const cudaError_t e = cudaEventQuery(oldest.done);  // a never-recorded event is done
      if (e != cudaErrorNotReady) CUDA_CHECK(e);
      if (e == cudaSuccess || h.slots.size() >= kMaxTermSlots) {
        if (e != cudaSuccess) CUDA_CHECK(cudaEventSynchronize(oldest.done));
        h.next_slot = (h.next_slot + 1) % h.slots.size();
        return oldest;
      }
    }
    // Every slot is in flight: a block of fresh ones at next_slot, used before the oldest.
    void* host = nullptr;
    void* dev = nullptr;
    const size_t block = kTermSlotBytes * kTermSlotsPerBlock;
    cudaError_t e = cudaHostAlloc(&host, block, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error("out of pinned host memory for the ZO update terms; raise the locked-memory "
                  "limit (ulimit -l)");
    }
    CUDA_CHECK(e);
    e = cudaMallocFromPoolAsync(&dev, block, pool_, h.stream);  // used on this stream only
    if (e == cudaErrorMemoryAllocation || e == cudaErrorInvalidValue) {
      cudaGetLastError();
      cudaFreeHost(host);
      throw Error("out of GPU memory for the ZO update terms on " + name());
    }
    CUDA_CHECK(e);
    h.slot_host_blocks.push_back(host);
    h.slot_dev_blocks.push_back(dev);
    std::vector<TermSlot> fresh(kTermSlotsPerBlock);
    for (size_t i = 0; i < kTermSlotsPerBlock; ++i) {
      const size_t at = i * kTermSlotBytes;
      fresh[i].host = reinterpret_cast<ZOUpdateTerm*>(static_cast<char*>(host) + at);
      fresh[i].dev = reinterpret_cast<ZOUpdateTerm*>(static_cast<char*>(dev) + at);
      CUDA_CHECK(cudaEventCreateWithFlags(&fresh[i].done, cudaEventDisableTiming));
    }
    h.slots.insert(h.slots.begin() + std::ptrdiff_t(h.next_slot), fresh.begin(), fresh.end());
    TermSlot& t = h.slots[h.next_slot];
    h.next_slot = (h.next_slot + 1) % h.slots.size();
    return t;
  }

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
  bool tf32_ = false;  // fp32 products on TF32 tensor cores (--tf32)
  std::string device_name_;
  int cc_major_ = 0, cc_minor_ = 0;
  cudaMemPool_t pool_ = nullptr;
  PendingFree frees_;  // under device_frees(device_).mu
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

std::unique_ptr<CudaBackend> make_cuda_backend(int device, bool tf32) {
  return std::make_unique<cuda::CudaBackendImpl>(device, tf32);
}

}  // namespace zof
