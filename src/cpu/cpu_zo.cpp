// Zeroth-order parameter passes on host memory: the pending update and the next perturbation in
// one read of theta, with z regenerated from Philox (never stored), 64 elements at a time
// (z_chunk64: AVX-512 or AVX2 intrinsics, else philox.h's lane-parallel z_groups16): the bits of
// the scalar z_group. Compiled with
// -ffp-contract=off (CMakeLists.txt), as zo.cu with --fmad=false: every multiply-add that is
// fused is an explicit fmaf, on both sides, so the host and the GPU produce the same weights.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/cpu_zo.h"
#include "util/philox.h"
#include "zof/error.h"

// Box-Muller's float math vectorizes across 16 lanes; let GCC use full 512-bit vectors here.
#pragma GCC target("prefer-vector-width=512")
// GCC 12 reports the _mm512_undefined_epi32() pass-through operands inside its own AVX-512
// intrinsic headers as "maybe uninitialized" once these helpers are inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The same pass-through operands, reported as "used uninitialized" once the chunk is inlined
// into both copy types' passes.
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace zof::cpu {
namespace {

#if defined(__AVX512F__)
// (hi, lo) of a * m for 16 u32 lanes: vpmuludq on even and odd lanes, then blend.
inline void mulhilo16(__m512i a, __m512i m, __m512i& hi, __m512i& lo) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
}

// philox16 of philox.h with AVX-512 integer ops: the same bits.
inline void philox16_avx512(const ZKey& key, uint32_t tensor, uint32_t g0, uint32_t* o0,
                            uint32_t* o1, uint32_t* o2, uint32_t* o3) {
  __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32((int)g0),
                                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  __m512i c1 = _mm512_set1_epi32((int)tensor), c2 = _mm512_set1_epi32((int)key.step),
          c3 = _mm512_set1_epi32((int)key.query);
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53u), m1 = _mm512_set1_epi64(0xCD9E8D57u);
  uint32_t k0 = (uint32_t)key.seed, k1 = (uint32_t)(key.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    __m512i hi0, lo0, hi1, lo1;
    mulhilo16(c0, m0, hi0, lo0);
    mulhilo16(c2, m1, hi1, lo1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32((int)k0));
    c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32((int)k1));
    c1 = lo1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  _mm512_storeu_si512(o0, c0);
  _mm512_storeu_si512(o1, c1);
  _mm512_storeu_si512(o2, c2);
  _mm512_storeu_si512(o3, c3);
}

// Box-Muller on 16 lanes: philox.h's zof_log_unit and zof_sincos_2pi operation for operation
// (IEEE +, *, /, sqrt and the same explicit fmaf; the selects as masked moves and sign flips),
// as the AVX2 path below does on 8. GCC vectorizes box_muller16's portable loops only 8 lanes
// wide (and the copy the linker keeps may come from a file built without 512-bit vectors).
inline __m512 set16(float f) { return _mm512_set1_ps(f); }
inline __m512 unit_open0_16(__m512i x) {
  return _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_srli_epi32(x, 8), _mm512_set1_epi32(1))),
      set16(5.9604644775390625e-08f));
}
inline __m512 unit_closed0_16(__m512i x) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(x, 8)), set16(5.9604644775390625e-08f));
}
inline __m512 log_unit16(__m512 u) {
  const __m512i bits = _mm512_castps_si512(u);
  __m512i e = _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(bits, 23), _mm512_set1_epi32(0xff)),
                               _mm512_set1_epi32(127));
  __m512 m = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x007fffff)), _mm512_set1_epi32(0x3f800000)));
  const __mmask16 big = _mm512_cmp_ps_mask(m, set16(1.41421356f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, big, m, set16(0.5f));
  e = _mm512_mask_add_epi32(e, big, e, _mm512_set1_epi32(1));
  const __m512 f = _mm512_div_ps(_mm512_sub_ps(m, set16(1.f)), _mm512_add_ps(m, set16(1.f)));
  const __m512 f2 = _mm512_mul_ps(f, f);
  __m512 p = _mm512_fmadd_ps(f2, set16(1.f / 11.f), set16(1.f / 9.f));
  p = _mm512_fmadd_ps(f2, p, set16(1.f / 7.f));
  p = _mm512_fmadd_ps(f2, p, set16(1.f / 5.f));
  p = _mm512_fmadd_ps(f2, p, set16(1.f / 3.f));
  p = _mm512_mul_ps(p, f2);
  const __m512 two_f = _mm512_add_ps(f, f);
  const __m512 logm = _mm512_fmadd_ps(two_f, p, two_f);
  const __m512 fe = _mm512_cvtepi32_ps(e);
  return _mm512_fmadd_ps(fe, set16(6.9313812256e-01f),
                         _mm512_fmadd_ps(fe, set16(9.0580006145e-06f), logm));
}
inline void sincos_2pi16(__m512 x, __m512& s, __m512& c) {
  const __m512i ki = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(x, set16(4.f)), set16(0.5f)));
  const __m512 k = _mm512_cvtepi32_ps(ki);
  const __m512 r = _mm512_fmadd_ps(k, set16(-0.25f), x);
  const __m512 t = _mm512_mul_ps(r, set16(6.28318531f));
  const __m512 t2 = _mm512_mul_ps(t, t);
  __m512 ps = _mm512_fmadd_ps(t2, set16(-2.50521084e-08f), set16(2.75573192e-06f));
  ps = _mm512_fmadd_ps(t2, ps, set16(-1.98412698e-04f));
  ps = _mm512_fmadd_ps(t2, ps, set16(8.33333333e-03f));
  ps = _mm512_fmadd_ps(t2, ps, set16(-1.66666667e-01f));
  ps = _mm512_mul_ps(ps, t2);
  const __m512 sn = _mm512_fmadd_ps(t, ps, t);
  __m512 pc = _mm512_fmadd_ps(t2, set16(2.08767570e-09f), set16(-2.75573192e-07f));
  pc = _mm512_fmadd_ps(t2, pc, set16(2.48015873e-05f));
  pc = _mm512_fmadd_ps(t2, pc, set16(-1.38888889e-03f));
  pc = _mm512_fmadd_ps(t2, pc, set16(4.16666667e-02f));
  pc = _mm512_fmadd_ps(t2, pc, set16(-0.5f));
  const __m512 cs = _mm512_fmadd_ps(t2, pc, set16(1.f));
  const __m512i q = _mm512_and_si512(ki, _mm512_set1_epi32(3));
  const __mmask16 odd = _mm512_test_epi32_mask(q, _mm512_set1_epi32(1));
  const __m512 s0 = _mm512_mask_blend_ps(odd, sn, cs), c0 = _mm512_mask_blend_ps(odd, cs, sn);
  // -s0 where q & 2 (q = 2, 3); -c0 where q is 1 or 2 ((q + 1) & 2).
  const __mmask16 neg_s = _mm512_test_epi32_mask(q, _mm512_set1_epi32(2));
  const __mmask16 neg_c =
      _mm512_test_epi32_mask(_mm512_add_epi32(q, _mm512_set1_epi32(1)), _mm512_set1_epi32(2));
  const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
  s = _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(s0), neg_s,
                                                _mm512_castps_si512(s0), sign));
  c = _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(c0), neg_c,
                                                _mm512_castps_si512(c0), sign));
}

