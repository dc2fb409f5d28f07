// The CPU backend's token loss: nll = logsumexp(logits) - logits[target] per row, stable (the row
// maximum is subtracted before exp), one row per iteration over OpenMP threads.
#include <cmath>

#include "cpu/cpu_ops.h"
#include "cpu/vec_math.h"
#include "zof/error.h"

namespace zof::cpu {

void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                   int64_t vocab, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * vocab >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const float* lr = logits + r * vocab;
    const int32_t t = targets[r];
    if (t < 0) {
      nll[r] = 0.0f;
      continue;
    }
    ZOF_ASSERT(t < vocab);
    float mx = lr[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < vocab; ++j) mx = mx > lr[j] ? mx : lr[j];
    // logsumexp - x_t = (mx - x_t) + log1p(sum over the other elements of e^(x_j - mx)): one
    // maximum contributes exactly 1, taken out so that a confident row's tiny loss keeps its
    // digits (log(1 + s) rounds s to fp32 ulps of 1).
    float rest = 0.0f;
    int64_t at_max = 0;
#pragma omp simd simdlen(16) reduction(+ : rest, at_max)
    for (int64_t j = 0; j < vocab; ++j) {
      const bool below = lr[j] < mx;
      const float e = exp_f32(lr[j] - mx);
      rest += below ? e : 0.0f;
      at_max += below ? 0 : 1;
    }
    nll[r] = (mx - lr[t]) + std::log1p(rest + float(at_max - 1));
  }
}

void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows, int64_t n,
                         int64_t v0, float* max, float* sum, float* target) {
#pragma omp parallel for schedule(static) if (rows * n >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = targets[r];
    if (t < 0) continue;
    const float* lr = logits + r * n;
    float mx = max[r];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; ++j) mx = mx > lr[j] ? mx : lr[j];
    float s = 0.0f;
#pragma omp simd simdlen(16) reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += exp_f32(lr[j] - mx);
    // exp(-inf - mx) = 0 on the first chunk.
    sum[r] = sum[r] * exp_f32(max[r] - mx) + s;
    max[r] = mx;
    if (t >= v0 && t < v0 + n) target[r] = lr[t - v0];
  }
}

}  // namespace zof::cpu
