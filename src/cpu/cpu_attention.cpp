// The CPU backend's causal grouped-query attention, flash-attention style: a work item is up to
// 16 rows (query position, query head) that share one kv head; it walks their visible keys in
// blocks with an online softmax, scoring a block as a small GEMM vectorized across the rows.
// Items of a few rows (decoding) go one row at a time instead. Buffers: per-thread tiles, no T x T.
// bf16 (Backend::attention's DType): the same walk on bf16 inputs, q * scale, k, v and the
// probabilities rounded to nearest even, products summed in fp32 (vdpbf16ps where the CPU has
// AVX512_BF16: two products a lane per instruction); each thread rounds the keys and values of
// the kv head it works on as its items reach them, inside the one parallel region.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/vec_math.h"
#include "zof/dtype.h"
#include "zof/error.h"

namespace zof::cpu {

namespace {

constexpr int64_t kRows = 16;      // rows per work item, one SIMD vector across them
constexpr int64_t kKeyBlock = 64;  // keys scored at once
constexpr int64_t kFewRows = 4;    // items of at most this many rows go one row at a time
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 16 floats: one GCC/Clang vector (a zmm) with AVX-512; without, two native 8-float vectors
// (ymm), since GCC lowers a 64-byte vector type on AVX2 through the stack (the scores and the
// accumulation ran at a fifth of the rate). Only the operations the tile steps use.
#if defined(__AVX512F__)
typedef float v16 __attribute__((vector_size(64)));
#else
typedef float v8 __attribute__((vector_size(32)));
struct v16 {
  v8 lo, hi;
};
inline v16 operator*(float s, v16 v) { return {s * v.lo, s * v.hi}; }
inline v16 operator*(v16 a, v16 b) { return {a.lo * b.lo, a.hi * b.hi}; }
inline v16& operator+=(v16& a, v16 b) {
  a.lo += b.lo;
  a.hi += b.hi;
  return a;
}
#endif
#if defined(__AVX512F__)
inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }
#else
// Half by half: one 32-byte copy each, so a vector is loaded straight into its register (a
// 64-byte copy went through 16-byte stack moves that the next 32-byte read could not forward).
inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline v16 load16(const float* p) { return {load8(p), load8(p + 8)}; }
inline void store16(float* p, v16 v) {
  std::memcpy(p, &v.lo, sizeof(v.lo));
  std::memcpy(p + 8, &v.hi, sizeof(v.hi));
}
#endif

// Per-thread tiles, allocated once per call.
struct Tiles {
  std::vector<float> qt;     // (D, kRows): scaled queries, transposed so a row of it is a vector
  std::vector<float> s;      // (kKeyBlock, kRows): scores, then probabilities
  std::vector<float> o;      // (D, kRows): unnormalized outputs, transposed like qt
  std::vector<int64_t> lim;  // (kRows): the last key each row sees (causal), -1: none
  std::vector<int64_t> lo;   // (kRows): the first key each row sees (a sliding window), else 0
  float m[kRows], l[kRows];  // running max and sum of exp per row
};

// One row (query position i of head h) at a time, vectorized along D: for items with few rows
// (decoding one token), where a 16-row tile would be mostly padding. acc holds D floats.
// Keys first_key .. n_keys-1; softcap > 0 caps the scores (backend.h).
void attend_row(const float* qi, const float* kb, const float* vb, const uint8_t* mask,
                int64_t kv_stride, int64_t first_key, int64_t n_keys, int64_t D, float scale,
                float softcap, float* acc, float* oi) {
  float p[kKeyBlock];
  float m = kNegInf, l = 0.0f;
  for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int64_t j0 = first_key; j0 < n_keys; j0 += kKeyBlock) {
    const int64_t len = std::min(kKeyBlock, n_keys - j0);
    float block_max = kNegInf;
    for (int64_t jj = 0; jj < len; ++jj) {
      p[jj] = kNegInf;
      if (mask && mask[j0 + jj] == 0) continue;
      const float* kj = kb + (j0 + jj) * kv_stride;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
      p[jj] = dot * scale;
      if (softcap > 0.0f) p[jj] = softcap * tanh_f32(p[jj] / softcap);
      block_max = std::max(block_max, p[jj]);
    }
    if (block_max == kNegInf) continue;  // the whole block is masked
    if (block_max > m) {
      const float correction = exp_f32(m - block_max);  // 0 on the first visible block
      l *= correction;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] *= correction;
      m = block_max;
    }
    float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
    for (int64_t jj = 0; jj < len; ++jj) {
      p[jj] = exp_f32(p[jj] - m);
      block_sum += p[jj];
    }
    l += block_sum;
    for (int64_t jj = 0; jj < len; ++jj) {
      if (mask && mask[j0 + jj] == 0) continue;
      const float pj = p[jj];
      const float* vj = vb + (j0 + jj) * kv_stride;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[d] += pj * vj[d];
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // a query that sees no key gets zeros
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) oi[d] = acc[d] * inv;
}