// z of 16 Philox blocks from their words (box_muller16's bits): out[4l + 0..3] from block l.
inline void box_muller16_avx512(const uint32_t* c0, const uint32_t* c1, const uint32_t* c2,
                                const uint32_t* c3, float* out) {
  const __m512 r0 = _mm512_sqrt_ps(
      _mm512_mul_ps(set16(-2.f), log_unit16(unit_open0_16(_mm512_loadu_si512(c0)))));
  const __m512 r1 = _mm512_sqrt_ps(
      _mm512_mul_ps(set16(-2.f), log_unit16(unit_open0_16(_mm512_loadu_si512(c2)))));
  __m512 s0, co0, s1, co1;
  sincos_2pi16(unit_closed0_16(_mm512_loadu_si512(c1)), s0, co0);
  sincos_2pi16(unit_closed0_16(_mm512_loadu_si512(c3)), s1, co1);
  const __m512 a = _mm512_mul_ps(r0, co0), b = _mm512_mul_ps(r0, s0);
  const __m512 c = _mm512_mul_ps(r1, co1), d = _mm512_mul_ps(r1, s1);
  // Interleave: element 4l + j is lane l of (a, b, c, d)[j].
  const __m512 ab_lo = _mm512_unpacklo_ps(a, b), ab_hi = _mm512_unpackhi_ps(a, b);
  const __m512 cd_lo = _mm512_unpacklo_ps(c, d), cd_hi = _mm512_unpackhi_ps(c, d);
  // Per 128-bit lane k: groups 4k, 4k+1 (l0), 4k+2, 4k+3 (l1) ... as in interleave4x8.
  const __m512 g0 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab_lo), _mm512_castps_pd(cd_lo)));
  const __m512 g1 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab_lo), _mm512_castps_pd(cd_lo)));
  const __m512 g2 = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab_hi), _mm512_castps_pd(cd_hi)));
  const __m512 g3 = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab_hi), _mm512_castps_pd(cd_hi)));
  // 128-bit lane k of g_j holds block 4k + j: store blocks 4k .. 4k+3 contiguously.
  alignas(64) float t[4][16];
  _mm512_store_ps(t[0], g0);
  _mm512_store_ps(t[1], g1);
  _mm512_store_ps(t[2], g2);
  _mm512_store_ps(t[3], g3);
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 4; ++j)
      _mm_storeu_ps(out + 16 * k + 4 * j, _mm_load_ps(&t[j][4 * k]));
}
#endif

#if defined(__x86_64__)
// The same bits on CPUs with AVX2 and FMA but no AVX-512, 8 lanes at a time: Philox with
// vpmuludq, and Box-Muller as philox.h's zof_log_unit and zof_sincos_2pi, operation for
// operation (IEEE +, *, /, sqrt and the same explicit fmaf; the selects as blends and sign
// flips), which GCC does not vectorize from the portable loops on its own. Compiled on every
// x86 build (for AVX2 and FMA by attribute), so that a machine whose own pass is AVX-512 tests
// this code too (z64_avx2); the pass uses it where the build is AVX2 without AVX-512.
#define ZOF_HAVE_AVX2_Z 1
#define ZOF_AVX2 __attribute__((target("avx2,fma"))) inline
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define ZOF_ZO_AVX2 1
#endif

