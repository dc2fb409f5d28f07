// make_cpu_backend: the fast CPU backend, oneDNN for matmul and OpenMP loops for the rest
// (src/cpu/cpu_*.cpp). It owns its thread count and passes it to every op, so two backends with
// different counts can live in one process without touching the global OpenMP setting.
#include <omp.h>

#include "cpu/cpu_ops.h"
#include "cpu/host_backend.h"
#include "zof/error.h"

namespace zof::cpu {

namespace {

class CpuBackend final : public HostBackend {
 public:
  explicit CpuBackend(int threads)
      : threads_(threads > 0 ? threads : omp_get_max_threads()), matmul_(threads_) {}

  std::string name() const override { return "cpu"; }

  ComputeInfo compute_info() const override { return Matmul::compute_info(); }
  void matmul(const float* x, const void* w, DType wt, const float* bias, float* y, int64_t M,
              int64_t N, int64_t K, Stream*) override {
    matmul_.run(x, w, wt, bias, y, M, N, K);
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                float w_offset, Stream*) override {
    cpu::rms_norm(x, w, y, rows, dim, eps, w_offset, threads_);
  }
  void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                  int64_t dim, float eps, Stream*) override {
    cpu::layer_norm(x, w, b, y, rows, dim, eps, threads_);
  }
  void rope(float* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
            int64_t rotary_dim, const float* inv_freq, Stream*) override {
    ZOF_ASSERT(rotary_dim % 2 == 0 && rotary_dim <= head_dim);
    cpu::rope(x, pos, rows, n_heads, head_dim, rotary_dim, inv_freq, threads_);
  }
  void attention(const float* q, const float* k, const float* v, float* out,
                 const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                 int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
                 float softcap, DType t, Stream*) override {
    cpu::attention(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, window, softcap,
                   threads_, t);
  }
  void attention_packed(const float* q, const float* k, const float* v, float* out,
                        const int32_t* starts, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                        float scale, int64_t window, float softcap, DType t, Stream*) override {
    cpu::attention_packed(q, k, v, out, starts, B, H, Hkv, D, scale, window, softcap, threads_, t);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n, Stream*) override {
    cpu::silu_mul(gate, up, out, n, threads_);
  }
  void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n,
                     Stream*) override {
    cpu::gelu_tanh_mul(gate, up, out, n, threads_);
  }
  void mul_scalar(float* x, float a, int64_t n, Stream*) override {
    cpu::mul_scalar(x, a, n, threads_);
  }
  void softcap(const float* x, float* y, float cap, int64_t n, Stream*) override {
    cpu::softcap(x, y, cap, n, threads_);
  }
  void gelu_tanh(float* x, int64_t n, Stream*) override { cpu::gelu_tanh(x, n, threads_); }
  void gelu_erf(float* x, int64_t n, Stream*) override { cpu::gelu_erf(x, n, threads_); }
  void relu(float* x, int64_t n, Stream*) override { cpu::relu(x, n, threads_); }
  void add(float* y, const float* x, int64_t n, Stream*) override { cpu::add(y, x, n, threads_); }
  void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
                 bool accumulate, Stream*) override {
    cpu::embedding(ids, table, out, n, dim, accumulate, threads_);
  }
  void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                     int64_t vocab, Stream*) override {
    cpu::cross_entropy(logits, targets, nll, rows, vocab, threads_);
  }

 private:
  int threads_;
  Matmul matmul_;
};

}  // namespace
}  // namespace zof::cpu

namespace zof {
std::unique_ptr<Backend> make_cpu_backend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads);
}
}  // namespace zof