// One item's tile steps, in the order the item runs them for each block of keys j0 .. j0+len-1.
// kb/vb: the item's kv head (key j at kb + j * kv_stride).

// s(jj, r) = q_r . k_j, four keys at a time to hide the FMA latency (masked keys are scored too
// and overwritten by hide_keys: simpler than compacting the block).
inline void score_block(Tiles& t, const float* kb, int64_t kv_stride, int64_t j0, int64_t len,
                        int64_t D) {
  int64_t jj = 0;
  for (; jj + 4 <= len; jj += 4) {
    const float* k0 = kb + (j0 + jj) * kv_stride;
    const float *k1 = k0 + kv_stride, *k2 = k1 + kv_stride, *k3 = k2 + kv_stride;
    v16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int64_t d = 0; d < D; ++d) {
      const v16 qd = load16(&t.qt[d * kRows]);
      a0 += k0[d] * qd;
      a1 += k1[d] * qd;
      a2 += k2[d] * qd;
      a3 += k3[d] * qd;
    }
    store16(&t.s[(jj + 0) * kRows], a0);
    store16(&t.s[(jj + 1) * kRows], a1);
    store16(&t.s[(jj + 2) * kRows], a2);
    store16(&t.s[(jj + 3) * kRows], a3);
  }
  for (; jj < len; ++jj) {
    const float* kj = kb + (j0 + jj) * kv_stride;
    v16 a = {};
    for (int64_t d = 0; d < D; ++d) a += kj[d] * load16(&t.qt[d * kRows]);
    store16(&t.s[jj * kRows], a);
  }
}

// Hide masked keys and, past all_see, the keys after each row's causal limit; before all_lo,
// the keys before each row's window.
inline void hide_keys(Tiles& t, const uint8_t* mask, int64_t j0, int64_t len, int64_t all_see,
                      int64_t all_lo) {
  for (int64_t jj = 0; jj < len; ++jj) {
    const int64_t j = j0 + jj;
    float* sj = &t.s[jj * kRows];
    if (mask && mask[j] == 0) {
      std::fill(sj, sj + kRows, kNegInf);
      continue;
    }
    if (j > all_see) {
      for (int64_t rr = 0; rr < kRows; ++rr)
        if (j > t.lim[rr]) sj[rr] = kNegInf;
    }
    if (j < all_lo) {
      for (int64_t rr = 0; rr < kRows; ++rr)
        if (j < t.lo[rr]) sj[rr] = kNegInf;
    }
  }
}

// Gemma 2's attention soft-capping of a block's scores: s = cap tanh(s / cap).
inline void cap_scores(Tiles& t, int64_t len, float cap) {
  for (int64_t i = 0; i < len * kRows; ++i) t.s[i] = cap * tanh_f32(t.s[i] / cap);
}

// The online softmax over the block, all rows at once: scores become exp(s - running max),
// the running sums are updated, and correction[r] rescales what the row accumulated before.
inline void softmax_block(Tiles& t, int64_t len, float* correction) {
  float block_max[kRows], shift[kRows], block_sum[kRows];
  for (int64_t rr = 0; rr < kRows; ++rr) block_max[rr] = kNegInf;
  for (int64_t jj = 0; jj < len; ++jj) {
#pragma omp simd
    for (int64_t rr = 0; rr < kRows; ++rr)
      block_max[rr] = std::max(block_max[rr], t.s[jj * kRows + rr]);
  }
#pragma omp simd
  for (int64_t rr = 0; rr < kRows; ++rr) {
    const float m_new = std::max(t.m[rr], block_max[rr]);
    shift[rr] = m_new == kNegInf ? 0.0f : m_new;  // a row with no key yet: exp(-inf) = 0
    correction[rr] = exp_f32(t.m[rr] - shift[rr]);
    t.m[rr] = m_new;
    block_sum[rr] = 0.0f;
  }
  for (int64_t jj = 0; jj < len; ++jj) {
    float* sj = &t.s[jj * kRows];
#pragma omp simd
    for (int64_t rr = 0; rr < kRows; ++rr) {
      sj[rr] = exp_f32(sj[rr] - shift[rr]);
      block_sum[rr] += sj[rr];
    }
  }
  for (int64_t rr = 0; rr < kRows; ++rr) t.l[rr] = t.l[rr] * correction[rr] + block_sum[rr];
}