// (hi, lo) of a * m for 8 u32 lanes.
ZOF_AVX2 void mulhilo8(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(a, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// philox16's blocks g0 .. g0 + 7 (lane l: group g0 + l).
ZOF_AVX2 void philox8_avx2(const ZKey& key, uint32_t tensor, uint32_t g0, __m256i& o0, __m256i& o1,
                         __m256i& o2, __m256i& o3) {
  __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)g0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i c1 = _mm256_set1_epi32((int)tensor), c2 = _mm256_set1_epi32((int)key.step),
          c3 = _mm256_set1_epi32((int)key.query);
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  uint32_t k0 = (uint32_t)key.seed, k1 = (uint32_t)(key.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    __m256i hi0, lo0, hi1, lo1;
    mulhilo8(c0, m0, hi0, lo0);
    mulhilo8(c2, m1, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
    c1 = lo1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  o0 = c0, o1 = c1, o2 = c2, o3 = c3;
}

ZOF_AVX2 __m256 set8(float f) { return _mm256_set1_ps(f); }

// zof_unit_open0 / zof_unit_closed0: (x >> 8) (+ 1) is below 2^24 + 1, so the signed
// conversion is exact.
ZOF_AVX2 __m256 unit_open0_8(__m256i x) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_srli_epi32(x, 8), _mm256_set1_epi32(1))),
                       set8(5.9604644775390625e-08f));
}
ZOF_AVX2 __m256 unit_closed0_8(__m256i x) {
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 8)), set8(5.9604644775390625e-08f));
}

// zof_log_unit, lane by lane.
ZOF_AVX2 __m256 log_unit8(__m256 u) {
  const __m256i bits = _mm256_castps_si256(u);
  __m256i e = _mm256_sub_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(0xff)),
                               _mm256_set1_epi32(127));
  __m256 m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)),
                                                 _mm256_set1_epi32(0x3f800000)));
  const __m256 big = _mm256_cmp_ps(m, set8(1.41421356f), _CMP_GT_OQ);
  m = _mm256_blendv_ps(m, _mm256_mul_ps(m, set8(0.5f)), big);
  e = _mm256_add_epi32(e, _mm256_and_si256(_mm256_castps_si256(big), _mm256_set1_epi32(1)));
  const __m256 f = _mm256_div_ps(_mm256_sub_ps(m, set8(1.f)), _mm256_add_ps(m, set8(1.f)));
  const __m256 f2 = _mm256_mul_ps(f, f);
  __m256 p = _mm256_fmadd_ps(f2, set8(1.f / 11.f), set8(1.f / 9.f));
  p = _mm256_fmadd_ps(f2, p, set8(1.f / 7.f));
  p = _mm256_fmadd_ps(f2, p, set8(1.f / 5.f));
  p = _mm256_fmadd_ps(f2, p, set8(1.f / 3.f));
  p = _mm256_mul_ps(p, f2);
  const __m256 two_f = _mm256_add_ps(f, f);
  const __m256 logm = _mm256_fmadd_ps(two_f, p, two_f);
  const __m256 fe = _mm256_cvtepi32_ps(e);
  return _mm256_fmadd_ps(fe, set8(6.9313812256e-01f), _mm256_fmadd_ps(fe, set8(9.0580006145e-06f), logm));
}

// zof_sincos_2pi, lane by lane.
ZOF_AVX2 void sincos_2pi8(__m256 x, __m256& s, __m256& c) {
  const __m256i ki = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(x, set8(4.f)), set8(0.5f)));
  const __m256 k = _mm256_cvtepi32_ps(ki);
  const __m256 r = _mm256_fmadd_ps(k, set8(-0.25f), x);
  const __m256 t = _mm256_mul_ps(r, set8(6.28318531f));
  const __m256 t2 = _mm256_mul_ps(t, t);
  __m256 ps = _mm256_fmadd_ps(t2, set8(-2.50521084e-08f), set8(2.75573192e-06f));
  ps = _mm256_fmadd_ps(t2, ps, set8(-1.98412698e-04f));
  ps = _mm256_fmadd_ps(t2, ps, set8(8.33333333e-03f));
  ps = _mm256_fmadd_ps(t2, ps, set8(-1.66666667e-01f));
  ps = _mm256_mul_ps(ps, t2);
  const __m256 sn = _mm256_fmadd_ps(t, ps, t);
  __m256 pc = _mm256_fmadd_ps(t2, set8(2.08767570e-09f), set8(-2.75573192e-07f));
  pc = _mm256_fmadd_ps(t2, pc, set8(2.48015873e-05f));
  pc = _mm256_fmadd_ps(t2, pc, set8(-1.38888889e-03f));
  pc = _mm256_fmadd_ps(t2, pc, set8(4.16666667e-02f));
  pc = _mm256_fmadd_ps(t2, pc, set8(-0.5f));
  const __m256 cs = _mm256_fmadd_ps(t2, pc, set8(1.f));
  const __m256i q = _mm256_and_si256(ki, _mm256_set1_epi32(3));
  const __m256 odd = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(q, _mm256_set1_epi32(1)),
                                                            _mm256_set1_epi32(1)));
  const __m256 s0 = _mm256_blendv_ps(sn, cs, odd), c0 = _mm256_blendv_ps(cs, sn, odd);
  const __m256 sign = set8(-0.f);
  // -s0 where q & 2 (q = 2, 3); -c0 where q is 1 or 2.
  const __m256 neg_s = _mm256_castsi256_ps(_mm256_cmpgt_epi32(q, _mm256_set1_epi32(1)));
  const __m256 neg_c = _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_add_epi32(q, _mm256_set1_epi32(1)), _mm256_set1_epi32(2)),
                         _mm256_set1_epi32(2)));
  s = _mm256_xor_ps(s0, _mm256_and_ps(sign, neg_s));
  c = _mm256_xor_ps(c0, _mm256_and_ps(sign, neg_c));
}

