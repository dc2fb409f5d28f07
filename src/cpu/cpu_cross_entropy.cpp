// The CPU backend's token loss: nll = logsumexp(logits) - logits[target] per row, stable (the row
// maximum is subtracted before exp), one row per iteration over OpenMP threads.
#include <cmath>

#include "cpu/cpu_ops.h"
#include "cpu/vec_math.h"
#include "zof/error.h"

namespace zof::cpu {

namespace {

// The vocabulary's sums, in 16 fixed lanes (element j into lane j % 16, the lanes added in one
// fixed order at the end) rather than an omp simd reduction: the same bits whether or not (and
// however wide) the compiler vectorizes, and 16 short sums instead of one sequential fp32 sum
// of tens of thousands of terms where it does not (that was 8.4e-5 of SmolLM2's NLL on AVX2).
constexpr int kLanes = 16;

float lanes_total(const float* lane) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += lane[l];
  return s;
}

// sum_j exp(x[j] - mx), j < n.
float sum_exp(const float* x, int64_t n, float mx) {
  float lane[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) lane[l] += exp_f32(x[j + l] - mx);
  }
  for (int l = 0; j + l < n; ++l) lane[l] += exp_f32(x[j + l] - mx);
  return lanes_total(lane);
}

// sum over x[j] < mx of exp(x[j] - mx), and how many x[j] are not below mx.
float sum_exp_below(const float* x, int64_t n, float mx, int64_t& at_max) {
  float lane[kLanes] = {};
  int32_t at[kLanes] = {};
  int64_t j = 0;
  auto one = [&](int l, float v) {
    const bool below = v < mx;
    const float e = exp_f32(v - mx);
    lane[l] += below ? e : 0.0f;
    at[l] += below ? 0 : 1;
  };
  for (; j + kLanes <= n; j += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) one(l, x[j + l]);
  }
  for (int l = 0; j + l < n; ++l) one(l, x[j + l]);
  at_max = 0;
  for (int l = 0; l < kLanes; ++l) at_max += at[l];
  return lanes_total(lane);
}

}  // namespace

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
    int64_t at_max = 0;
    const float rest = sum_exp_below(lr, vocab, mx, at_max);
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
    const float s = sum_exp(lr, n, mx);
    // exp(-inf - mx) = 0 on the first chunk.
    sum[r] = sum[r] * exp_f32(max[r] - mx) + s;
    max[r] = mx;
    if (t >= v0 && t < v0 + n) target[r] = lr[t - v0];
  }
}

}  // namespace zof::cpu
