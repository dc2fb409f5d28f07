// The per-element arithmetic of the CUDA kernels as __host__ __device__ functions, so that the
// CPU unit tests (tests/unit/test_cuda_math.cpp) check the same formulas CI cannot run on a GPU.
// Plain C++: no CUDA header; ZOF_HD comes from philox.h. Library calls (expf, erfcf, sqrtf) are
// the accurate ones on both sides (never --use_fast_math), so host and device agree to a few ulp.
#pragma once
#include <math.h>

#include <cstdint>

#include "zof/philox.h"

namespace zof::opmath {

ZOF_HD float neg_inf() { return -INFINITY; }

// ---- activations ---------------------------------------------------------------------------
// silu(g) * up. g / (1 + e^-g): e^-g overflows to inf for g < -88 and the quotient is -0.
ZOF_HD float silu_mul(float g, float up) { return g / (1.0f + expf(-g)) * up; }
// tanh GELU as x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): one exp, no cancellation.
ZOF_HD float gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}
// erf GELU as 0.5 x erfc(-x / sqrt 2): the negative tail keeps its digits (as the reference).
ZOF_HD float gelu_erf(float x) { return 0.5f * x * erfcf(-x * 0.70710678118654752f); }
// NaN stays NaN, as in torch.
ZOF_HD float relu(float x) { return x < 0.0f ? 0.0f : x; }

// ---- normalizations ----------------------------------------------------------------------------
// 1 / sqrt(mean(x^2) + eps) from the row's sum of squares, as the CPU backend forms it.
ZOF_HD float rms_inv(float sum_sq, int64_t dim, float eps) {
  return 1.0f / sqrtf(sum_sq / (float)dim + eps);
}

// Welford's running mean and sum of squared deviations (m2), mergeable across threads (Chan et
// al.): a row with a large mean (30) keeps its variance, where E[x^2] - mean^2 cancels.
struct Welford {
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;  // n is exact up to 2^24 elements
};
ZOF_HD void welford_push(Welford& a, float x) {
  a.n += 1.0f;
  const float d = x - a.mean;
  a.mean += d / a.n;
  a.m2 += d * (x - a.mean);
}
ZOF_HD Welford welford_merge(const Welford& a, const Welford& b) {
  if (b.n == 0.0f) return a;
  if (a.n == 0.0f) return b;
  Welford r;
  r.n = a.n + b.n;
  const float d = b.mean - a.mean, fb = b.n / r.n;
  r.mean = a.mean + d * fb;
  r.m2 = a.m2 + b.m2 + d * d * a.n * fb;
  return r;
}
// 1 / sqrt(biased variance + eps).
ZOF_HD float layer_norm_inv(const Welford& w, float eps) { return 1.0f / sqrtf(w.m2 / w.n + eps); }

// ---- rotary embedding ---------------------------------------------------------------------------
// theta^(-2i/head_dim) rounded to fp32, and the fp32 angle float(pos) * inv_freq, exactly as
// Hugging Face and the CPU backends form them (see backend.h).
ZOF_HD float rope_inv_freq(int64_t i, int64_t head_dim, float theta) {
  return (float)(1.0 / pow((double)theta, (double)(2 * i) / (double)head_dim));
}
ZOF_HD float rope_angle(int32_t pos, float inv_freq) { return (float)pos * inv_freq; }
// Rotates the pair (a, b) = (x[i], x[i + head_dim/2]) by the angle with cosine c and sine s.
ZOF_HD void rope_rotate(float& a, float& b, float c, float s) {
  const float a0 = a, b0 = b;
  a = a0 * c - b0 * s;
  b = b0 * c + a0 * s;
}

// ---- online softmax (flash attention) ------------------------------------------------------------
// Running max m and sum l of e^(s - m) over the keys seen so far. Merging in a block with max
// m_b (of its raw scores): the old sum and the accumulated outputs are scaled by `correction`,
// the block's exponentials are taken against `shift`. A row that has seen only masked keys
// keeps m = -inf and shift 0, so exp(-inf - 0) = 0 and nothing is NaN.
struct SoftmaxStep {
  float shift, correction;
};
ZOF_HD SoftmaxStep softmax_advance(float& m, float m_b) {
  const float m_new = m > m_b ? m : m_b;
  SoftmaxStep st;
  st.shift = m_new == neg_inf() ? 0.0f : m_new;
  st.correction = expf(m - st.shift);
  m = m_new;
  return st;
}
// Merges two finished partial states (m1, l1) and (m2, l2) of one row (split-K attention):
// returns the merged (m, l) and the factors the two partial outputs are scaled by.
struct SoftmaxState {
  float m = -INFINITY, l = 0.0f;
};
ZOF_HD SoftmaxState softmax_merge(const SoftmaxState& a, const SoftmaxState& b, float& fa,
                                  float& fb) {
  SoftmaxState r;
  r.m = a.m > b.m ? a.m : b.m;
  const float shift = r.m == neg_inf() ? 0.0f : r.m;
  fa = expf(a.m - shift);
  fb = expf(b.m - shift);
  r.l = a.l * fa + b.l * fb;
  return r;
}
// The output of a row from its accumulated sum l: a query that sees no key gets zeros.
ZOF_HD float softmax_inv_sum(float l) { return l > 0.0f ? 1.0f / l : 0.0f; }

// ---- cross-entropy ----------------------------------------------------------------------------------
// Per element: contributes e^(x - mx) to `rest` if below the row max, else counts one maximum.
ZOF_HD void ce_accumulate(float x, float mx, float& rest, float& at_max) {
  if (x < mx)
    rest += expf(x - mx);
  else
    at_max += 1.0f;
}
// nll = logsumexp - x_t = (mx - x_t) + log1p(rest + (at_max - 1)): one maximum contributes
// exactly 1 and is taken out, so a confident row's tiny loss keeps its digits (as the CPU).
ZOF_HD float ce_nll(float mx, float rest, float at_max, float x_target) {
  return (mx - x_target) + log1pf(rest + (at_max - 1.0f));
}

}  // namespace zof::opmath