// out[4l + 0..3] = a[l], b[l], c[l], d[l] for the 8 lanes: philox16's element order.
ZOF_AVX2 void interleave4x8(__m256 a, __m256 b, __m256 c, __m256 d, float* out) {
  const __m256 ab_lo = _mm256_unpacklo_ps(a, b), ab_hi = _mm256_unpackhi_ps(a, b);  // a0 b0 a1 b1 | a4 b4 a5 b5
  const __m256 cd_lo = _mm256_unpacklo_ps(c, d), cd_hi = _mm256_unpackhi_ps(c, d);
  const __m256 l0 = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(ab_lo), _mm256_castps_pd(cd_lo)));  // 0 | 4
  const __m256 l1 = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(ab_lo), _mm256_castps_pd(cd_lo)));  // 1 | 5
  const __m256 l2 = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(ab_hi), _mm256_castps_pd(cd_hi)));  // 2 | 6
  const __m256 l3 = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(ab_hi), _mm256_castps_pd(cd_hi)));  // 3 | 7
  _mm256_storeu_ps(out + 0, _mm256_permute2f128_ps(l0, l1, 0x20));
  _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(l2, l3, 0x20));
  _mm256_storeu_ps(out + 16, _mm256_permute2f128_ps(l0, l1, 0x31));
  _mm256_storeu_ps(out + 24, _mm256_permute2f128_ps(l2, l3, 0x31));
}

// -1 where a word's top bit is set, else +1 (zof_rademacher4).
ZOF_AVX2 __m256 pm1_8(__m256i w) {
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi32((int)0x80000000u)),
                                             _mm256_set1_epi32(0x3f800000)));
}

// z of 8 groups (32 elements) from their Philox blocks: box_muller16 / rademacher16's bits.
ZOF_AVX2 void z_from_blocks8(const ZKey& key, __m256i c0, __m256i c1, __m256i c2, __m256i c3,
                           float* out) {
  if (key.dist == kZRademacher) {
    interleave4x8(pm1_8(c0), pm1_8(c1), pm1_8(c2), pm1_8(c3), out);
    return;
  }
  const __m256 r0 = _mm256_sqrt_ps(_mm256_mul_ps(set8(-2.f), log_unit8(unit_open0_8(c0))));
  const __m256 r1 = _mm256_sqrt_ps(_mm256_mul_ps(set8(-2.f), log_unit8(unit_open0_8(c2))));
  __m256 s0, co0, s1, co1;
  sincos_2pi8(unit_closed0_8(c1), s0, co0);
  sincos_2pi8(unit_closed0_8(c3), s1, co1);
  interleave4x8(_mm256_mul_ps(r0, co0), _mm256_mul_ps(r0, s0), _mm256_mul_ps(r1, co1),
                _mm256_mul_ps(r1, s1), out);
}

// z of the 64 elements from 4 * g0 (z_groups16's bits).
ZOF_AVX2 void z_chunk64_avx2(const ZKey& key, uint32_t tensor, uint32_t g0, float* out) {
  for (int h = 0; h < 2; ++h) {
    __m256i c0, c1, c2, c3;
    philox8_avx2(key, tensor, g0 + 8 * (uint32_t)h, c0, c1, c2, c3);
    z_from_blocks8(key, c0, c1, c2, c3, out + 32 * h);
  }
}

// The stochastic-rounding words of those elements (round_bits64's): element l's is out[l].
ZOF_AVX2 void round_bits64_avx2(const ZKey& k, uint32_t tensor, uint32_t g0, uint32_t* out) {
  for (int h = 0; h < 2; ++h) {
    __m256i w0, w1, w2, w3;
    philox8_avx2(k, tensor, g0 + 8 * (uint32_t)h, w0, w1, w2, w3);
    interleave4x8(_mm256_castsi256_ps(w0), _mm256_castsi256_ps(w1), _mm256_castsi256_ps(w2),
                  _mm256_castsi256_ps(w3), reinterpret_cast<float*>(out + 32 * h));
  }
}

// z_from_words16 through the AVX2 math.
ZOF_AVX2 void z_from_words16_avx2_impl(const ZKey& key, const uint32_t* c0, const uint32_t* c1,
                                       const uint32_t* c2, const uint32_t* c3, float* out) {
  for (int h = 0; h < 2; ++h)
    z_from_blocks8(key, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c0 + 8 * h)),
                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c1 + 8 * h)),
                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c2 + 8 * h)),
                   _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c3 + 8 * h)), out + 32 * h);
}

bool cpu_has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

inline void z_chunk64(const ZKey& key, uint32_t tensor, uint32_t g0, float* out) {
#if defined(__AVX512F__)
  alignas(64) uint32_t c0[16], c1[16], c2[16], c3[16];
  philox16_avx512(key, tensor, g0, c0, c1, c2, c3);
  if (key.dist == kZRademacher)
    rademacher16(c0, c1, c2, c3, out);
  else
    box_muller16_avx512(c0, c1, c2, c3, out);
#elif defined(ZOF_ZO_AVX2)
  z_chunk64_avx2(key, tensor, g0, out);
#else
  z_groups16(key, tensor, g0, out);
#endif
}

// The stochastic-rounding bits of the chunk's 64 elements (philox.h's round_bits_group for its
// 16 groups): element l's word is out[l].
inline void round_bits64(const ZKey& round, uint32_t tensor, uint32_t g0, uint32_t* out) {
  ZKey k;
  k.seed = round.seed, k.step = round.step, k.query = kRoundQuery;
#if defined(ZOF_ZO_AVX2)
  round_bits64_avx2(k, tensor, g0, out);
#else
  alignas(64) uint32_t c[4][16];
#if defined(__AVX512F__)
  philox16_avx512(k, tensor, g0, c[0], c[1], c[2], c[3]);
#else
  philox16(k, tensor, g0, c[0], c[1], c[2], c[3]);
#endif
  for (int l = 0; l < 64; ++l) out[l] = c[l % 4][l / 4];
#endif
}

constexpr int64_t kChunk = 64;  // elements per z_groups16 call

