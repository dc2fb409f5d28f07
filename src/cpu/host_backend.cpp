// The shared slots of the host backends: aligned_alloc, memcpy, streams and events that only
// exist to be handed back (host ops complete before they return), and the shared ops, each a
// call of its host loop.
#include "cpu/host_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/cpu_zo.h"
#include "cpu/jvp_ops.h"
#include "util/files.h"
#include "util/philox.h"
#include "zof/error.h"

namespace zof {

// The Backend's default slots (zof/backend.h), for backends without a cheaper way: the memory
// cleared by copies of a zero buffer.
void* Backend::alloc_zeroed(size_t bytes) {
  void* p = alloc(bytes);
  const std::vector<char> zeros(std::min<size_t>(bytes, (size_t)1 << 22), 0);
  try {
    for (size_t i = 0; i < bytes; i += zeros.size())
      copy_to_device(static_cast<char*>(p) + i, zeros.data(), std::min(zeros.size(), bytes - i),
                     nullptr);
    synchronize(nullptr);  // the zeros are read from a host vector about to go
  } catch (...) {
    free(p);
    throw;
  }
  return p;
}

void* Backend::alloc_host_pinned_zeroed(size_t bytes) {
  void* p = alloc_host_pinned(bytes);
  std::memset(p, 0, bytes);
  return p;
}

}  // namespace zof

namespace zof::cpu {

void* aligned_host_alloc(size_t bytes) {
  // Large arrays (the optimizer state's planes) start on a page: the disk tier's store lays
  // their blocks out by their place in a page, which must be the same in a resumed run.
  const size_t kAlign = bytes >= 4096 ? 4096 : 64;
  size_t rounded = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  ZOF_CHECK(rounded >= bytes, "cannot allocate " + std::to_string(bytes) + " bytes: size overflows");
  void* p = std::aligned_alloc(kAlign, rounded);
  ZOF_CHECK(p != nullptr, "out of host memory allocating " + std::to_string(bytes) +
                              " bytes (" + std::to_string(available_host_memory()) +
                              " available); use a smaller model, batch or sequence length");
  return p;
}

void* aligned_host_alloc_zeroed(size_t bytes) {
  char* p = static_cast<char*>(aligned_host_alloc(bytes));
  static const uintptr_t page = (uintptr_t)::sysconf(_SC_PAGESIZE);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), e = a + bytes;
  const uintptr_t lo = (a + page - 1) / page * page, hi = e / page * page;
  // Private anonymous memory (all malloc hands out) reads as zeros after MADV_DONTNEED.
  if (hi > lo && ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) == 0) {
    std::memset(p, 0, lo - a);
    std::memset(reinterpret_cast<void*>(hi), 0, e - hi);
  } else {
    std::memset(p, 0, bytes);
  }
  return p;
}

size_t available_host_memory() { return (size_t)zof::available_host_memory(); }

HostBackend::HostBackend() { streams_.push_back(std::make_unique<HostStream>(HostStream{0})); }

void* HostBackend::alloc(size_t bytes) { return aligned_host_alloc(bytes); }
void HostBackend::free(void* ptr) { std::free(ptr); }
void* HostBackend::alloc_zeroed(size_t bytes) { return aligned_host_alloc_zeroed(bytes); }
void* HostBackend::alloc_host_pinned(size_t bytes) { return aligned_host_alloc(bytes); }
void* HostBackend::alloc_host_pinned_zeroed(size_t bytes) {
  return aligned_host_alloc_zeroed(bytes);
}
void HostBackend::free_host_pinned(void* ptr) { std::free(ptr); }
size_t HostBackend::free_memory() const { return available_host_memory(); }

Stream* HostBackend::default_stream() { return reinterpret_cast<Stream*>(streams_[0].get()); }
Stream* HostBackend::create_stream() {
  streams_.push_back(std::make_unique<HostStream>(HostStream{int(streams_.size())}));
  return reinterpret_cast<Stream*>(streams_.back().get());
}
void HostBackend::copy_to_device(void* dst, const void* src, size_t bytes, Stream*) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void HostBackend::copy_to_host(void* dst, const void* src, size_t bytes, Stream*) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void HostBackend::copy_device(void* dst, const void* src, size_t bytes, Stream*) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void HostBackend::copy_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch,
                                 size_t width, size_t rows, Stream*) {
  if (!width) return;
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
                width);
}
Event* HostBackend::create_event() {
  events_.push_back(std::make_unique<HostEvent>(HostEvent{int(events_.size())}));
  return reinterpret_cast<Event*>(events_.back().get());
}
void HostBackend::record(Event*, Stream*) {}
void HostBackend::wait(Stream*, Event*) {}
void HostBackend::synchronize(Stream*) {}