// o(d, r) = o(d, r) * correction_r + sum_j v_j[d] p(j, r), four d at a time. Masked keys are
// skipped, not multiplied by 0, so garbage in a padding slot's v cannot leak in.
inline void accumulate_block(Tiles& t, const float* vb, const uint8_t* mask, int64_t kv_stride,
                             int64_t j0, int64_t len, int64_t D, const float* correction) {
  const v16 corr = load16(correction);
  int64_t d = 0;
  for (; d + 4 <= D; d += 4) {
    v16 a0 = load16(&t.o[(d + 0) * kRows]) * corr, a1 = load16(&t.o[(d + 1) * kRows]) * corr;
    v16 a2 = load16(&t.o[(d + 2) * kRows]) * corr, a3 = load16(&t.o[(d + 3) * kRows]) * corr;
    for (int64_t jj = 0; jj < len; ++jj) {
      if (mask && mask[j0 + jj] == 0) continue;
      const v16 p = load16(&t.s[jj * kRows]);
      const float* vj = vb + (j0 + jj) * kv_stride + d;
      a0 += vj[0] * p;
      a1 += vj[1] * p;
      a2 += vj[2] * p;
      a3 += vj[3] * p;
    }
    store16(&t.o[(d + 0) * kRows], a0);
    store16(&t.o[(d + 1) * kRows], a1);
    store16(&t.o[(d + 2) * kRows], a2);
    store16(&t.o[(d + 3) * kRows], a3);
  }
  for (; d < D; ++d) {
    v16 a = load16(&t.o[d * kRows]) * corr;
    for (int64_t jj = 0; jj < len; ++jj) {
      if (mask && mask[j0 + jj] == 0) continue;
      a += vb[(j0 + jj) * kv_stride + d] * load16(&t.s[jj * kRows]);
    }
    store16(&t.o[d * kRows], a);
  }
}

// ---- bf16 ------------------------------------------------------------------------------------
// One kv head's keys and values in bf16, a thread's own, filled as its items reach them (Tk: the
// longest sequence of the call; rows past a shorter sequence's own keys are left over from
// another and never read as keys): kh (Tk + 8, D2) the keys with D2 = D rounded up to even (a zero pad), so a key's elements d, d+1
// are one 32-bit word, and eight keys after the last for score_block_bf16 to read past; vp
// (Tk2 / 2, D, 2) with Tk2 = Tk rounded up to even, the values in pairs of keys: keys 2jp and
// 2jp + 1 of one d are one word. A masked key's values (and the pad) are 0: its probability is
// 0, and 0 times whatever a padding slot held must not leak in as a NaN. Rounding them where they
// are used, rather than all heads up front, keeps the call to one parallel region (a region of
// its own cost a scheduler tick whenever a thread was preempted) and the rounded rows in cache;
// a thread rounds each key of a head once as long as its items of that head come in order.
struct Bf16Kv {
  int64_t D2 = 0, Tk2 = 0;
  int64_t b = -1, hk = -1, lo = 0, hi = 0;  // keys [lo, hi) of (b, hk) are in kh and vp
  std::vector<uint16_t> kh, vp;
  Bf16Kv(int64_t Tk, int64_t D) : D2((D + 1) / 2 * 2), Tk2((Tk + 1) / 2 * 2) {
    kh.assign(size_t((Tk + 8) * D2), 0);
    vp.assign(size_t(Tk2 * D), 0);
  }
  const uint16_t* key(int64_t j) const { return kh.data() + j * D2; }
  const uint16_t* values() const { return vp.data(); }
};

// y(n) = bf16(a * x(n)), nearest even.
inline void to_bf16(const float* x, float a, uint16_t* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  const __m512 va = _mm512_set1_ps(a);
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(va, _mm512_loadu_ps(x + i))));
#endif
  for (; i < n; ++i) y[i] = f32_to_bf16(a * x[i]);
}

#if defined(__AVX512BF16__)
// The two halves of a converted pair of 16-float vectors interleaved: lanes (a_i, b_i).
inline __m512i interleave_pairs(__m512 a, __m512 b) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}
#endif