// ---- low-rank z (philox.h's z_lowrank_element) from factor tables --------------------------

// Factor elements [i0, i0 + count) of one side of a low-rank key, the bits of z_factor_group:
// a dense z of the key's seed and query under the side's step, of the tensor id with the
// side's bit, 64 at a time through the pass's own z_chunk64.
void fill_factors(const ZKey& key, uint32_t tensor, uint32_t side, int64_t i0, int64_t count,
                  float* out) {
  ZKey k;
  k.seed = key.seed, k.query = key.query, k.dist = kZGaussian;
  k.step = z_factor_step(key, side);
  alignas(64) float t[kChunk];
  for (int64_t a = i0 & ~(kChunk - 1); a < i0 + count; a += kChunk) {
    z_chunk64(k, tensor | side, (uint32_t)(a >> 2), t);
    const int64_t lo = std::max(a, i0), hi = std::min(a + kChunk, i0 + count);
    for (int64_t i = lo; i < hi; ++i) out[i - i0] = t[i - a];
  }
}

// V of a low-rank key, transposed (vt[k * cols + j] = V[j][k]) so that a row's elements read it
// in order. It is the same for every pass over a tensor under one (seed, query, step /
// rank_every), and the token table's rows, the LM head's chunks, the held passes and a
// tensor-parallel slice's row runs (one pass a row of a row-parallel o or down, each with a
// key per update term) each cover a part of a tensor, so the calling thread keeps the ones it
// drew last: up to 32 MiB of them, and never fewer than 4 (a pass with q terms finds all its
// q + 1 keys' tables again at the next row while they fit).
std::shared_ptr<const std::vector<float>> v_table(const ZKey& key, uint32_t tensor) {
  struct Entry {
    uint64_t seed;
    uint32_t vstep, query, rank, cols, tensor;
    std::shared_ptr<const std::vector<float>> vt;
  };
  thread_local std::vector<Entry> cache;  // most recent last
  const uint32_t vstep = z_factor_step(key, kZFactorV);
  for (size_t i = 0; i < cache.size(); ++i) {
    const Entry& e = cache[i];
    if (e.seed == key.seed && e.vstep == vstep && e.query == key.query && e.rank == key.rank &&
        e.cols == key.cols && e.tensor == tensor) {
      Entry hit = e;
      cache.erase(cache.begin() + (std::ptrdiff_t)i);
      cache.push_back(hit);
      return hit.vt;
    }
  }
  const int64_t r = key.rank, cols = key.cols;
  std::vector<float> v(size_t(cols * r));
  fill_factors(key, tensor, kZFactorV, 0, cols * r, v.data());
  auto vt = std::make_shared<std::vector<float>>(v.size());
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t k = 0; k < r; ++k) (*vt)[size_t(k * cols + j)] = v[size_t(j * r + k)];
  cache.push_back({key.seed, vstep, key.query, key.rank, key.cols, tensor, vt});
  constexpr size_t kKeptBytes = size_t(32) << 20, kKeptLeast = 4;
  size_t bytes = 0;
  for (const Entry& e : cache) bytes += e.vt->size() * sizeof(float);
  while (cache.size() > kKeptLeast && bytes > kKeptBytes) {
    bytes -= cache.front().vt->size() * sizeof(float);
    cache.erase(cache.begin());
  }
  return vt;
}

// The z of one key over one pass's elements [first, first + n): z_chunk64 for a dense key; for
// a low-rank key, U's rows that the range reaches and V (v_table) drawn before the pass, and
// each element's fmaf chain over k = 0 .. r-1 from them, times 1 / sqrt(r): the bits of the
// scalar z_lowrank_element (the chain runs k-major across a row's elements, each element's own
// sum in k order).
class ZSource {
 public:
  ZSource() = default;
  ZSource(const ZKey& key, uint32_t tensor, int64_t first, int64_t n) : key_(&key) {
    if (!z_lowrank(key) || n <= 0) return;
    const int64_t r = key.rank, cols = key.cols;
    row0_ = first / cols;
    const int64_t rows = (first + n - 1) / cols - row0_ + 1;
    u_.resize(size_t(rows * r));
    fill_factors(key, tensor, kZFactorU, row0_ * r, rows * r, u_.data());
    vt_ = v_table(key, tensor);
  }
  const ZKey& key() const { return *key_; }

  // z of chunk c's elements [l0, l1) into z[l0 .. l1).
  void chunk(uint32_t tensor, int64_t c, int64_t l0, int64_t l1, float* z) const {
    if (!vt_) {
      z_chunk64(*key_, tensor, (uint32_t)(c * (kChunk / 4)), z);
      return;
    }
    const int64_t r = key_->rank, cols = key_->cols;
    const float scale = z_lowrank_scale(key_->rank);
    const float* vt = vt_->data();
    int64_t e = c * kChunk + l0;
    for (int64_t l = l0; l < l1;) {  // one row's run of the chunk at a time
      const int64_t i = e / cols, j = e % cols;
      const int64_t len = std::min(l1 - l, cols - j);
      const float* u = &u_[size_t((i - row0_) * r)];
      float* out = z + l;
      for (int64_t t = 0; t < len; ++t) out[t] = 0.f;
      for (int64_t k = 0; k < r; ++k) {
        const float uk = u[k];
        const float* v = vt + k * cols + j;
        for (int64_t t = 0; t < len; ++t) out[t] = fmaf(uk, v[t], out[t]);
      }
      for (int64_t t = 0; t < len; ++t) out[t] *= scale;
      l += len, e += len;
    }
  }