void HostBackend::zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first,
                          const ZOUpdateTerm* upd, int n_update, float lr_wd,
                          const ZKey* round, const ZKey* cur, float eps, void* plus, void* minus,
                          DType copy_t, Stream*) {
  cpu::zo_pass(theta, n, tensor, first, upd, n_update, lr_wd, cur, eps, plus, minus, copy_t,
               round);
}
void HostBackend::cast(const float* x, void* y, DType yt, int64_t n, Stream*) {
  if (yt == DType::F32) {
    if (n > 0 && y != x) std::memcpy(y, x, size_t(n) * sizeof(float));
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(y);
  const bool bf = yt == DType::BF16;
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = bf ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
}
void HostBackend::widen(const void* x, DType xt, float* y, int64_t n, Stream*) {
  if (xt == DType::F32) {
    if (n > 0 && y != x) std::memcpy(y, x, size_t(n) * sizeof(float));
    return;
  }
  ZOF_CHECK(xt == DType::BF16, std::string("widen reads fp32 or bf16, not ") + dtype_name(xt));
  const uint16_t* in = static_cast<const uint16_t*>(x);
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(in[i]);
}
void HostBackend::zo_rows(Theta theta, int64_t width, const int32_t* rows, int64_t n_rows,
                          uint32_t tensor, const ZKey& cur, float eps, float* plus, float* minus,
                          Stream*) {
  cpu::zo_rows(theta, width, rows, n_rows, tensor, cur, eps, plus, minus);
}
void HostBackend::zo_update_state(Theta theta, float* m, float* v, int64_t n, uint32_t tensor,
                                  int64_t first, const ZOUpdateTerm* upd, int n_update,
                                  const ZOOptimizer& o, const ZKey* round, Stream*) {
  cpu::zo_update_state(theta, m, v, n, tensor, first, upd, n_update, o, round);
}
void HostBackend::cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows,
                                      int64_t n, int64_t v0, float* max, float* sum,
                                      float* target, Stream*) {
  cpu::cross_entropy_chunk(logits, targets, rows, n, v0, max, sum, target);
}

void HostBackend::round_bf16_stochastic(float* x, int64_t n, uint32_t tensor, int64_t first,
                                        const ZKey& key, Stream*) {
  if (n <= 0) return;
  // 16 groups (64 elements) of bits at once through philox16, the lanes of round_bits_group.
  ZKey k;
  k.seed = key.seed, k.step = key.step, k.query = kRoundQuery;
  const int64_t g_lo = first / 4, g_hi = (first + n + 3) / 4;
  const int64_t blocks = (g_hi - g_lo + 15) / 16;
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t g0 = g_lo + 16 * b;
    uint32_t c[4][16];
    philox16(k, tensor, (uint32_t)g0, c[0], c[1], c[2], c[3]);
    for (int l = 0; l < 16; ++l)
      for (int j = 0; j < 4; ++j) {
        const int64_t i = (g0 + l) * 4 + j - first;
        if (i >= 0 && i < n) x[i] = bf16_round_stochastic(x[i], c[j][l]);
      }
  }
}

void HostBackend::rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                               float* dy, int64_t rows, int64_t dim, float eps, float w_offset,
                               Stream*) {
  jvp::rms_norm_jvp<float>(x, dx, w, dw, dy, rows, dim, eps, w_offset);
}
void HostBackend::layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                                 const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                                 Stream*) {
  jvp::layer_norm_jvp<float>(x, dx, w, dw, db, dy, rows, dim, eps);
}
void HostBackend::attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                                const float* v, const float* dv, float* dout,
                                const uint8_t* key_mask, int64_t B, int64_t S, int64_t H,
                                int64_t Hkv, int64_t D, float scale, int64_t window,
                                float softcap, Stream*) {
  jvp::attention_jvp<float>(q, dq, k, dk, v, dv, dout, key_mask, B, S, H, Hkv, D, double(scale),
                            window, double(softcap));
}
void HostBackend::silu_mul_jvp(const float* gate, const float* dgate, const float* up,
                               const float* dup, float* dout, int64_t n, Stream*) {
  jvp::silu_mul_jvp<float>(gate, dgate, up, dup, dout, n);
}
void HostBackend::gelu_tanh_mul_jvp(const float* gate, const float* dgate, const float* up,
                                    const float* dup, float* dout, int64_t n, Stream*) {
  jvp::gelu_tanh_mul_jvp<float>(gate, dgate, up, dup, dout, n);
}
void HostBackend::softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n,
                              Stream*) {
  jvp::softcap_jvp<float>(x, dx, dy, double(cap), n);
}
void HostBackend::gelu_tanh_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream*) {
  jvp::activation_jvp<float>(Activation::GeluTanh, x, dx, dy, n);
}
void HostBackend::gelu_erf_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream*) {
  jvp::activation_jvp<float>(Activation::GeluErf, x, dx, dy, n);
}
void HostBackend::relu_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream*) {
  jvp::activation_jvp<float>(Activation::ReLU, x, dx, dy, n);
}
void HostBackend::cross_entropy_jvp(const float* logits, const float* dlogits,
                                    const int32_t* targets, float* dnll, int64_t rows,
                                    int64_t vocab, Stream*) {
  jvp::cross_entropy_jvp<float>(logits, dlogits, targets, dnll, rows, vocab);
}

}  // namespace zof::cpu
