// Zeroth-order parameter passes on host memory: the pending update and the next perturbation in
// one read of theta, with z regenerated from Philox (never stored). Chunks of 64 elements use
// the lane-parallel z_groups16 (vectorized), the tail the scalar z_group: the same bits.
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>

#include "zof/backend.h"

// Box-Muller's float math vectorizes across 16 lanes; let GCC use full 512-bit vectors here.
#pragma GCC target("prefer-vector-width=512")
// GCC 12 reports the _mm512_undefined_epi32() pass-through operands inside its own AVX-512
// intrinsic headers as "maybe uninitialized" once these helpers are inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace zof {
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
#endif

inline void z_chunk64(const ZKey& key, uint32_t tensor, uint32_t g0, float* out) {
#if defined(__AVX512F__)
  alignas(64) uint32_t c0[16], c1[16], c2[16], c3[16];
  philox16_avx512(key, tensor, g0, c0, c1, c2, c3);
  box_muller16(c0, c1, c2, c3, out);
#else
  z_groups16(key, tensor, g0, out);
#endif
}

constexpr int64_t kChunk = 64;  // elements per z_groups16 call

// Elements [c * kChunk + l0, c * kChunk + l1) of the tensor (absolute indices), 0 <= l0 < l1 <=
// kChunk; theta/plus/minus point at element `first`. z is generated for the whole aligned chunk
// (generating past the tensor's end is harmless: z is a pure function of the counter), so a pass
// over any sub-range gives the same bits as a pass over the whole tensor.
inline void zo_chunk(float* theta, int64_t first, int64_t c, int64_t l0, int64_t l1,
                     uint32_t tensor, const ZOUpdateTerm* upd, int n_update, float lr_wd,
                     const ZKey* cur, float eps, float* plus, float* minus) {
  alignas(64) float th[kChunk], z[kChunk];
  const int64_t base = c * kChunk - first;  // theta[base + l] is the chunk's element l
  auto gen = [&](const ZKey& key) { z_chunk64(key, tensor, (uint32_t)(c * (kChunk / 4)), z); };
  for (int64_t l = l0; l < l1; ++l) th[l] = theta[base + l];
  if (n_update > 0) {
    alignas(64) float acc[kChunk];
    for (int64_t l = l0; l < l1; ++l) acc[l] = lr_wd * th[l];
    for (int j = 0; j < n_update; ++j) {
      gen(upd[j].key);
      const float k = upd[j].coef;
      for (int64_t l = l0; l < l1; ++l) acc[l] = fmaf(k, z[l], acc[l]);
    }
    for (int64_t l = l0; l < l1; ++l) theta[base + l] = th[l] = th[l] - acc[l];
  }
  if (cur) {
    gen(*cur);
    if (plus)
      for (int64_t l = l0; l < l1; ++l) plus[base + l] = zo_perturbed(th[l], z[l], eps);
    if (minus)
      for (int64_t l = l0; l < l1; ++l) minus[base + l] = zo_perturbed(th[l], z[l], -eps);
  }
}

}  // namespace

void zo_pass_host(float* theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
                  int n_update, float lr_wd, const ZKey* cur, float eps, float* plus,
                  float* minus) {
  if (n <= 0 || (n_update <= 0 && !cur)) return;
  const int64_t end = first + n;
  const int64_t c_lo = first / kChunk, c_hi = (end + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (c_hi - c_lo > 64)
  for (int64_t c = c_lo; c < c_hi; ++c) {
    const int64_t l0 = std::max<int64_t>(first - c * kChunk, 0);
    const int64_t l1 = std::min<int64_t>(end - c * kChunk, kChunk);
    zo_chunk(theta, first, c, l0, l1, tensor, upd, n_update, lr_wd, cur, eps, plus, minus);
  }
}

void Backend::zo_pass(float* theta, int64_t n, uint32_t tensor, int64_t first,
                      const ZOUpdateTerm* upd, int n_update, float lr_wd, const ZKey* cur,
                      float eps, float* plus, float* minus, Stream*) {
  zo_pass_host(theta, n, tensor, first, upd, n_update, lr_wd, cur, eps, plus, minus);
}

}  // namespace zof
