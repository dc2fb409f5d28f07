// The CPU backend's causal grouped-query attention, flash-attention style: a work item is up to
// 16 rows (query position, query head) that share one kv head; it walks their visible keys in
// blocks with an online softmax, scoring a block as a small GEMM vectorized across the rows.
// Items of a few rows (decoding) go one row at a time instead. Buffers: per-thread tiles, no T x T.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_ops.h"
#include "cpu/vec_math.h"
#include "zof/error.h"

namespace zof::cpu {

namespace {

constexpr int64_t kRows = 16;      // rows per work item, one SIMD vector across them
constexpr int64_t kKeyBlock = 64;  // keys scored at once
constexpr int64_t kFewRows = 4;    // items of at most this many rows go one row at a time
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// 16 floats as one GCC/Clang vector (a zmm with AVX-512, split into halves or quarters without).
typedef float v16 __attribute__((vector_size(64)));
inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof(v)); }

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

}  // namespace

void attention(const float* q, const float* k, const float* v, float* out,
               const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
               int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
               float softcap, int threads) {
  ZOF_ASSERT(Hkv > 0 && H % Hkv == 0);
  const int64_t group = H / Hkv;
  // Row r of kv head hk is query i = r / group of head hk * group + r % group: for one position
  // the group's query heads are adjacent in memory, and they all read the same keys.
  const int64_t rows = Tq * group;
  const int64_t row_blocks = (rows + kRows - 1) / kRows;
  const int64_t items = B * Hkv * row_blocks;
  const int64_t kv_stride = Hkv * D;  // between consecutive keys of one head
  const int64_t work = B * H * Tq * std::min(Tk, q_offset + Tq) * D;
  // Work per item grows with the query position (causal), hence the dynamic schedule.
#pragma omp parallel num_threads(threads) if (work >= kMinParallelWork)
  {
    Tiles t;
    t.qt.resize(size_t(D * kRows));
    t.s.resize(size_t(kKeyBlock * kRows));
    t.o.resize(size_t(D * kRows));
    t.lim.resize(size_t(kRows));
    t.lo.resize(size_t(kRows));
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = item / (Hkv * row_blocks);
      const int64_t hk = item / row_blocks % Hkv;
      const int64_t r0 = item % row_blocks * kRows;
      const int64_t n_rows = std::min(kRows, rows - r0);
      const float* kb = k + (b * Tk * Hkv + hk) * D;  // key j at kb + j * kv_stride
      const float* vb = v + (b * Tk * Hkv + hk) * D;
      const uint8_t* mask = key_mask ? key_mask + b * Tk : nullptr;
      auto q_row = [&](int64_t r) { return ((b * Tq + r / group) * H + hk * group + r % group) * D; };
      if (n_rows <= kFewRows) {
        for (int64_t r = r0; r < r0 + n_rows; ++r) {
          const int64_t p = q_offset + r / group;  // the query's position
          const int64_t n_keys = std::min(Tk, p + 1);
          const int64_t first = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
          attend_row(q + q_row(r), kb, vb, mask, kv_stride, first, n_keys, D, scale, softcap,
                     t.o.data(), out + q_row(r));
        }
        continue;
      }

      // Gather the rows' queries, scaled, transposed; padding rows are zero and see no key.
      std::fill(t.qt.begin(), t.qt.end(), 0.0f);
      for (int64_t rr = 0; rr < n_rows; ++rr) {
        const float* qr = q + q_row(r0 + rr);
        for (int64_t d = 0; d < D; ++d) t.qt[d * kRows + rr] = qr[d] * scale;
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
      std::fill(t.o.begin(), t.o.end(), 0.0f);

      for (int64_t j0 = first_key; j0 < n_keys; j0 += kKeyBlock) {
        const int64_t len = std::min(kKeyBlock, n_keys - j0);
        float correction[kRows];
        score_block(t, kb, kv_stride, j0, len, D);
        if (softcap > 0.0f) cap_scores(t, len, softcap);
        hide_keys(t, mask, j0, len, all_see, all_lo);
        softmax_block(t, len, correction);
        accumulate_block(t, vb, mask, kv_stride, j0, len, D, correction);
      }
      for (int64_t rr = 0; rr < n_rows; ++rr) {
        const float inv = t.l[rr] > 0.0f ? 1.0f / t.l[rr] : 0.0f;  // no visible key: zeros
        float* dst = out + q_row(r0 + rr);
        for (int64_t d = 0; d < D; ++d) dst[d] = t.o[d * kRows + rr] * inv;
      }
    }
  }
}

}  // namespace zof::cpu
