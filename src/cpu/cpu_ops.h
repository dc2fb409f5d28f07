// The CPU backend's ops, one function per Backend op under the same name in zof::cpu, each taking
// the number of OpenMP threads to use. Every output element is computed by one thread in a fixed
// order, so results do not depend on the thread count (matmul: see cpu_matmul.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "zof/backend.h"

namespace zof::cpu {

// Matmul y(M,N) = x(M,K) w(N,K)^T + bias(N): oneDNN with primitives cached per shape
// (cpu_matmul.cpp), or a blocked OpenMP GEMM where oneDNN is absent (cpu_matmul_blocked.cpp).
class Matmul {
 public:
  explicit Matmul(int threads);
  // Weights of more bytes than max_laid_out_bytes are not laid out for the kernels (the
  // default: kMaxLaidOutBytes in cpu_matmul.cpp, 128 MiB); tests set another.
  Matmul(int threads, size_t max_laid_out_bytes);
  ~Matmul();
  // w of type wt: F32 (strict fp32) or BF16 (x rounded to bf16 first, fp32 accumulation).
  void run(const float* x, const void* w, DType wt, const float* bias, float* y, int64_t M,
           int64_t N, int64_t K);
  // The ISA the bf16 products run on, as oneDNN names it ("avx512_core_amx"), and whether
  // that beats fp32 (AMX).
  static Backend::ComputeInfo compute_info();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Strip `strip` (64 columns) of a block's weights w (`cols` rows of K values of type t: F32 or
// BF16) in the layout oneDNN's brgemm kernels read (cpu_matmul.cpp): ceil(K / D) * D * 64
// values, D = 32 (bf16) or 16 (fp32). `portable`: the scalar loops, not AVX-512's.
void lay_out_strip(const void* w, DType t, int64_t cols, int64_t K, int64_t strip, void* out,
                   bool portable = false);

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
              float w_offset, int threads);
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                int64_t dim, float eps, int threads);
void rope(float* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rotary_dim, const float* inv_freq, int threads);
void attention(const float* q, const float* k, const float* v, float* out,
               const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
               int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
               float softcap, int threads, DType dtype = DType::F32);
// attention over a packed batch (Backend::attention_packed): sequence b's rows starts[b] ..
// starts[b + 1] - 1, each attending causally to its own keys; the same bits as one call each.
void attention_packed(const float* q, const float* k, const float* v, float* out,
                      const int32_t* starts, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                      float scale, int64_t window, float softcap, int threads, DType dtype);
void silu_mul(const float* gate, const float* up, float* out, int64_t n, int threads);
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n, int threads);
void mul_scalar(float* x, float a, int64_t n, int threads);
void softcap(const float* x, float* y, float cap, int64_t n, int threads);
void gelu_tanh(float* x, int64_t n, int threads);
void gelu_erf(float* x, int64_t n, int threads);
void relu(float* x, int64_t n, int threads);
void add(float* y, const float* x, int64_t n, int threads);
void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
               bool accumulate, int threads);
void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                   int64_t vocab, int threads);
// Backend::cross_entropy_chunk, for both host backends: OpenMP's default team over rows (each
// row is folded by one thread, so the bits do not depend on it).
void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows, int64_t n,
                         int64_t v0, float* max, float* sum, float* target);

// Below this many elements of work an op runs on the calling thread: an OpenMP fork/join costs
// a few microseconds, more than the op itself.
constexpr int64_t kMinParallelWork = 1 << 15;

// Calls f(begin, end) on fixed blocks of [0, n) spread over threads. The blocks do not depend on
// the thread count, so neither does which elements land in a vector body or a scalar tail.
template <class F>
void parallel_blocks(int64_t n, int threads, F f) {
  constexpr int64_t kBlock = 8192;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= kMinParallelWork)
  for (int64_t b = 0; b < blocks; ++b) f(b * kBlock, b + 1 < blocks ? (b + 1) * kBlock : n);
}

}  // namespace zof::cpu