// Words (a[d], b[d]) for d < n at y (2n uint16): two keys' values, or a row's probabilities.
inline void pairs_bf16(const float* a, const float* b, uint16_t* y, int64_t n) {
  int64_t d = 0;
#if defined(__AVX512BF16__)
  for (; d < n; d += 16) {
    const __mmask16 m = n - d >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - d)) - 1);
    const __m512 va = a ? _mm512_maskz_loadu_ps(m, a + d) : _mm512_setzero_ps();
    const __m512 vb = b ? _mm512_maskz_loadu_ps(m, b + d) : _mm512_setzero_ps();
    _mm512_mask_storeu_epi32(y + 2 * d, m, interleave_pairs(va, vb));
  }
#endif
  for (; d < n; ++d) {
    y[2 * d] = a ? f32_to_bf16(a[d]) : 0;
    y[2 * d + 1] = b ? f32_to_bf16(b[d]) : 0;
  }
}

// Makes keys [first, last) of (sequence b, kv head hk) (first even; last rounded up to even)
// ready in kv: k and v the sequence's own (Tk, Hkv, D), key_mask its own (Tk) or null.
void fill_kv(Bf16Kv& kv, const float* k, const float* v, const uint8_t* key_mask, int64_t b,
             int64_t hk, int64_t Tk, int64_t Hkv, int64_t D, int64_t first, int64_t last) {
  if (kv.b != b || kv.hk != hk || first < kv.lo || first > kv.hi) {
    kv.b = b, kv.hk = hk, kv.lo = first, kv.hi = first;
  }
  last = (last + 1) / 2 * 2;  // whole pairs of keys
  if (last <= kv.hi) return;
  auto row = [&](int64_t j) { return (j * Hkv + hk) * D; };
  for (int64_t j = kv.hi; j < std::min(last, Tk); ++j)
    to_bf16(k + row(j), 1.0f, kv.kh.data() + j * kv.D2, D);
  auto seen = [&](int64_t j) { return j < Tk && (!key_mask || key_mask[j] != 0); };
  for (int64_t jp = kv.hi / 2; jp < last / 2; ++jp)
    pairs_bf16(seen(2 * jp) ? v + row(2 * jp) : nullptr,
               seen(2 * jp + 1) ? v + row(2 * jp + 1) : nullptr, kv.vp.data() + jp * 2 * D, D);
  kv.hi = last;
}