 private:
  const ZKey* key_ = nullptr;
  int64_t row0_ = 0;
  std::vector<float> u_;                          // rows x r, from row row0_
  std::shared_ptr<const std::vector<float>> vt_;  // null: a dense key
};

// The sources of a pass's update terms and of its perturbation (last), built before the
// chunks run in parallel.
std::vector<ZSource> z_sources(const ZOUpdateTerm* upd, int n_update, const ZKey* cur,
                               uint32_t tensor, int64_t first, int64_t n) {
  std::vector<ZSource> s;
  s.reserve(size_t(n_update) + 1);
  for (int j = 0; j < n_update; ++j) s.emplace_back(upd[j].key, tensor, first, n);
  s.emplace_back();
  if (cur) s.back() = ZSource(*cur, tensor, first, n);
  return s;
}

// Elements a pass takes at once: all of them with dense keys; with low-rank ones, bands of
// rows whose U tables stay near 1 MB per key (a pass over part of a tensor has the bits of
// the whole tensor's pass, so the bands change nothing else).
int64_t z_band(const ZOUpdateTerm* upd, int n_update, const ZKey* cur, int64_t n) {
  int64_t band = n;
  auto take = [&](const ZKey& k) {
    if (!z_lowrank(k)) return;
    const int64_t rows = std::max<int64_t>(1, (int64_t(1) << 18) / k.rank);
    band = std::min(band, std::max<int64_t>(rows * k.cols, kChunk));
  };
  for (int j = 0; j < n_update; ++j) take(upd[j].key);
  if (cur) take(*cur);
  return std::max<int64_t>(band, 1);
}

// A master's element as fp32, and back: fp32, or bf16 (uint16_t; what is stored back is a
// stochastically rounded value, a bf16 value already, so the store is exact).
inline float load(const float* p) { return *p; }
inline float load(const uint16_t* p) { return bf16_to_f32(*p); }
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = f32_to_bf16(v); }
constexpr int64_t kStreamingStoreMin = int64_t(1) << 21;  // elements (8 MB per copy)

// Elements [c * kChunk + l0, c * kChunk + l1) of the tensor (absolute indices), 0 <= l0 < l1 <=
// kChunk; theta/plus/minus point at element `first`. z is generated for the whole aligned chunk
// (generating past the tensor's end is harmless: z is a pure function of the counter), so a pass
// over any sub-range gives the same bits as a pass over the whole tensor.
// The copies are of type C: float, or uint16_t holding bf16 (the float value rounded to
// nearest even).
// src: z_sources' (the terms', then cur's).
template <class C, class T>
inline void zo_chunk(T* theta, int64_t first, int64_t c, int64_t l0, int64_t l1,
                     uint32_t tensor, const ZOUpdateTerm* upd, int n_update, float lr_wd,
                     const ZKey* round, const ZKey* cur, const ZSource* src, float eps, C* plus,
                     C* minus, bool stream) {
  alignas(64) float th[kChunk], z[kChunk];
  const int64_t base = c * kChunk - first;  // theta[base + l] is the chunk's element l
  // z of the chunk under source s's key; Sparse MeZO zeroes it where |theta| (th before this
  // pass's update) exceeds the key's mask.
  auto gen = [&](const ZSource& s) {
    const ZKey& key = s.key();
    s.chunk(tensor, c, l0, l1, z);
    if (key.mask < __builtin_inff())
      for (int64_t l = l0; l < l1; ++l) z[l] = std::fabs(th[l]) > key.mask ? 0.f : z[l];
  };
  for (int64_t l = l0; l < l1; ++l) th[l] = load(theta + base + l);
  if (n_update > 0) {
    alignas(64) float acc[kChunk];
    for (int64_t l = l0; l < l1; ++l) acc[l] = lr_wd * th[l];
    for (int j = 0; j < n_update; ++j) {
      gen(src[j]);
      const float k = upd[j].coef;
      for (int64_t l = l0; l < l1; ++l) acc[l] = fmaf(k, z[l], acc[l]);
    }
    if (round) {  // a bf16 master: the update rounded stochastically, as the copies see it
      alignas(64) uint32_t r[kChunk];
      round_bits64(*round, tensor, (uint32_t)(c * (kChunk / 4)), r);
      for (int64_t l = l0; l < l1; ++l) {
        th[l] = bf16_round_stochastic(th[l] - acc[l], r[l]);
        store(theta + base + l, th[l]);
      }
    } else {
      for (int64_t l = l0; l < l1; ++l) store(theta + base + l, th[l] = th[l] - acc[l]);
    }
  }
  if (cur) {
    gen(src[n_update]);
    if constexpr (std::is_same_v<C, uint16_t>) {
      if (plus)
        for (int64_t l = l0; l < l1; ++l) plus[base + l] = f32_to_bf16(zo_perturbed(th[l], z[l], eps));
      if (minus)
        for (int64_t l = l0; l < l1; ++l)
          minus[base + l] = f32_to_bf16(zo_perturbed(th[l], z[l], -eps));
      return;
    } else {
#if defined(__AVX512F__)
    // A whole, 64-byte aligned chunk: streaming stores. The perturbed copies are written once
    // and read later by a GEMM, so fetching their old lines first (a normal store's
    // read-for-ownership) would only add memory traffic. Same values as the loop below.
    auto aligned = [](const float* p) { return ((uintptr_t)p & 63) == 0; };
    if (stream && l0 == 0 && l1 == kChunk && (!plus || aligned(plus + base)) &&
        (!minus || aligned(minus + base))) {
      for (int64_t l = 0; l < kChunk; l += 16) {
        const __m512 t = _mm512_load_ps(th + l), zz = _mm512_load_ps(z + l);
        if (plus) _mm512_stream_ps(plus + base + l, _mm512_fmadd_ps(_mm512_set1_ps(eps), zz, t));
        if (minus) _mm512_stream_ps(minus + base + l, _mm512_fmadd_ps(_mm512_set1_ps(-eps), zz, t));
      }
      return;
    }
#endif
    if (plus)
      for (int64_t l = l0; l < l1; ++l) plus[base + l] = zo_perturbed(th[l], z[l], eps);
    if (minus)
      for (int64_t l = l0; l < l1; ++l) minus[base + l] = zo_perturbed(th[l], z[l], -eps);
    }
  }
}

