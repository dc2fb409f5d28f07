// The CPU backend's row normalizations (RMSNorm, LayerNorm): one row per iteration over OpenMP
// threads, fp32 SIMD reductions within a row.
#include <cmath>

#include "cpu/cpu_ops.h"

namespace zof::cpu {

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
              float w_offset, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;  // y may alias x: the row is read in full before it is written
    float* yr = y + r * dim;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / float(dim) + eps);
    if (w_offset == 0.0f) {
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
    } else {  // Gemma: (w + 1) in fp32 first, as transformers' (1 + w.float())
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * (w[i] + w_offset);
    }
  }
}

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                int64_t dim, float eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    // The mean in double: an fp32 sum of a row with a large offset (mean 30, dim 1000) errs by
    // ~1e-5 of the normalized output when the compiler does not split it into vector lanes.
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < dim; ++i) sum += double(xr[i]);
    const float mean = float(sum / double(dim));
    float var = 0.0f;  // two passes: E[(x-mean)^2] keeps its digits where E[x^2]-mean^2 does not
#pragma omp simd reduction(+ : var)
    for (int64_t i = 0; i < dim; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / std::sqrt(var / float(dim) + eps);
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
  }
}

}  // namespace zof::cpu
