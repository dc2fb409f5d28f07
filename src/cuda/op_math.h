// The per-element arithmetic of the CUDA kernels as __host__ __device__ functions, so that the
// CPU unit tests (tests/unit/test_cuda_math.cpp) check the same formulas CI cannot run on a GPU.
// Plain C++: no CUDA header; ZOF_HD comes from philox.h. Library calls (expf, erfcf, sqrtf) are
// the accurate ones on both sides (never --use_fast_math), so host and device agree to a few ulp.
#pragma once
#include <math.h>

#include <cstdint>

#include "util/philox.h"

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
// gelu_tanh(g) * up (Gemma's GeGLU): the GELU exactly as gelu_tanh above, then the product.
ZOF_HD float gelu_tanh_mul(float g, float up) { return gelu_tanh(g) * up; }
// Soft-capping (Gemma 2's attention scores and final logits): cap tanh(x / cap), cap > 0.
ZOF_HD float softcap(float x, float cap) { return cap * tanhf(x / cap); }

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
// theta^(-2i/head_dim) rounded to fp32 (the default table, ModelConfig::rope_inv_freq, which the
// kernels read), and the fp32 angle float(pos) * inv_freq, exactly as Hugging Face and the CPU
// backends form them (see backend.h).
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

// ---- tangents (forward-mode AD, Backend's *_jvp ops) -------------------------------------------
// silu'(g) dg up + silu(g) dup, silu'(g) = s (1 + g (1 - s)), s = sigmoid(g) = 1 / (1 + e^-g)
// (e^-g = inf for g < -88 gives s = 0 and a zero slope, not NaN).
ZOF_HD float silu_mul_jvp(float g, float dg, float up, float dup) {
  const float s = 1.0f / (1.0f + expf(-g));
  return s * (1.0f + g * (1.0f - s)) * dg * up + g * s * dup;
}
// d/dx of gelu_tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 0.044715 x^2), t = tanh(u).
// Past |x| = 10 the slope is 1 or 0 to fp32 (and x^3 could overflow into inf * 0).
ZOF_HD float gelu_tanh_slope(float x) {
  if (x > 10.0f) return 1.0f;
  if (x < -10.0f) return 0.0f;
  const float c = 0.7978845608028654f, a = 0.044715f;
  const float t = tanhf(c * (x + a * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * a * x * x);
}
// d/dx of gelu_erf: 0.5 erfc(-x / sqrt 2) + x e^(-x^2/2) / sqrt(2 pi).
ZOF_HD float gelu_erf_slope(float x) {
  return 0.5f * erfcf(-x * 0.70710678118654752f) + x * expf(-0.5f * x * x) * 0.3989422804014327f;
}
// torch's relu gradient: 0 at 0 (and for NaN).
ZOF_HD float relu_slope(float x) { return x > 0.0f ? 1.0f : 0.0f; }
// gelu_tanh'(g) dg up + gelu_tanh(g) dup.
ZOF_HD float gelu_tanh_mul_jvp(float g, float dg, float up, float dup) {
  return gelu_tanh_slope(g) * dg * up + gelu_tanh(g) * dup;
}
// d/dx of softcap at x: 1 - tanh(x / cap)^2 (0 far out, where tanh rounds to +-1).
ZOF_HD float softcap_slope(float x, float cap) {
  const float t = tanhf(x / cap);
  return 1.0f - t * t;
}
// A soft-capped score and its tangent from the raw scaled score x and its tangent dx (the
// attention tangent with a softcap): x <- cap tanh(x / cap), dx <- (1 - tanh^2) dx.
ZOF_HD void softcap_with_tangent(float& x, float& dx, float cap) {
  const float t = tanhf(x / cap);
  x = cap * t;
  dx = (1.0f - t * t) * dx;
}

// RMSNorm: r = rms_inv, dr = -r^3 mean(x dx) from the row's sum of x dx;
// dy = (dx r + x dr) w + x r dw (w is w + w_offset, formed in fp32, for Gemma's RMSNorm).
ZOF_HD float rms_norm_dinv(float inv, float sum_xdx, int64_t dim) {
  return -inv * inv * inv * (sum_xdx / (float)dim);
}
ZOF_HD float norm_jvp(float c, float dc, float inv, float dinv, float w, float dw) {
  return (dc * inv + c * dinv) * w + c * inv * dw;
}
// LayerNorm: with c = x - mean, dc = dx - dmean, r = (var + eps)^-1/2 and the row's sum of
// c dc, dr = -r^3 mean(c dc); the element is norm_jvp(c, dc, ...) + db.
ZOF_HD float layer_norm_dinv(float inv, float sum_cdc, int64_t dim) {
  return -inv * inv * inv * (sum_cdc / (float)dim);
}

// Attention tangent, per key j of a query with softmax weight p_j: dp_j = p_j (ds_j - sbar),
// sbar = sum_l p_l ds_l, and the output tangent gathers p_j dv_j + dp_j v_j. Two passes over the
// keys: the first finds the max, the sum l and the weighted sum of ds (online, as the primal), the
// second adds each key's terms with the final weights, so no cancellation between passes.
ZOF_HD float attn_jvp_term(float p, float ds, float sbar, float v, float dv) {
  return p * (dv + (ds - sbar) * v);
}

// Cross-entropy: dnll = sum_v softmax_v dl_v - dl_target = dot / sum - dl_target, with
// sum = sum e^(x - max) and dot = sum e^(x - max) dl.
ZOF_HD float ce_jvp(float sum, float dot, float dl_target) { return dot / sum - dl_target; }

}  // namespace zof::opmath