// attend_row on bf16 inputs (decoding): qi already scaled and rounded (fp32 values), keys and
// values from kv; each probability rounded before it meets the values.
void attend_row_bf16(const float* qi, const Bf16Kv& kv, const uint8_t* mask, int64_t first_key,
                     int64_t n_keys, int64_t D, float softcap, float* acc, float* oi) {
  float p[kKeyBlock];
  float m = kNegInf, l = 0.0f;
  const uint16_t* vp = kv.values();
  for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
  for (int64_t j0 = first_key; j0 < n_keys; j0 += kKeyBlock) {
    const int64_t len = std::min(kKeyBlock, n_keys - j0);
    float block_max = kNegInf;
    for (int64_t jj = 0; jj < len; ++jj) {
      p[jj] = kNegInf;
      if (mask && mask[j0 + jj] == 0) continue;
      const uint16_t* kj = kv.key(j0 + jj);
      float dot = 0.0f;
      for (int64_t d = 0; d < D; ++d) dot += qi[d] * bf16_to_f32(kj[d]);
      p[jj] = softcap > 0.0f ? softcap * tanh_f32(dot / softcap) : dot;
      block_max = std::max(block_max, p[jj]);
    }
    if (block_max == kNegInf) continue;
    if (block_max > m) {
      const float correction = exp_f32(m - block_max);
      l *= correction;
      for (int64_t d = 0; d < D; ++d) acc[d] *= correction;
      m = block_max;
    }
    for (int64_t jj = 0; jj < len; ++jj) {
      p[jj] = exp_f32(p[jj] - m);
      l += p[jj];
    }
    for (int64_t jj = 0; jj < len; ++jj) {
      if (mask && mask[j0 + jj] == 0) continue;
      const int64_t j = j0 + jj;
      const uint16_t* vj = vp + (j / 2) * 2 * D + (j & 1);
      const float pj = bf16_round(p[jj]);
      for (int64_t d = 0; d < D; ++d) acc[d] += pj * bf16_to_f32(vj[2 * d]);
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t d = 0; d < D; ++d) oi[d] = acc[d] * inv;
}

// A tile's bf16 operands: qp (D2 / 2, kRows) words, the rows' scaled queries in pairs of d; pp
// (kKeyBlock / 2, kRows) words, the block's probabilities in pairs of keys; ob (kRows, D), the
// rows' unnormalized outputs in fp32.
struct Bf16Tiles {
  std::vector<uint32_t> qp;
  std::vector<uint16_t> pp;  // written as pairs of bf16, read as words (word())
  std::vector<float> ob;
};

inline uint32_t word(const uint16_t* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// The rows' queries, scaled and rounded, as words of pairs of d; padding rows are 0. qh: room
// for one row of D2 bf16 values (the pad stays 0).
inline void pack_queries(Bf16Tiles& bt, const float* const* rows, int64_t n_rows, int64_t D,
                         int64_t D2, float scale, uint16_t* qh) {
  if (n_rows < kRows) std::fill(bt.qp.begin(), bt.qp.end(), 0u);
  for (int64_t rr = 0; rr < n_rows; ++rr) {
    to_bf16(rows[rr], scale, qh, D);
    for (int64_t dp = 0; dp < D2 / 2; ++dp) bt.qp[dp * kRows + rr] = word(qh + 2 * dp);
  }
}

// s(jj, r) = q_r . k_j over the pairs of d (vdpbf16ps: a lane adds both products of its pair).
inline void score_block_bf16(Tiles& t, const Bf16Tiles& bt, const Bf16Kv& kv, int64_t j0,
                             int64_t len) {
  const int64_t pairs = kv.D2 / 2;
#if defined(__AVX512BF16__)
  const int64_t ks = kv.D2;  // between consecutive keys
  // Eight keys at a time: eight chains hide vdpbf16ps's latency. A block's last eight may run
  // past len (into keys not filled for this item, or past the last key: kh has eight keys
  // after it); their scores land in t.s past len (still inside its kKeyBlock rows), which
  // nothing reads.
  for (int64_t jj = 0; jj < len; jj += 8) {
    const uint16_t* k0 = kv.key(j0 + jj);
    __m512 a[8];
    for (int e = 0; e < 8; ++e) a[e] = _mm512_setzero_ps();
    for (int64_t dp = 0; dp < pairs; ++dp) {
      const __m512bh qd = (__m512bh)_mm512_loadu_si512(&bt.qp[dp * kRows]);
      const uint16_t* kd = k0 + 2 * dp;
      for (int e = 0; e < 8; ++e)
        a[e] = _mm512_dpbf16_ps(a[e], qd, (__m512bh)_mm512_set1_epi32((int)word(kd + e * ks)));
    }
    for (int e = 0; e < 8; ++e) _mm512_storeu_ps(&t.s[(jj + e) * kRows], a[e]);
  }
#else
  for (int64_t jj = 0; jj < len; ++jj) {
    const uint16_t* kj = kv.key(j0 + jj);
    for (int64_t rr = 0; rr < kRows; ++rr) {
      float a = 0.0f;
      for (int64_t dp = 0; dp < pairs; ++dp) {
        const uint32_t w = bt.qp[dp * kRows + rr];
        a += bf16_to_f32(uint16_t(w)) * bf16_to_f32(kj[2 * dp]) +
             bf16_to_f32(uint16_t(w >> 16)) * bf16_to_f32(kj[2 * dp + 1]);
      }
      t.s[jj * kRows + rr] = a;
    }
  }
#endif
}

#if defined(__AVX512BF16__)
// Rows r0 and r1 of ob, d in [d0, d0 + 16 NV) (the last vector masked at D), through the block's
// pairs of keys: 2 NV accumulators in registers.
template <int NV>
inline void accumulate_rows(Bf16Tiles& bt, const uint16_t* v0, int64_t pairs, int64_t D,
                            int64_t d0, int64_t r0, int64_t r1, const float* correction) {
  __m512 a0[NV], a1[NV];
  __mmask16 m[NV];
  for (int c = 0; c < NV; ++c) {
    const int64_t rem = D - d0 - 16 * c;
    m[c] = rem >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rem) - 1);
    a0[c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m[c], &bt.ob[r0 * D + d0 + 16 * c]),
                          _mm512_set1_ps(correction[r0]));
    a1[c] = _mm512_mul_ps(_mm512_maskz_loadu_ps(m[c], &bt.ob[r1 * D + d0 + 16 * c]),
                          _mm512_set1_ps(correction[r1]));
  }
  for (int64_t jp = 0; jp < pairs; ++jp) {
    const uint16_t* vj = v0 + (jp * D + d0) * 2;
    const __m512bh p0 = (__m512bh)_mm512_set1_epi32((int)word(&bt.pp[(jp * kRows + r0) * 2]));
    const __m512bh p1 = (__m512bh)_mm512_set1_epi32((int)word(&bt.pp[(jp * kRows + r1) * 2]));
    for (int c = 0; c < NV; ++c) {
      const __m512bh vv = (__m512bh)_mm512_maskz_loadu_epi32(m[c], vj + 32 * c);
      a0[c] = _mm512_dpbf16_ps(a0[c], vv, p0);
      a1[c] = _mm512_dpbf16_ps(a1[c], vv, p1);
    }
  }
  for (int c = 0; c < NV; ++c) {
    _mm512_mask_storeu_ps(&bt.ob[r0 * D + d0 + 16 * c], m[c], a0[c]);
    _mm512_mask_storeu_ps(&bt.ob[r1 * D + d0 + 16 * c], m[c], a1[c]);  // r1 == r0: the same
  }
}
#endif