// Elements [l0, l1) of chunk c through optimizer state (Backend::zo_update_state).
template <class T>
inline void zo_state_chunk(T* theta, float* m, float* v, int64_t first, int64_t c, int64_t l0,
                           int64_t l1, uint32_t tensor, const ZOUpdateTerm* upd,
                           const ZSource* src, int n_update, const ZOOptimizer& o,
                           const ZKey* round) {
  alignas(64) float th[kChunk], z[kChunk], gh[kChunk];
  const int64_t base = c * kChunk - first;
  for (int64_t l = l0; l < l1; ++l) {
    th[l] = load(theta + base + l);
    gh[l] = 0.f;
  }
  for (int j = 0; j < n_update; ++j) {
    src[j].chunk(tensor, c, l0, l1, z);
    const float mk = upd[j].key.mask, k = upd[j].coef;
    for (int64_t l = l0; l < l1; ++l) gh[l] = fmaf(k, std::fabs(th[l]) > mk ? 0.f : z[l], gh[l]);
  }
  alignas(64) float nt[kChunk];  // the new theta
  if (o.kind == ZOOptimizer::Momentum) {
    for (int64_t l = l0; l < l1; ++l) {
      const float mm = fmaf(o.beta1, m[base + l], fmaf(o.wd, th[l], gh[l]));
      m[base + l] = mm;
      nt[l] = fmaf(-o.lr, mm, th[l]);
    }
  } else {
    for (int64_t l = l0; l < l1; ++l) {
      const float mm = fmaf(o.beta1, m[base + l], (1.f - o.beta1) * gh[l]);
      const float vv = fmaf(o.beta2, v[base + l], (1.f - o.beta2) * gh[l] * gh[l]);
      m[base + l] = mm;
      v[base + l] = vv;
      const float step = mm * o.bc1 / (std::sqrt(vv * o.bc2) + o.eps);
      nt[l] = fmaf(-o.lr, fmaf(o.wd, th[l], step), th[l]);  // as zo.cu: one rounding
    }
  }
  if (round) {
    alignas(64) uint32_t r[kChunk];
    round_bits64(*round, tensor, (uint32_t)(c * (kChunk / 4)), r);
    for (int64_t l = l0; l < l1; ++l) nt[l] = bf16_round_stochastic(nt[l], r[l]);
  }
  for (int64_t l = l0; l < l1; ++l) store(theta + base + l, nt[l]);
}

}  // namespace

namespace {
template <class T>
void zo_update_state_band(T* theta, float* m, float* v, int64_t n, uint32_t tensor,
                          int64_t first, const ZOUpdateTerm* upd, int n_update,
                          const ZOOptimizer& o, const ZKey* round) {
  const int64_t end = first + n;
  const int64_t c_lo = first / kChunk, c_hi = (end + kChunk - 1) / kChunk;
  const std::vector<ZSource> src = z_sources(upd, n_update, nullptr, tensor, first, n);
#pragma omp parallel for schedule(static) if (c_hi - c_lo > 64)
  for (int64_t c = c_lo; c < c_hi; ++c) {
    const int64_t l0 = std::max<int64_t>(first - c * kChunk, 0);
    const int64_t l1 = std::min<int64_t>(end - c * kChunk, kChunk);
    zo_state_chunk(theta, m, v, first, c, l0, l1, tensor, upd, src.data(), n_update, o, round);
  }
}

template <class T>
void zo_update_state_typed(T* theta, float* m, float* v, int64_t n, uint32_t tensor,
                           int64_t first, const ZOUpdateTerm* upd, int n_update,
                           const ZOOptimizer& o, const ZKey* round) {
  const int64_t band = z_band(upd, n_update, nullptr, n);
  for (int64_t b = 0; b < n; b += band)
    zo_update_state_band(theta + b, m + b, v ? v + b : nullptr, std::min(band, n - b), tensor,
                         first + b, upd, n_update, o, round);
}

void check_theta(const Theta& theta, int n_update, const ZKey* round) {
  ZOF_CHECK(theta.dtype == DType::F32 || theta.dtype == DType::BF16,
            std::string("a master is held in fp32 or bf16, not ") + dtype_name(theta.dtype));
  // A bf16 master's update is rounded stochastically: a value it can store exactly.
  ZOF_ASSERT(theta.dtype == DType::F32 || n_update <= 0 || round);
}
}  // namespace

void zo_update_state(Theta theta, float* m, float* v, int64_t n, uint32_t tensor, int64_t first,
                     const ZOUpdateTerm* upd, int n_update, const ZOOptimizer& o,
                     const ZKey* round) {
  if (n <= 0 || n_update <= 0) return;
  check_theta(theta, n_update, round);
  if (theta.dtype == DType::BF16)
    zo_update_state_typed(theta.bf16(), m, v, n, tensor, first, upd, n_update, o, round);
  else
    zo_update_state_typed(theta.f32(), m, v, n, tensor, first, upd, n_update, o, round);
}

