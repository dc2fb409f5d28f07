// The slots shared by the two host backends (reference and cpu): 64-byte aligned host memory,
// copies as memcpy, trivial streams and events since every op runs inline, and the host loops of
// the ops both run the same way (the ZO passes, the chunked loss, the tangents). They live here,
// not in Backend, so that a device backend has no host loop to fall back on by accident.
// Each backend keeps its own handle types and hands them out cast to the opaque zof::Stream and
// zof::Event, so no backend ever defines those names (the CUDA backend must do the same).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "zof/backend.h"

namespace zof::cpu {

class HostBackend : public Backend {
 public:
  HostBackend();

  void* alloc(size_t bytes) override;
  void* alloc_zeroed(size_t bytes) override;
  void free(void* ptr) override;
  void* alloc_host_pinned(size_t bytes) override;
  void* alloc_host_pinned_zeroed(size_t bytes) override;
  void free_host_pinned(void* ptr) override;
  size_t free_memory() const override;

  Stream* default_stream() override;
  Stream* create_stream() override;
  void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) override;
  void copy_to_host(void* dst, const void* src, size_t bytes, Stream* s) override;
  void copy_device(void* dst, const void* src, size_t bytes, Stream* s) override;
  void copy_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                      size_t rows, Stream* s) override;
  Event* create_event() override;
  // Work is done by the time a call returns, so an event is complete as soon as it is recorded.
  void record(Event* e, Stream* s) override;
  void wait(Stream* s, Event* e) override;
  void synchronize(Stream* s) override;

  // Ops on host memory that both host backends share (backend.h says what each computes).
  // The ZO passes and the chunked loss: cpu_zo.h and cpu_ops.h, OpenMP's default team.
  using Backend::attention;
  using Backend::attention_jvp;
  using Backend::matmul;
  using Backend::rms_norm;
  using Backend::rms_norm_jvp;
  using Backend::zo_pass;
  void zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
               int n_update, float lr_wd, const ZKey* round, const ZKey* cur, float eps,
               void* plus, void* minus, DType copy_t, Stream* s) override;
  void cast(const float* x, void* y, DType yt, int64_t n, Stream* s) override;
  void widen(const void* x, DType xt, float* y, int64_t n, Stream* s) override;
  void zo_rows(Theta theta, int64_t width, const int32_t* rows, int64_t n_rows,
               uint32_t tensor, const ZKey& cur, float eps, float* plus, float* minus,
               Stream* s) override;
  void zo_update_state(Theta theta, float* m, float* v, int64_t n, uint32_t tensor,
                       int64_t first, const ZOUpdateTerm* upd, int n_update, const ZOOptimizer& o,
                       const ZKey* round, Stream* s) override;
  void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows, int64_t n,
                           int64_t v0, float* max, float* sum, float* target, Stream* s) override;
  void round_bf16_stochastic(float* x, int64_t n, uint32_t tensor, int64_t first, const ZKey& key,
                             Stream* s) override;
  // The tangents: jvp_ops.h's loops in fp32 (double accumulation).
  void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                    int64_t rows, int64_t dim, float eps, float w_offset, Stream* s) override;
  void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                      const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                      Stream* s) override;
  void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                     const float* v, const float* dv, float* dout, const uint8_t* key_mask,
                     int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                     int64_t window, float softcap, Stream* s) override;
  void silu_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                    float* dout, int64_t n, Stream* s) override;
  void gelu_tanh_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                         float* dout, int64_t n, Stream* s) override;
  void softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n,
                   Stream* s) override;
  void gelu_tanh_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override;
  void gelu_erf_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override;
  void relu_jvp(const float* x, const float* dx, float* dy, int64_t n, Stream* s) override;
  void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* targets,
                         float* dnll, int64_t rows, int64_t vocab, Stream* s) override;

 private:
  struct HostStream {
    int id;
  };
  struct HostEvent {
    int id;
  };
  std::vector<std::unique_ptr<HostStream>> streams_;  // [0] is the default stream
  std::vector<std::unique_ptr<HostEvent>> events_;
};

// 64-byte aligned host memory of at least `bytes` (rounded up; 0 gives a valid 64-byte block).
// Throws zof::Error when the system has no memory left.
void* aligned_host_alloc(size_t bytes);
// aligned_host_alloc() of memory that reads as zeros: its whole pages given back to the system
// (fresh zero pages when first touched, so untouched ones cost no memory), the rest cleared.
void* aligned_host_alloc_zeroed(size_t bytes);
// MemAvailable from /proc/meminfo, or free pages from sysconf where that file is missing.
size_t available_host_memory();

}  // namespace zof::cpu