// ob(r, :) = ob(r, :) * correction_r + sum_j p(j, r) v_j, the probabilities rounded to bf16 and
// taken in pairs of keys (j0 even) against the paired values, the n_rows real rows.
inline void accumulate_block_bf16(Tiles& t, Bf16Tiles& bt, const uint16_t* vp, int64_t j0,
                                  int64_t len, int64_t D, int64_t n_rows,
                                  const float* correction) {
  const int64_t pairs = (len + 1) / 2;
  for (int64_t jp = 0; jp < pairs; ++jp) {
    const int64_t j = 2 * jp;
    pairs_bf16(&t.s[j * kRows], j + 1 < len ? &t.s[(j + 1) * kRows] : nullptr,
               &bt.pp[jp * kRows * 2], kRows);
  }
  const uint16_t* v0 = vp + j0 * D;  // the block's first pair
#if defined(__AVX512BF16__)
  // Two rows at once, up to four vectors of 16 d each: eight chains, each V load used twice.
  for (int64_t r0 = 0; r0 < n_rows; r0 += 2) {
    const int64_t r1 = std::min<int64_t>(r0 + 1, n_rows - 1);  // one row left: done twice
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
      const int64_t nv = std::min<int64_t>(4, (D - d0 + 15) / 16);
      switch (nv) {
        case 4: accumulate_rows<4>(bt, v0, pairs, D, d0, r0, r1, correction); break;
        case 3: accumulate_rows<3>(bt, v0, pairs, D, d0, r0, r1, correction); break;
        case 2: accumulate_rows<2>(bt, v0, pairs, D, d0, r0, r1, correction); break;
        default: accumulate_rows<1>(bt, v0, pairs, D, d0, r0, r1, correction); break;
      }
    }
  }
#else
  for (int64_t rr = 0; rr < n_rows; ++rr) {
    float* o = &bt.ob[rr * D];
    for (int64_t d = 0; d < D; ++d) o[d] *= correction[rr];
    for (int64_t jp = 0; jp < pairs; ++jp) {
      const uint32_t w = word(&bt.pp[(jp * kRows + rr) * 2]);
      const float p0 = bf16_to_f32(uint16_t(w)), p1 = bf16_to_f32(uint16_t(w >> 16));
      const uint16_t* vj = v0 + jp * 2 * D;
      for (int64_t d = 0; d < D; ++d)
        o[d] += p0 * bf16_to_f32(vj[2 * d]) + p1 * bf16_to_f32(vj[2 * d + 1]);
    }
  }
#endif
}

// One sequence of a call: its queries (Tq, H, D) and output, its keys and values (Tk, Hkv, D),
// its key mask (Tk) or null, and the position of its first query.
struct Seq {
  const float *q, *k, *v;
  float* out;
  const uint8_t* mask;
  int64_t Tq, Tk, q_offset;
};