namespace {
template <class C, class T>
void zo_pass_band(T* theta, int64_t n, uint32_t tensor, int64_t first,
                  const ZOUpdateTerm* upd, int n_update, float lr_wd, const ZKey* round,
                  const ZKey* cur, float eps, C* plus, C* minus) {
  const int64_t end = first + n;
  const int64_t c_lo = first / kChunk, c_hi = (end + kChunk - 1) / kChunk;
  // Copies too big for the caches go out with streaming stores; smaller ones (an LM-head chunk
  // read right away by its GEMM) stay in cache.
  const bool stream = n >= kStreamingStoreMin;
  const std::vector<ZSource> src = z_sources(upd, n_update, cur, tensor, first, n);
#pragma omp parallel if (c_hi - c_lo > 64)
  {
#pragma omp for schedule(static)
    for (int64_t c = c_lo; c < c_hi; ++c) {
      const int64_t l0 = std::max<int64_t>(first - c * kChunk, 0);
      const int64_t l1 = std::min<int64_t>(end - c * kChunk, kChunk);
      zo_chunk(theta, first, c, l0, l1, tensor, upd, n_update, lr_wd, round, cur, src.data(),
               eps, plus, minus, stream);
    }
#if defined(__AVX512F__)
    _mm_sfence();  // each thread's streaming stores are visible before the copies are read
#endif
  }
}

template <class C, class T>
void zo_pass_typed(T* theta, int64_t n, uint32_t tensor, int64_t first,
                   const ZOUpdateTerm* upd, int n_update, float lr_wd, const ZKey* round,
                   const ZKey* cur, float eps, C* plus, C* minus) {
  const int64_t band = z_band(upd, n_update, cur, n);
  for (int64_t b = 0; b < n; b += band)
    zo_pass_band(theta + b, std::min(band, n - b), tensor, first + b, upd, n_update, lr_wd,
                 round, cur, eps, plus ? plus + b : nullptr, minus ? minus + b : nullptr);
}
}  // namespace

namespace {
template <class T>
void zo_pass_theta(T* theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
                   int n_update, float lr_wd, const ZKey* cur, float eps, void* plus, void* minus,
                   DType copy_t, const ZKey* round) {
  if (copy_t == DType::BF16)
    zo_pass_typed(theta, n, tensor, first, upd, n_update, lr_wd, round, cur, eps,
                  static_cast<uint16_t*>(plus), static_cast<uint16_t*>(minus));
  else
    zo_pass_typed(theta, n, tensor, first, upd, n_update, lr_wd, round, cur, eps,
                  static_cast<float*>(plus), static_cast<float*>(minus));
}
}  // namespace

void zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
             int n_update, float lr_wd, const ZKey* cur, float eps, void* plus, void* minus,
             DType copy_t, const ZKey* round) {
  if (n <= 0 || (n_update <= 0 && !cur)) return;
  ZOF_CHECK(copy_t == DType::F32 || copy_t == DType::BF16,
            std::string("the ZO pass writes fp32 or bf16 copies, not ") + dtype_name(copy_t));
  check_theta(theta, n_update, round);
  if (theta.dtype == DType::BF16)
    zo_pass_theta(theta.bf16(), n, tensor, first, upd, n_update, lr_wd, cur, eps, plus, minus,
                  copy_t, round);
  else
    zo_pass_theta(theta.f32(), n, tensor, first, upd, n_update, lr_wd, cur, eps, plus, minus,
                  copy_t, round);
}

bool z_from_words16_avx2(const ZKey& key, const uint32_t* c0, const uint32_t* c1,
                         const uint32_t* c2, const uint32_t* c3, float* out) {
#if defined(ZOF_HAVE_AVX2_Z)
  if (!cpu_has_avx2_fma()) return false;
  z_from_words16_avx2_impl(key, c0, c1, c2, c3, out);
  return true;
#else
  return false;
#endif
}

bool z64_avx2(const ZKey& key, uint32_t tensor, uint32_t g0, float* z, uint32_t* round_words) {
#if defined(ZOF_HAVE_AVX2_Z)
  if (!cpu_has_avx2_fma()) return false;
  z_chunk64_avx2(key, tensor, g0, z);
  ZKey k;
  k.seed = key.seed, k.step = key.step, k.query = kRoundQuery;
  round_bits64_avx2(k, tensor, g0, round_words);
  return true;
#else
  return false;
#endif
}

void z_from_words16(const ZKey& key, const uint32_t* c0, const uint32_t* c1, const uint32_t* c2,
                    const uint32_t* c3, float* out) {
#if defined(__AVX512F__)
  if (key.dist == kZRademacher)
    rademacher16(c0, c1, c2, c3, out);
  else
    box_muller16_avx512(c0, c1, c2, c3, out);
#elif defined(ZOF_ZO_AVX2)
  z_from_words16_avx2_impl(key, c0, c1, c2, c3, out);
#else
  if (key.dist == kZRademacher)
    rademacher16(c0, c1, c2, c3, out);
  else
    box_muller16(c0, c1, c2, c3, out);
#endif
}

const char* zo_pass_isa() {
#if defined(__AVX512F__)
  return "avx512";
#elif defined(ZOF_ZO_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

void zo_rows(Theta theta, int64_t width, const int32_t* rows, int64_t n_rows, uint32_t tensor,
             const ZKey& cur, float eps, float* plus, float* minus) {
  for (int64_t k = 0; k < n_rows; ++k) {
    const int64_t first = int64_t(rows[k]) * width;
    // No update terms: theta is only read.
    zo_pass(theta.at(first), width, tensor, first, nullptr, 0, 0.f, &cur, eps, plus + k * width,
            minus ? minus + k * width : nullptr);
  }
}

}  // namespace zof::cpu
