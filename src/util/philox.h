// One random stream everywhere: Philox4x32-10 (Salmon et al., SC'11) and the standard normals z
// of ZO perturbations, a pure function of (seed, step, query, tensor, element). The same source
// compiles for the host and for CUDA (__host__ __device__), and every floating-point step is an
// IEEE-exact operation (+, *, /, sqrt) or an explicit fmaf, so CPU and GPU produce the same z bit
// for bit, at any thread count, block layout or rank. Internal (src/util/): the public API
// names a direction by its key alone (zof/zkey.h).
#pragma once
#include <cstdint>
#include <cstring>
#include <math.h>

#include "zof/zkey.h"  // ZKey, kZGaussian, kZRademacher: the public part

#if defined(__CUDACC__)
#define ZOF_HD __host__ __device__ __forceinline__
#else
#define ZOF_HD inline
#endif

namespace zof {

struct Philox4x32 {
  uint32_t v[4];
};

ZOF_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = (uint64_t)a * (uint64_t)b;
  hi = (uint32_t)(p >> 32);
  lo = (uint32_t)p;
}

// Philox4x32 with 10 rounds: counter c, key k (Random123's philox4x32_R(10, c, k)).
ZOF_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// ---- deterministic float math (explicit fmaf; no library calls) ------------------------------