// The attention of every sequence in seqs. A work item is (sequence, kv head, block of rows), and
// what an item computes depends on its sequence alone, so a sequence has the same bits whatever
// the call holds besides it and however the items fall to threads.
void attend(const std::vector<Seq>& seqs, int64_t H, int64_t Hkv, int64_t D, float scale,
            int64_t window, float softcap, int threads, DType dtype) {
  ZOF_CHECK(dtype == DType::F32 || dtype == DType::BF16,
            std::string("attention computes on fp32 or bf16 inputs, not ") + dtype_name(dtype));
  const bool bf16 = dtype == DType::BF16;
  ZOF_ASSERT(Hkv > 0 && H % Hkv == 0);
  const int64_t group = H / Hkv;
  // Row r of kv head hk is query i = r / group of head hk * group + r % group: for one position
  // the group's query heads are adjacent in memory, and they all read the same keys.
  const int64_t kv_stride = Hkv * D;  // between consecutive keys of one head
  const int64_t n_seqs = (int64_t)seqs.size();
  std::vector<int64_t> first_item(size_t(n_seqs + 1), 0);  // sequence b's items start here
  int64_t work = 0, max_tk = 0;
  for (int64_t b = 0; b < n_seqs; ++b) {
    const Seq& s = seqs[size_t(b)];
    const int64_t row_blocks = (s.Tq * group + kRows - 1) / kRows;
    first_item[size_t(b + 1)] = first_item[size_t(b)] + Hkv * row_blocks;
    work += H * s.Tq * std::min(s.Tk, s.q_offset + s.Tq) * D;
    max_tk = std::max(max_tk, s.Tk);
  }
  const int64_t items = first_item.back();
  if (items == 0) return;
  // Work per item grows with the query position (causal), hence the dynamic schedule. A bf16
  // call hands out a kv head's items together where there are enough heads to go round (four a
  // thread), so that one thread rounds each head's keys and values once (a packed call's
  // sequences differ in length: chunks of their average row blocks, efficiency only).
  const int64_t row_blocks_avg = std::max<int64_t>(1, items / (n_seqs * Hkv));
  const int64_t chunk =
      bf16 ? std::max<int64_t>(1, std::min(row_blocks_avg, items / (4 * int64_t(threads)))) : 1;
#pragma omp parallel num_threads(threads) if (work >= kMinParallelWork)
  {
    Tiles t;
    t.qt.resize(size_t(D * kRows));
    t.s.resize(size_t(kKeyBlock * kRows));
    t.o.resize(size_t(D * kRows));
    t.lim.resize(size_t(kRows));
    t.lo.resize(size_t(kRows));
    Bf16Tiles bt;
    Bf16Kv kv(bf16 ? max_tk : 0, D);
    std::vector<uint16_t> qh;  // a query row, scaled and rounded
    if (bf16) {
      bt.qp.resize(size_t(kv.D2 / 2 * kRows));
      bt.pp.resize(size_t(kKeyBlock * kRows));
      bt.ob.resize(size_t(kRows * D));
      qh.assign(size_t(kv.D2), 0);
    }
    std::vector<float> qrow(bf16 ? size_t(D) : 0);
#pragma omp for schedule(dynamic, chunk)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b =
          std::upper_bound(first_item.begin(), first_item.end(), item) - first_item.begin() - 1;
      const Seq& sq = seqs[size_t(b)];
      const int64_t Tk = sq.Tk, q_offset = sq.q_offset;
      const int64_t row_blocks = (sq.Tq * group + kRows - 1) / kRows;
      const int64_t rows = sq.Tq * group;
      const int64_t local = item - first_item[size_t(b)];
      const int64_t hk = local / row_blocks;
      const int64_t r0 = local % row_blocks * kRows;
      const int64_t n_rows = std::min(kRows, rows - r0);
      const float* kb = sq.k + hk * D;  // key j at kb + j * kv_stride
      const float* vb = sq.v + hk * D;
      const uint8_t* mask = sq.mask;
      auto q_row = [&](int64_t r) { return ((r / group) * H + hk * group + r % group) * D; };
      if (n_rows <= kFewRows) {
        for (int64_t r = r0; r < r0 + n_rows; ++r) {
          const int64_t p = q_offset + r / group;  // the query's position
          const int64_t n_keys = std::min(Tk, p + 1);
          const int64_t first = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
          if (bf16) {
            to_bf16(sq.q + q_row(r), scale, qh.data(), D);
            for (int64_t d = 0; d < D; ++d) qrow[d] = bf16_to_f32(qh[d]);
            fill_kv(kv, sq.k, sq.v, mask, b, hk, Tk, Hkv, D, first & ~int64_t(1), n_keys);
            attend_row_bf16(qrow.data(), kv, mask, first, n_keys, D, softcap, t.o.data(),
                            sq.out + q_row(r));
            continue;
          }
          attend_row(sq.q + q_row(r), kb, vb, mask, kv_stride, first, n_keys, D, scale, softcap,
                     t.o.data(), sq.out + q_row(r));
        }
        continue;
      }

      // Gather the rows' queries, scaled, transposed; padding rows are zero and see no key.
      if (bf16) {
        const float* rows_q[kRows];
        for (int64_t rr = 0; rr < n_rows; ++rr) rows_q[rr] = sq.q + q_row(r0 + rr);
        pack_queries(bt, rows_q, n_rows, D, kv.D2, scale, qh.data());
        std::fill(bt.ob.begin(), bt.ob.end(), 0.0f);
      } else {
        std::fill(t.qt.begin(), t.qt.end(), 0.0f);
        for (int64_t rr = 0; rr < n_rows; ++rr) {
          const float* qr = sq.q + q_row(r0 + rr);
          for (int64_t d = 0; d < D; ++d) t.qt[d * kRows + rr] = qr[d] * scale;
        }
      }
      int64_t n_keys = 0;  // keys 0 .. n_keys-1 are visible to some row of the item
      for (int64_t rr = 0; rr < kRows; ++rr) {
        const int64_t p = q_offset + (r0 + rr) / group;  // the row's position
        t.lim[rr] = rr < n_rows ? std::min(Tk - 1, p) : -1;
        t.lo[rr] = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        n_keys = std::max(n_keys, t.lim[rr] + 1);
        t.m[rr] = kNegInf;
        t.l[rr] = 0.0f;
      }
      const int64_t all_see = t.lim[0];  // every real row sees keys 0 .. all_see
      // Keys before first_key are outside every row's window, keys from all_lo on inside all.
      const int64_t first_key = t.lo[0], all_lo = t.lo[n_rows - 1];
      if (bf16)
        fill_kv(kv, sq.k, sq.v, mask, b, hk, Tk, Hkv, D, first_key & ~int64_t(1), n_keys);
      else
        std::fill(t.o.begin(), t.o.end(), 0.0f);

      // bf16 blocks start at an even key (the paired values); a key before first_key is outside
      // every row's window and hidden.
      for (int64_t j0 = bf16 ? first_key & ~int64_t(1) : first_key; j0 < n_keys; j0 += kKeyBlock) {
        const int64_t len = std::min(kKeyBlock, n_keys - j0);
        float correction[kRows];
        if (bf16)
          score_block_bf16(t, bt, kv, j0, len);
        else
          score_block(t, kb, kv_stride, j0, len, D);
        if (softcap > 0.0f) cap_scores(t, len, softcap);
        hide_keys(t, mask, j0, len, all_see, all_lo);
        softmax_block(t, len, correction);
        if (bf16)
          accumulate_block_bf16(t, bt, kv.values(), j0, len, D, n_rows, correction);
        else
          accumulate_block(t, vb, mask, kv_stride, j0, len, D, correction);
      }
      for (int64_t rr = 0; rr < n_rows; ++rr) {
        const float inv = t.l[rr] > 0.0f ? 1.0f / t.l[rr] : 0.0f;  // no visible key: zeros
        float* dst = sq.out + q_row(r0 + rr);
        if (bf16)
          for (int64_t d = 0; d < D; ++d) dst[d] = bt.ob[rr * D + d] * inv;
        else
          for (int64_t d = 0; d < D; ++d) dst[d] = t.o[d * kRows + rr] * inv;
      }
    }
  }
}

}  // namespace

