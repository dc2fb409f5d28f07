// cpu::Matmul without oneDNN (ZOF_DNNL=OFF, or the GPU machine that has no Debian packages): a
// blocked GEMM over OpenMP threads. Both x and w are read along K (w is nn.Linear (N,K)), so each
// output is a dot product of two contiguous rows, summed in 8 vector lanes and then across them
// in a fixed order: results do not depend on the thread count or the blocking.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_ops.h"
#include "zof/error.h"

namespace zof::cpu {

namespace {

typedef float v8 __attribute__((vector_size(32)));
inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

constexpr int64_t kTile = 4;    // 4 x 4 outputs per register tile
constexpr int64_t kBlock = 64;  // 64 rows of w (64 K floats each) stay in L2 across x's rows

// y[m0..m0+4) x [n0..n0+4) (clamped to M, N).
void tile(const float* x, const float* w, const float* bias, float* y, int64_t m0, int64_t n0,
          int64_t M, int64_t N, int64_t K) {
  const float* xr[kTile];
  const float* wr[kTile];
  for (int64_t i = 0; i < kTile; ++i) {  // rows past the edge repeat the last one, not stored
    xr[i] = x + std::min(m0 + i, M - 1) * K;
    wr[i] = w + std::min(n0 + i, N - 1) * K;
  }
  v8 acc[kTile][kTile] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    v8 xv[kTile], wv[kTile];
    for (int64_t i = 0; i < kTile; ++i) xv[i] = load8(xr[i] + k), wv[i] = load8(wr[i] + k);
    for (int64_t i = 0; i < kTile; ++i)
      for (int64_t j = 0; j < kTile; ++j) acc[i][j] += xv[i] * wv[j];
  }
  for (int64_t i = 0; i < kTile && m0 + i < M; ++i) {
    for (int64_t j = 0; j < kTile && n0 + j < N; ++j) {
      const v8 a = acc[i][j];
      float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
      for (int64_t kk = k; kk < K; ++kk) s += xr[i][kk] * wr[j][kk];
      y[(m0 + i) * N + n0 + j] = bias ? s + bias[n0 + j] : s;
    }
  }
}

}  // namespace

struct Matmul::Impl {
  int threads;
};

Matmul::Matmul(int threads) : impl_(std::make_unique<Impl>(Impl{threads})) {}
Matmul::Matmul(int threads, size_t) : Matmul(threads) {}  // no kernels' layout to lay out
Matmul::~Matmul() = default;

Backend::ComputeInfo Matmul::compute_info() {
  return Backend::ComputeInfo{false, "blocked OpenMP GEMM (no oneDNN; bf16 widened to fp32)"};
}

void Matmul::run(const float* x, const void* wv, DType wt, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K) {
  ZOF_CHECK(wt == DType::F32 || wt == DType::BF16,
            std::string("the CPU matrix product takes fp32 or bf16 weights, not ") + dtype_name(wt));
  if (wt == DType::BF16 && M > 0 && N > 0 && K > 0) {
    // No bf16 kernel here: the same products in fp32 (a bf16 x bf16 product is exact in fp32).
    std::vector<float> xs(size_t(M * K)), ws(size_t(N * K));
    const uint16_t* wb = static_cast<const uint16_t*>(wv);
    for (int64_t i = 0; i < M * K; ++i) xs[i] = bf16_round(x[i]);
    for (int64_t i = 0; i < N * K; ++i) ws[i] = bf16_to_f32(wb[i]);
    return run(xs.data(), ws.data(), DType::F32, bias, y, M, N, K);
  }
  const float* w = static_cast<const float*>(wv);
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty sum: y is the bias, broadcast
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] = bias ? bias[n] : 0.0f;
    return;
  }
  const int64_t mblocks = (M + kBlock - 1) / kBlock, nblocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) schedule(static) num_threads(impl_->threads) \
    if (M * N * K >= kMinParallelWork)
  for (int64_t bm = 0; bm < mblocks; ++bm) {
    for (int64_t bn = 0; bn < nblocks; ++bn) {
      const int64_t m_end = std::min(M, (bm + 1) * kBlock), n_end = std::min(N, (bn + 1) * kBlock);
      for (int64_t m0 = bm * kBlock; m0 < m_end; m0 += kTile)
        for (int64_t n0 = bn * kBlock; n0 < n_end; n0 += kTile) tile(x, w, bias, y, m0, n0, M, N, K);
    }
  }
}

}  // namespace zof::cpu