ZOF_HD uint32_t zof_float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
ZOF_HD float zof_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Natural log of u in (0, 1], to about 1 ulp: u = m * 2^e with m in [sqrt(1/2), sqrt(2)),
// log m = 2 atanh(f), f = (m - 1) / (m + 1), |f| <= 0.1716.
ZOF_HD float zof_log_unit(float u) {
  uint32_t bits = zof_float_bits(u);
  int e = (int)((bits >> 23) & 0xff) - 127;
  float m = zof_bits_float((bits & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  // Branch-free (selects), so that loops over lanes vectorize.
  const bool big = m > 1.41421356f;
  m = big ? m * 0.5f : m;
  e = big ? e + 1 : e;
  const float f = (m - 1.f) / (m + 1.f);
  const float f2 = f * f;
  // 2 atanh(f) = 2 f (1 + f^2/3 + f^4/5 + f^6/7 + f^8/9 + f^10/11)
  float p = fmaf(f2, 1.f / 11.f, 1.f / 9.f);
  p = fmaf(f2, p, 1.f / 7.f);
  p = fmaf(f2, p, 1.f / 5.f);
  p = fmaf(f2, p, 1.f / 3.f);
  p = p * f2;
  const float two_f = f + f;
  const float logm = fmaf(two_f, p, two_f);
  // e * ln2 in two parts (ln2_hi has trailing zeros so e * ln2_hi is exact).
  const float fe = (float)e;
  return fmaf(fe, 6.9313812256e-01f, fmaf(fe, 9.0580006145e-06f, logm));
}

// sin and cos of 2*pi*x for x in [0, 1) that is a multiple of 2^-24: exact reduction to
// r = x - k/4 in [-1/8, 1/8], then odd/even polynomials in t = 2*pi*r (|t| <= pi/4).
ZOF_HD void zof_sincos_2pi(float x, float& s, float& c) {
  const float k = (float)(int)(x * 4.f + 0.5f);  // x*4 exact; nearest quarter turn
  const float r = fmaf(k, -0.25f, x);            // exact
  const float t = r * 6.28318531f;
  const float t2 = t * t;
  // sin t = t (1 - t^2/6 + t^4/120 - t^6/5040 + t^8/362880 - t^10/39916800)
  float ps = fmaf(t2, -2.50521084e-08f, 2.75573192e-06f);
  ps = fmaf(t2, ps, -1.98412698e-04f);
  ps = fmaf(t2, ps, 8.33333333e-03f);
  ps = fmaf(t2, ps, -1.66666667e-01f);
  ps = ps * t2;
  const float sn = fmaf(t, ps, t);
  // cos t = 1 - t^2/2 + t^4/24 - t^6/720 + t^8/40320 - t^10/3628800 + t^12/479001600
  float pc = fmaf(t2, 2.08767570e-09f, -2.75573192e-07f);
  pc = fmaf(t2, pc, 2.48015873e-05f);
  pc = fmaf(t2, pc, -1.38888889e-03f);
  pc = fmaf(t2, pc, 4.16666667e-02f);
  pc = fmaf(t2, pc, -0.5f);
  const float cs = fmaf(t2, pc, 1.f);
  // Quarter turns: q=0 (sn, cs), 1 (cs, -sn), 2 (-sn, -cs), 3 (-cs, sn); written as selects.
  const int q = ((int)k) & 3;
  const float s0 = (q & 1) ? cs : sn, c0 = (q & 1) ? sn : cs;
  s = (q & 2) ? -s0 : s0;
  c = (q == 1 || q == 2) ? -c0 : c0;
}

// u32 -> uniform in (0, 1]: multiples of 2^-24, never 0, so the log is finite.
ZOF_HD float zof_unit_open0(uint32_t x) { return (float)((x >> 8) + 1u) * 5.9604644775390625e-08f; }
// u32 -> uniform in [0, 1): multiples of 2^-24.
ZOF_HD float zof_unit_closed0(uint32_t x) { return (float)(x >> 8) * 5.9604644775390625e-08f; }

// Four standard normals from one Philox block (Box-Muller on two pairs).
ZOF_HD void zof_box_muller4(const Philox4x32& b, float out[4]) {
  for (int p = 0; p < 2; ++p) {
    const float u1 = zof_unit_open0(b.v[2 * p]);
    const float u2 = zof_unit_closed0(b.v[2 * p + 1]);
    const float rad = sqrtf(-2.f * zof_log_unit(u1));
    float s, c;
    zof_sincos_2pi(u2, s, c);
    out[2 * p] = rad * c;
    out[2 * p + 1] = rad * s;
  }
}

// +-1 from the top bit of each of the 4 words.
ZOF_HD void zof_rademacher4(const uint32_t w[4], float out[4]) {
  for (int i = 0; i < 4; ++i) out[i] = (w[i] >> 31) ? -1.f : 1.f;
}

// Elements 4g..4g+3 of tensor `tensor` under key, element by element (key.rank ignored):
// counter (g, tensor, step, query), key = seed.
ZOF_HD void z_group_dense(const ZKey& key, uint32_t tensor, uint32_t group, float out[4]) {
  const Philox4x32 b = philox4x32_10(group, tensor, key.step, key.query, (uint32_t)key.seed,
                                     (uint32_t)(key.seed >> 32));
  if (key.dist == kZRademacher) {
    zof_rademacher4(b.v, out);
    return;
  }
  zof_box_muller4(b, out);
}

// 16 consecutive groups (64 elements from 4*g0) at once, written lane by lane so that the
// compiler vectorizes it: the same operations as z_group_dense, so the same bits (a dense z:
// key.rank is not read here; the CPU pass builds low-rank z from its factors). Split in two so a
// backend can swap in its own integer Philox (e.g. AVX-512 intrinsics) and keep the float math.
// out[4*l + j] is element 4*(g0 + l) + j.
ZOF_HD void philox16(const ZKey& key, uint32_t tensor, uint32_t g0, uint32_t* c0, uint32_t* c1,
                     uint32_t* c2, uint32_t* c3) {
  constexpr int L = 16;
  for (int l = 0; l < L; ++l) {
    c0[l] = g0 + (uint32_t)l;
    c1[l] = tensor;
    c2[l] = key.step;
    c3[l] = key.query;
  }
  uint32_t k0 = (uint32_t)key.seed, k1 = (uint32_t)(key.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    for (int l = 0; l < L; ++l) {
      const uint64_t p0 = (uint64_t)0xD2511F53u * c0[l], p1 = (uint64_t)0xCD9E8D57u * c2[l];
      const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[l] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[l] ^ k1;
      c1[l] = (uint32_t)p1;
      c3[l] = (uint32_t)p0;
      c0[l] = n0;
      c2[l] = n2;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

ZOF_HD void box_muller16(const uint32_t* c0, const uint32_t* c1, const uint32_t* c2,
                         const uint32_t* c3, float* out) {
  constexpr int L = 16;
  float r0[L], r1[L], s0[L], co0[L], s1[L], co1[L];
  for (int l = 0; l < L; ++l) {
    r0[l] = sqrtf(-2.f * zof_log_unit(zof_unit_open0(c0[l])));
    r1[l] = sqrtf(-2.f * zof_log_unit(zof_unit_open0(c2[l])));
    zof_sincos_2pi(zof_unit_closed0(c1[l]), s0[l], co0[l]);
    zof_sincos_2pi(zof_unit_closed0(c3[l]), s1[l], co1[l]);
  }
  for (int l = 0; l < L; ++l) {
    out[4 * l + 0] = r0[l] * co0[l];
    out[4 * l + 1] = r0[l] * s0[l];
    out[4 * l + 2] = r1[l] * co1[l];
    out[4 * l + 3] = r1[l] * s1[l];
  }
}

// Rademacher from the same 16 blocks: element 4l + i from word i of block l.
ZOF_HD void rademacher16(const uint32_t* c0, const uint32_t* c1, const uint32_t* c2,
                         const uint32_t* c3, float* out) {
  for (int l = 0; l < 16; ++l) {
    const uint32_t w[4] = {c0[l], c1[l], c2[l], c3[l]};
    zof_rademacher4(w, out + 4 * l);
  }
}

ZOF_HD void z_groups16(const ZKey& key, uint32_t tensor, uint32_t g0, float* out) {
  uint32_t c0[16], c1[16], c2[16], c3[16];
  philox16(key, tensor, g0, c0, c1, c2, c3);
  if (key.dist == kZRademacher)
    rademacher16(c0, c1, c2, c3, out);
  else
    box_muller16(c0, c1, c2, c3, out);
}

// ---- low-rank directions (LOZO, Chen et al. 2024; --low-rank) --------------------------------
// A matrix of width cols = key.cols draws z = U V^T / sqrt(r), r = key.rank: element (i, j) is
// sum_k U[i][k] V[j][k] (explicit fmaf, k = 0 .. r-1) times 1 / sqrt(r) (unit variance, as a
// dense z's, so --lr and --eps keep their meaning). U and V are standard normals of their own
// counters: U[i][k] is factor element i*r + k under (tensor | kZFactorU, step, query), V[j][k]
// element j*r + k under (tensor | kZFactorV, step / rank_every, query), so V is the same for
// rank_every steps (LOZO's lazy V) and neither meets a dense z (tensor ids stay below 2^30) nor
// the rounding bits (kRoundQuery). A pure function of (seed, step, query, tensor, element), as
// every z: the CPU pass draws U's rows and V into tables (cpu_zo.cpp) and gets these bits.
constexpr uint32_t kZFactorU = 1u << 30, kZFactorV = 1u << 31;

// The step a factor side draws under: U the key's, V step / rank_every (LOZO's lazy V).
ZOF_HD uint32_t z_factor_step(const ZKey& key, uint32_t side) {
  return side == kZFactorV ? key.step / (key.rank_every ? key.rank_every : 1u) : key.step;
}

// Factor element `index` of a low-rank key: side kZFactorU or kZFactorV, under
// z_factor_step.
ZOF_HD void z_factor_group(const ZKey& key, uint32_t tensor, uint32_t side, uint32_t group,
                           float out[4]) {
  ZKey k = key;
  k.dist = kZGaussian;
  k.step = z_factor_step(key, side);
  z_group_dense(k, tensor | side, group, out);
}
ZOF_HD float z_factor(const ZKey& key, uint32_t tensor, uint32_t side, uint64_t index) {
  float g[4];
  z_factor_group(key, tensor, side, (uint32_t)(index >> 2), g);
  return g[index & 3];
}
ZOF_HD float z_lowrank_scale(uint32_t rank) { return 1.f / sqrtf((float)rank); }
ZOF_HD bool z_lowrank(const ZKey& key) { return key.rank > 0 && key.cols > 0; }

// The low-rank z of element e = i * cols + j (scalar: references and tests; z_lowrank_group
// below for the GPU, the CPU pass from its factor tables: the same fmaf chain, the same bits).
ZOF_HD float z_lowrank_element(const ZKey& key, uint32_t tensor, uint64_t e) {
  const uint64_t i = e / key.cols, j = e % key.cols;
  float s = 0.f;
  for (uint32_t k = 0; k < key.rank; ++k)
    s = fmaf(z_factor(key, tensor, kZFactorU, i * key.rank + k),
             z_factor(key, tensor, kZFactorV, j * key.rank + k), s);
  return s * z_lowrank_scale(key.rank);
}

// Elements 4g..4g+3 of a low-rank key, z_lowrank_element's bits: each side's factors read
// through a cache of one Philox block (4 factor elements), which consecutive elements share (a
// row's U, neighbouring columns' V), so a group of 4 costs a few blocks at small ranks, not 8r.
ZOF_HD void z_lowrank_group(const ZKey& key, uint32_t tensor, uint32_t group, float out[4]) {
  uint32_t ug = 0, vg = 0;  // the blocks held, once have_u / have_v
  bool have_u = false, have_v = false;
  float ub[4] = {0.f, 0.f, 0.f, 0.f}, vb[4] = {0.f, 0.f, 0.f, 0.f};
  const float scale = z_lowrank_scale(key.rank);
  for (int l = 0; l < 4; ++l) {
    const uint64_t e = 4 * (uint64_t)group + (uint64_t)l;
    const uint64_t i = e / key.cols, j = e % key.cols;
    float s = 0.f;
    for (uint32_t k = 0; k < key.rank; ++k) {
      const uint64_t iu = i * key.rank + k, iv = j * key.rank + k;
      if (!have_u || (uint32_t)(iu >> 2) != ug) {
        ug = (uint32_t)(iu >> 2), have_u = true;
        z_factor_group(key, tensor, kZFactorU, ug, ub);
      }
      if (!have_v || (uint32_t)(iv >> 2) != vg) {
        vg = (uint32_t)(iv >> 2), have_v = true;
        z_factor_group(key, tensor, kZFactorV, vg, vb);
      }
      s = fmaf(ub[iu & 3], vb[iv & 3], s);
    }
    out[l] = s * scale;
  }
}

// Elements 4g..4g+3 of tensor `tensor` under key, dense or low-rank.
ZOF_HD void z_group(const ZKey& key, uint32_t tensor, uint32_t group, float out[4]) {
  if (z_lowrank(key)) {
    z_lowrank_group(key, tensor, group, out);
    return;
  }
  z_group_dense(key, tensor, group, out);
}

// z of one element (slow path: tests and scalar references).
ZOF_HD float z_element(const ZKey& key, uint32_t tensor, uint64_t element) {
  if (z_lowrank(key)) return z_lowrank_element(key, tensor, element);
  float g[4];
  z_group(key, tensor, (uint32_t)(element >> 2), g);
  return g[element & 3];
}

// Per-element arithmetic of the ZO kernels, shared by every backend.
// Perturbed weight: theta + scale * z.
ZOF_HD float zo_perturbed(float theta, float z, float scale) { return fmaf(scale, z, theta); }
// SGD update: theta - (coef * z + lr_wd * theta), coef = lr * g, lr_wd = lr * weight_decay.
ZOF_HD float zo_updated(float theta, float z, float coef, float lr_wd) {
  return theta - fmaf(coef, z, lr_wd * theta);
}

// ---- stochastic rounding to bf16 (--master bf16) ------------------------------------------
// The random bits are a pure function of (seed, step, tensor, element), like z: Philox of the
// counter (element / 4, tensor, step, kRoundQuery) under the seed, one 32-bit word per element.
// kRoundQuery is a query no direction uses (queries count from 0), so the bits are independent
// of every z of the run.
constexpr uint32_t kRoundQuery = 0xFFFFFFFFu;
ZOF_HD void round_bits_group(uint64_t seed, uint32_t step, uint32_t tensor, uint32_t group,
                             uint32_t out[4]) {
  const Philox4x32 b =
      philox4x32_10(group, tensor, step, kRoundQuery, (uint32_t)seed, (uint32_t)(seed >> 32));
  for (int i = 0; i < 4; ++i) out[i] = b.v[i];
}
// x rounded to a bf16 value (returned as the fp32 number it is): away from zero with
// probability |x - trunc| / ulp, toward zero otherwise, from the top 16 bits of r. The bits of
// |x| plus those 16 bits, the low half dropped: over the 2^16 values of r the mean is x exactly,
// so an update far below a bf16 ulp is kept on average (round-to-nearest would drop it every
// time). Infinities stay; a NaN stays NaN; a value within an ulp of the largest finite bf16
// may round to infinity, with that probability.
ZOF_HD float bf16_round_stochastic(float x, uint32_t r) {
  const uint32_t u = zof_float_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return x;  // NaN
  return zof_bits_float((u + (r >> 16)) & 0xFFFF0000u);
}

}  // namespace zof