void attention(const float* q, const float* k, const float* v, float* out,
               const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
               int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
               float softcap, int threads, DType dtype) {
  std::vector<Seq> seqs(size_t(std::max<int64_t>(B, 0)));
  for (int64_t b = 0; b < B; ++b)
    seqs[size_t(b)] = {q + b * Tq * H * D,  k + b * Tk * Hkv * D,
                       v + b * Tk * Hkv * D, out + b * Tq * H * D,
                       key_mask ? key_mask + b * Tk : nullptr, Tq, Tk, q_offset};
  attend(seqs, H, Hkv, D, scale, window, softcap, threads, dtype);
}

void attention_packed(const float* q, const float* k, const float* v, float* out,
                      const int32_t* starts, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                      float scale, int64_t window, float softcap, int threads, DType dtype) {
  std::vector<Seq> seqs(size_t(std::max<int64_t>(B, 0)));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = starts[b], len = starts[b + 1] - starts[b];
    ZOF_ASSERT(len > 0);
    seqs[size_t(b)] = {q + r * H * D, k + r * Hkv * D, v + r * Hkv * D, out + r * H * D,
                       nullptr,       len,             len,             0};
  }
  attend(seqs, H, Hkv, D, scale, window, softcap, threads, dtype);
}

}  // namespace zof::cpu
