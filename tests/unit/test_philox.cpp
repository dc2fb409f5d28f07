// Philox4x32-10 against Random123's published known-answer vectors, and the normals built on it.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common.h"
#include "util/philox.h"

namespace {

void expect_block(zof::Philox4x32 b, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3) {
  EXPECT_EQ(b.v[0], a0);
  EXPECT_EQ(b.v[1], a1);
  EXPECT_EQ(b.v[2], a2);
  EXPECT_EQ(b.v[3], a3);
}

TEST(Philox, Random123KnownAnswers) {
  expect_block(zof::philox4x32_10(0, 0, 0, 0, 0, 0), 0x6627e8d5, 0xe169c58d, 0xbc57ac4c,
               0x9b00dbd8);
  expect_block(zof::philox4x32_10(0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
                                  0xffffffff),
               0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
  expect_block(zof::philox4x32_10(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822,
                                  0x299f31d0),
               0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1);
}

TEST(Philox, LogMatchesLibm) {
  double worst = 0;
  for (uint32_t i = 1; i <= (1u << 24); i += 97) {
    const float u = (float)i * 5.9604644775390625e-08f;
    const double ref = std::log((double)u);
    const double got = zof::zof_log_unit(u);
    worst = std::max(worst, std::fabs(got - ref) / std::max(1e-30, std::fabs(ref)));
    if (i == 1u << 24) break;
  }
  EXPECT_EQ(zof::zof_log_unit(1.f), 0.f);
  EXPECT_LT(worst, 4e-7);  // ~3 ulp
}

TEST(Philox, SinCosMatchLibm) {
  double worst = 0;
  for (uint32_t i = 0; i < (1u << 24); i += 101) {
    const float x = (float)i * 5.9604644775390625e-08f;
    float s, c;
    zof::zof_sincos_2pi(x, s, c);
    worst = std::max(worst, std::fabs(s - std::sin(2 * M_PI * (double)x)));
    worst = std::max(worst, std::fabs(c - std::cos(2 * M_PI * (double)x)));
  }
  EXPECT_LT(worst, 5e-7);
}

TEST(Philox, NormalsHaveUnitMoments) {
  zof::ZKey key{1234, 7, 0};
  const int n = 1 << 20;
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  int beyond3 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = zof::z_element(key, 3, i);
    ASSERT_TRUE(std::isfinite(z));
    s1 += z;
    s2 += z * z;
    s3 += z * z * z;
    s4 += z * z * z * z;
    beyond3 += std::fabs(z) > 3;
  }
  const double mean = s1 / n, var = s2 / n - mean * mean;
  // Standard errors for n = 2^20: mean 1e-3, var 1.4e-3, skew 2.4e-3, kurtosis 4.8e-3.
  EXPECT_NEAR(mean, 0, 5e-3);
  EXPECT_NEAR(var, 1, 7e-3);
  EXPECT_NEAR(s3 / n, 0, 1.5e-2);
  EXPECT_NEAR(s4 / n, 3, 3e-2);
  EXPECT_NEAR(beyond3 / (double)n, 0.0027, 0.0005);
}

TEST(Philox, StreamsAreIndependentOfEachOther) {
  // Different (seed, step, query, tensor) give uncorrelated streams; the same give equal ones.
  const int n = 1 << 16;
  auto corr = [&](zof::ZKey a, uint32_t ta, zof::ZKey b, uint32_t tb) {
    double s = 0;
    for (int i = 0; i < n; ++i) s += zof::z_element(a, ta, i) * zof::z_element(b, tb, i);
    return s / n;
  };
  zof::ZKey base{42, 3, 1};
  // The same key regenerates the same stream bit for bit: a key built anew, walked backwards
  // (a generator that carried state from call to call, or depended on call order, differs).
  std::vector<float> first(n);
  for (int i = 0; i < n; ++i) first[i] = zof::z_element(base, 0, i);
  const zof::ZKey again{42, 3, 1};
  int differ = 0;
  for (int i = n - 1; i >= 0; --i) differ += zof::z_element(again, 0, i) != first[i];
  EXPECT_EQ(differ, 0);
  // Over 2^16 elements the mean of z z' of independent streams has standard error 2^-8
  // (0.0039) and the mean of z^2 sqrt(2) 2^-8 (0.0055): 0.02 is more than 3.5 of either.
  EXPECT_NEAR(corr(base, 0, base, 0), 1, 0.02);
  EXPECT_NEAR(corr(base, 0, base, 1), 0, 0.02);
  EXPECT_NEAR(corr(base, 0, zof::ZKey{43, 3, 1}, 0), 0, 0.02);
  EXPECT_NEAR(corr(base, 0, zof::ZKey{42, 4, 1}, 0), 0, 0.02);
  EXPECT_NEAR(corr(base, 0, zof::ZKey{42, 3, 2}, 0), 0, 0.02);
  EXPECT_NEAR(corr(base, 0, zof::ZKey{1ull << 40 | 42, 3, 1}, 0), 0, 0.02);
}

TEST(Philox, GroupAndElementAgree) {
  zof::ZKey key{99, 1, 0};
  float g[4];
  zof::z_group(key, 5, 10, g);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g[i], zof::z_element(key, 5, 40 + i));
}

}  // namespace

#include "cpu/cpu_zo.h"
#include "zof/backend.h"

namespace {

// The vectorized host pass (64-element chunks through z_groups16 / AVX-512, scalar tails)
// regenerates exactly the scalar z: with theta = 0 and eps = 1, plus = z.
TEST(Philox, VectorizedPassEqualsScalarZ) {
  // 2^21 + 4099: large enough for the streaming stores of the perturbed copies.
  for (int64_t n : {1, 3, 4, 63, 64, 65, 1000, 4099, (1 << 21) + 4099}) {
    // 64-byte aligned outputs, as the engine's buffers are (the streaming-store path needs it).
    std::vector<float> theta(n, 0.f), pbuf(n + 16), mbuf(n + 16);
    auto align64 = [](float* p) { return (float*)(((uintptr_t)p + 63) & ~uintptr_t(63)); };
    float *plus = align64(pbuf.data()), *minus = align64(mbuf.data());
    const zof::ZKey key{0xabcdef12345ull, 17, 2};
    zof::cpu::zo_pass(theta.data(), n, 9, 0, nullptr, 0, 0.f, &key, 1.f, plus, minus);
    for (int64_t i = 0; i < n; ++i) {
      const float z = zof::z_element(key, 9, (uint64_t)i);
      ASSERT_EQ(plus[i], z) << "n=" << n << " i=" << i;
      ASSERT_EQ(minus[i], -z) << "n=" << n << " i=" << i;
    }
  }
  float a[64], b[64];
  zof::z_groups16(zof::ZKey{5, 6, 7}, 8, 1000, a);
  for (int g = 0; g < 16; ++g) zof::z_group(zof::ZKey{5, 6, 7}, 8, 1000 + g, b + 4 * g);
  EXPECT_EQ(0, std::memcmp(a, b, sizeof a));
}

// The host pass's vector math (AVX2's intrinsics where the build has them) on every input it
// can see: each of a block's four words swept over all 2^24 values that reach the floats (the
// top 24 bits; the low 8 vary too), bit for bit against the scalar Box-Muller of philox.h, and
// the Rademacher signs on both sides of the top bit.
// This build's pass (AVX-512, AVX2 or portable) and, on every x86 CPU with AVX2 and FMA, the
// AVX2 code whatever the build's pass is. The Rademacher signs (one bit) on a sample.
bool x86_with_avx2() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

void sweep_vector_math(bool avx2) {
  SCOPED_TRACE(avx2 ? std::string("the AVX2 path") : std::string("host pass: ") + zof::cpu::zo_pass_isa());
  constexpr uint32_t kValues = 1u << 24;
  alignas(64) uint32_t c[4][16];
  alignas(64) float got[64];
  zof::ZKey gauss, rad;
  rad.dist = zof::kZRademacher;
  int64_t mismatches = 0;
  for (uint32_t v0 = 0; v0 < kValues; v0 += 16) {
    for (int l = 0; l < 16; ++l) {
      const uint32_t v = v0 + (uint32_t)l;
      c[0][l] = v << 8 | (v & 0xff);                        // u1 of the first pair: every value
      c[1][l] = v << 8;                                     // u2 of the first pair
      c[2][l] = (kValues - 1 - v) << 8 | 0x80;              // u1 of the second, descending
      c[3][l] = ((v * 2654435761u) & (kValues - 1)) << 8;  // u2 of the second, permuted
    }
    for (const zof::ZKey& key : {gauss, rad}) {
      if (key.dist == zof::kZRademacher && v0 % 4096 != 0) continue;  // the signs: a sample
      if (avx2)
        ASSERT_TRUE(zof::cpu::z_from_words16_avx2(key, c[0], c[1], c[2], c[3], got));
      else
        zof::cpu::z_from_words16(key, c[0], c[1], c[2], c[3], got);
      for (int l = 0; l < 16; ++l) {
        float want[4];
        const zof::Philox4x32 b{{c[0][l], c[1][l], c[2][l], c[3][l]}};
        if (key.dist == zof::kZRademacher)
          zof::zof_rademacher4(b.v, want);
        else
          zof::zof_box_muller4(b, want);
        if (std::memcmp(want, got + 4 * l, sizeof want) != 0 && mismatches++ < 5)
          ADD_FAILURE() << "words " << c[0][l] << " " << c[1][l] << " " << c[2][l] << " "
                        << c[3][l] << " dist " << key.dist << ": " << want[0] << " " << want[1]
                        << " " << want[2] << " " << want[3] << " vs " << got[4 * l] << " "
                        << got[4 * l + 1] << " " << got[4 * l + 2] << " " << got[4 * l + 3];
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// No AVX2 on a CI machine (all x86 with AVX2) fails instead of skipping: the path would go
// untested there without a trace.
void need_avx2() {
  if (x86_with_avx2()) return;
  if (zof::test::in_ci()) FAIL() << "CI=true but this CPU has no AVX2 and FMA to test the AVX2 path";
  GTEST_SKIP() << "no x86 CPU with AVX2 and FMA: the AVX2 path cannot run";
}

TEST(Philox, HostVectorMathEqualsScalarOnEveryInput) {
  ASSERT_NO_FATAL_FAILURE(sweep_vector_math(false));
  // The AVX2 code again where the build's pass is another (AVX-512's, or the portable loops).
  if (std::string(zof::cpu::zo_pass_isa()) != "avx2") {
    ASSERT_NO_FATAL_FAILURE(need_avx2());
    if (IsSkipped()) return;
    ASSERT_NO_FATAL_FAILURE(sweep_vector_math(true));
  }
}

// The AVX2 Philox, normals and rounding words from keys of every field's range, at counters
// that wrap past 2^32 groups (element 2^34), against the scalar z_group and round_bits_group:
// on every x86 CPU with AVX2 (all this project's CI machines), whatever path the build's pass
// takes; the pass's own path is held to the same through zo_pass below.
TEST(Philox, Avx2PathEqualsScalarAtAnyKeyAndCounter) {
  ASSERT_NO_FATAL_FAILURE(need_avx2());
  if (IsSkipped()) return;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x] {  // splitmix64
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  alignas(64) float z[64];
  alignas(64) uint32_t w[64];
  for (int it = 0; it < 20000; ++it) {
    zof::ZKey key{next(), (uint32_t)next(), (uint32_t)next()};
    key.dist = it % 5 == 4 ? zof::kZRademacher : zof::kZGaussian;
    const uint32_t tensor = (uint32_t)next();
    const uint32_t g0 = it % 2 ? (uint32_t)next() : 0xFFFFFFFFu - (uint32_t)(it % 31);  // wraps
    ASSERT_TRUE(zof::cpu::z64_avx2(key, tensor, g0, z, w));
    for (int g = 0; g < 16; ++g) {
      float want[4];
      uint32_t bits[4];
      zof::z_group(key, tensor, g0 + (uint32_t)g, want);
      zof::round_bits_group(key.seed, key.step, tensor, g0 + (uint32_t)g, bits);
      ASSERT_EQ(0, std::memcmp(want, z + 4 * g, sizeof want)) << "key " << it << " group " << g;
      ASSERT_EQ(0, std::memcmp(bits, w + 4 * g, sizeof bits)) << "key " << it << " group " << g;
    }
  }
}

// The build's pass across the counter's wrap: elements around 2^34 (group 2^32) of a tensor, a
// pass that starts there with theta = 0 and eps = 1 gives plus = z(element) for 64-bit
// elements as z_element computes them.
TEST(Philox, PassAcrossTheCounterWrapEqualsScalarZ) {
  const int64_t first = (int64_t(1) << 34) - 100, n = 300;
  std::vector<float> theta(n, 0.f), plus(n), minus(n);
  for (uint32_t dist : {zof::kZGaussian, zof::kZRademacher}) {
    zof::ZKey key{0x0123456789abcdefull, 4000000000u, 7};
    key.dist = dist;
    zof::cpu::zo_pass(theta.data(), n, 3, first, nullptr, 0, 0.f, &key, 1.f, plus.data(),
                      minus.data());
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(plus[i], zof::z_element(key, 3, (uint64_t)(first + i))) << "element " << first + i;
  }
}

}  // namespace

namespace {

// A pass over elements [first, first + n) of a tensor, at any alignment, gives the same bits as
// that range of a whole-tensor pass: the update, the perturbations and the untouched rest.
TEST(Philox, SubRangePassEqualsWholePass) {
  const int64_t total = 1000;
  const zof::ZKey cur{77, 3, 1};
  const zof::ZOUpdateTerm upd[2] = {{zof::ZKey{77, 2, 0}, 0.25f}, {zof::ZKey{77, 2, 1}, -0.5f}};
  std::vector<float> theta0(total);
  for (int64_t i = 0; i < total; ++i) theta0[i] = 0.001f * (float)(i % 97) - 0.03f;
  std::vector<float> whole = theta0, wp(total), wm(total);
  zof::cpu::zo_pass(whole.data(), total, 5, 0, upd, 2, 0.01f, &cur, 0.1f, wp.data(), wm.data());
  for (auto [first, n] : {std::pair<int64_t, int64_t>{0, 1000}, {1, 3}, {3, 70}, {63, 2},
                          {64, 64}, {130, 517}, {999, 1}, {5, 0}}) {
    std::vector<float> th = theta0, p(total, 7.f), m(total, 7.f);
    zof::cpu::zo_pass(th.data() + first, n, 5, first, upd, 2, 0.01f, &cur, 0.1f, p.data() + first,
                      m.data() + first);
    for (int64_t i = 0; i < total; ++i) {
      const bool in = i >= first && i < first + n;
      ASSERT_EQ(th[i], in ? whole[i] : theta0[i]) << first << "+" << n << " at " << i;
      ASSERT_EQ(p[i], in ? wp[i] : 7.f) << first << "+" << n << " at " << i;
      ASSERT_EQ(m[i], in ? wm[i] : 7.f) << first << "+" << n << " at " << i;
    }
  }
}

}  // namespace

#include "cpu/sim_device.h"

namespace {

// Backend::zo_rows (the batch's token-table rows in one call) gives each row the bits of a
// whole-tensor pass, at widths that put rows at every alignment to the groups of 4, with a Sparse
// MeZO mask, with and without the minus copy; on the CPU backend and on the simulated device
// (whose pointer checker sees only device memory).
TEST(Philox, RowPassEqualsWholePass) {
  for (int64_t width : {1, 7, 64, 13}) {
    const int64_t n_table = 11;
    std::vector<float> table(size_t(n_table * width));
    for (size_t i = 0; i < table.size(); ++i) table[i] = 0.01f * float(int(i % 23) - 11);
    zof::ZKey key{91, 4, 2};
    key.mask = 0.08f;  // some entries left alone
    std::vector<float> wp(table.size()), wm(table.size());
    std::vector<float> th = table;
    zof::cpu::zo_pass(th.data(), (int64_t)th.size(), 3, 0, nullptr, 0, 0.f, &key, 0.5f, wp.data(),
                      wm.data());
    const std::vector<int32_t> rows{0, 10, 3, 4, 9};
    const int64_t n = (int64_t)rows.size();
    auto cpu = zof::make_cpu_backend(1);
    auto sim = zof::make_sim_device(zof::make_cpu_backend(1), {});
    for (zof::Backend* be : {cpu.get(), static_cast<zof::Backend*>(sim.get())}) {
      for (bool with_minus : {true, false}) {
        float* d_table = (float*)be->alloc(table.size() * 4);
        int32_t* d_rows = (int32_t*)be->alloc(rows.size() * 4);
        float* d_p = (float*)be->alloc(size_t(n * width) * 4);
        float* d_m = (float*)be->alloc(size_t(n * width) * 4);
        be->copy_to_device(d_table, table.data(), table.size() * 4, nullptr);
        be->copy_to_device(d_rows, rows.data(), rows.size() * 4, nullptr);
        be->zo_rows(d_table, width, d_rows, n, 3, key, 0.5f, d_p, with_minus ? d_m : nullptr);
        std::vector<float> p(size_t(n * width)), m(size_t(n * width), 7.f);
        be->copy_to_host(p.data(), d_p, p.size() * 4, nullptr);
        if (with_minus) be->copy_to_host(m.data(), d_m, m.size() * 4, nullptr);
        be->synchronize(nullptr);
        for (int64_t k = 0; k < n; ++k)
          for (int64_t e = 0; e < width; ++e) {
            const size_t src = size_t(rows[k] * width + e), dst = size_t(k * width + e);
            ASSERT_EQ(p[dst], wp[src]) << be->name() << " width " << width << " row " << rows[k];
            if (with_minus) {
              ASSERT_EQ(m[dst], wm[src]) << be->name() << " width " << width << " row " << rows[k];
            }
          }
        for (void* q : {(void*)d_table, (void*)d_rows, (void*)d_p, (void*)d_m}) be->free(q);
      }
    }
    EXPECT_EQ(sim->stats().foreign, 0) << sim->stats().first_foreign;
    EXPECT_EQ(sim->stats().hazards, 0) << sim->stats().first_hazard;
  }
}

}  // namespace

// ---- stochastic rounding to bf16 (--master bf16) ----------------------------------------------
namespace {

float bf16_down(float x) {  // the bf16 value toward zero
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0xFFFF0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}
bool on_bf16_grid(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u & 0xFFFFu) == 0;
}

// Over all 2^16 values of the random bits, the rounded values average to x exactly (the
// definition of unbiased: an update far below an ulp is kept on average), and each is one of x's
// two bf16 neighbours, the upper one as often as x's 16 low bits say.
TEST(StochasticRounding, MeanOverAllBitsIsExactlyX) {
  std::vector<float> xs = {0.1f, -0.1f, 1.0f, 3.14159265f, -2.7182818f, 1e-30f, -7e-39f,
                           65504.5f, 3.3895e38f, 0.0f, -0.0f, 1.00000012f, 255.999985f};
  uint64_t s = 42;
  for (int i = 0; i < 200; ++i) {  // random bit patterns (finite), every exponent
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = uint32_t(s >> 32);
    if ((u & 0x7F800000u) == 0x7F800000u) u &= 0xBFFFFFFFu;
    float x;
    std::memcpy(&x, &u, 4);
    xs.push_back(x);
  }
  for (float x : xs) {
    const float lo = bf16_down(x);
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint32_t frac = u & 0xFFFFu;
    const uint32_t hu = (u & 0xFFFF0000u) + 0x10000u;  // the next bf16 away from zero
    float hi;
    std::memcpy(&hi, &hu, 4);
    double sum = 0;
    int up = 0;
    for (uint32_t r = 0; r < 65536; ++r) {
      const float y = zof::bf16_round_stochastic(x, r << 16);
      ASSERT_TRUE(on_bf16_grid(y)) << x;
      if (y != lo) {
        ++up;
        ASSERT_EQ(y, hi) << x;
      }
      sum += double(y);
    }
    EXPECT_EQ(uint32_t(up), frac) << x;
    if (std::isfinite(x) && std::fabs(x) < 3.38e38f) {
      EXPECT_EQ(sum / 65536.0, double(x)) << x;
    }
  }
}

TEST(StochasticRounding, SpecialValuesAndPureBits) {
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t r : {0u, 0x8000u << 16, 0xFFFFFFFFu}) {
    EXPECT_EQ(zof::bf16_round_stochastic(inf, r), inf);
    EXPECT_EQ(zof::bf16_round_stochastic(-inf, r), -inf);
    EXPECT_TRUE(std::isnan(zof::bf16_round_stochastic(std::nanf(""), r)));
    EXPECT_EQ(zof::bf16_round_stochastic(0.5f, r), 0.5f);  // on the grid: unchanged
  }
  // Bits: a pure function of (seed, step, tensor, group), apart from every z of the run.
  uint32_t a[4], b[4], c[4];
  zof::round_bits_group(7, 3, 2, 11, a);
  zof::round_bits_group(7, 3, 2, 11, b);
  EXPECT_EQ(0, std::memcmp(a, b, sizeof a));
  zof::round_bits_group(7, 4, 2, 11, c);
  EXPECT_NE(0, std::memcmp(a, c, sizeof a));
  const zof::Philox4x32 z = zof::philox4x32_10(11, 2, 3, 0, 7, 0);  // query 0's z stream
  EXPECT_NE(0, std::memcmp(a, z.v, sizeof a));
}

// Backend::round_bf16_stochastic on the CPU backend, the reference and the simulated device:
// the scalar formula's bits, for whole tensors and sub-ranges at any alignment.
TEST(StochasticRounding, BackendsGiveTheScalarBits) {
  const int64_t n = 1003;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = std::sin(0.37f * float(i)) * 0.05f + 1e-4f * float(i);
  zof::ZKey key;
  key.seed = 0x123456789ull, key.step = 17;
  std::vector<float> want(x);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t r[4];
    zof::round_bits_group(key.seed, key.step, 5, uint32_t(i / 4), r);
    want[i] = zof::bf16_round_stochastic(x[i], r[i % 4]);
  }
  auto cpu = zof::make_cpu_backend(2);
  auto ref = zof::make_reference_backend();
  auto sim = zof::make_sim_device(zof::make_cpu_backend(1), {});
  for (zof::Backend* be : {cpu.get(), ref.get(), static_cast<zof::Backend*>(sim.get())}) {
    for (int64_t first : {int64_t(0), int64_t(1), int64_t(6), int64_t(501)}) {
      const int64_t m = n - first - 2;
      float* d = (float*)be->alloc(size_t(m) * 4);
      be->copy_to_device(d, x.data() + first, size_t(m) * 4, nullptr);
      be->round_bf16_stochastic(d, m, 5, first, key);
      std::vector<float> got(static_cast<size_t>(m));
      be->copy_to_host(got.data(), d, size_t(m) * 4, nullptr);
      be->synchronize(nullptr);
      be->free(d);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data() + first, size_t(m) * 4))
          << be->name() << " from " << first;
    }
  }
  EXPECT_EQ(sim->stats().hazards, 0) << sim->stats().first_hazard;
}

// The fused pass of a bf16 master (round in zo_pass and zo_update_state): the same bits as the
// three passes it replaces (the update, round_bf16_stochastic, then the copies from the rounded
// theta), on every host backend, whole and over sub-ranges at any alignment, with fp32 and bf16
// copies, Sparse MeZO's mask, and through momentum and Adam's state.
TEST(StochasticRounding, FusedPassEqualsUpdateThenRoundThenCopies) {
  const int64_t total = 4099;
  std::vector<float> theta0(total);
  for (int64_t i = 0; i < total; ++i)
    theta0[i] = std::sin(0.61f * float(i)) * 0.04f + 1e-5f * float(i % 97);
  zof::ZKey round;
  round.seed = 0xFEEDull, round.step = 9;
  std::vector<zof::ZOUpdateTerm> terms;
  for (int j = 0; j < 3; ++j) {
    zof::ZKey k{0xFEEDull, 9, uint32_t(j)};
    k.mask = j == 2 ? 0.03f : std::numeric_limits<float>::infinity();
    terms.push_back({k, 2e-5f * float(j + 1) * (j % 2 ? -1.f : 1.f)});
  }
  zof::ZKey cur{0xFEEDull, 10, 0};
  const float lr_wd = 1e-6f, eps = 1e-3f;
  auto cpu = zof::make_cpu_backend(2);
  auto ref = zof::make_reference_backend();
  auto sim = zof::make_sim_device(zof::make_cpu_backend(1), {});
  for (zof::Backend* be : {cpu.get(), ref.get(), static_cast<zof::Backend*>(sim.get())}) {
    auto host = [&](const std::vector<float>& v) {
      float* d = (float*)be->alloc(v.size() * 4);
      be->copy_to_device(d, v.data(), v.size() * 4, nullptr);
      return d;
    };
    auto back = [&](const void* d, size_t bytes) {
      std::vector<uint8_t> out(bytes);
      be->copy_to_host(out.data(), d, bytes, nullptr);
      be->synchronize(nullptr);
      return out;
    };
    for (auto [first, n] : {std::pair<int64_t, int64_t>{0, total}, {3, 1001}, {65, 2000}}) {
      for (zof::DType ct : {zof::DType::F32, zof::DType::BF16}) {
        const size_t cb = size_t(n) * zof::dtype_size(ct);
        // Fused.
        float* a = host(theta0);
        void* ap = be->alloc(cb);
        void* am = be->alloc(cb);
        be->zo_pass(a + first, n, 7, first, terms.data(), 3, lr_wd, &round, &cur, eps, ap, am, ct);
        // Three passes.
        float* b = host(theta0);
        void* bp = be->alloc(cb);
        void* bm = be->alloc(cb);
        be->zo_pass(b + first, n, 7, first, terms.data(), 3, lr_wd, nullptr, 0.f, nullptr,
                    nullptr, zof::DType::F32);
        be->round_bf16_stochastic(b + first, n, 7, first, round);
        be->zo_pass(b + first, n, 7, first, nullptr, 0, 0.f, &cur, eps, bp, bm, ct);
        const std::string what =
            std::string(be->name()) + " first " + std::to_string(first) + " " + zof::dtype_name(ct);
        EXPECT_EQ(back(a, total * 4), back(b, total * 4)) << "theta, " << what;
        EXPECT_EQ(back(ap, cb), back(bp, cb)) << "plus, " << what;
        EXPECT_EQ(back(am, cb), back(bm, cb)) << "minus, " << what;
        // The update moved theta, and onto bf16 values.
        const auto th = back(a, total * 4);
        int64_t moved = 0, off_grid = 0;
        for (int64_t i = first; i < first + n; ++i) {
          float v;
          std::memcpy(&v, th.data() + 4 * i, 4);
          moved += v != theta0[i];
          uint32_t u;
          std::memcpy(&u, &v, 4);
          off_grid += (u & 0xFFFFu) != 0;
        }
        EXPECT_GT(moved, n / 2) << what;
        EXPECT_EQ(off_grid, 0) << what;
        for (void* p : {(void*)a, ap, am, (void*)b, bp, bm}) be->free(p);
      }
      // Through optimizer state.
      for (int kind : {zof::ZOOptimizer::Momentum, zof::ZOOptimizer::Adam}) {
        zof::ZOOptimizer o;
        o.kind = kind;
        o.lr = 1e-3f, o.wd = 1e-2f, o.bc1 = 10.f, o.bc2 = 1000.f;
        const std::vector<float> zeros(total, 0.f);
        float *a = host(theta0), *am = host(zeros), *av = host(zeros);
        float *b = host(theta0), *bm = host(zeros), *bv = host(zeros);
        be->zo_update_state(a + first, am + first, av + first, n, 7, first, terms.data(), 3, o,
                            &round);
        be->zo_update_state(b + first, bm + first, bv + first, n, 7, first, terms.data(), 3, o,
                            nullptr);
        be->round_bf16_stochastic(b + first, n, 7, first, round);
        const std::string what = std::string(be->name()) + " first " + std::to_string(first) +
                                 " optimizer " + std::to_string(kind);
        EXPECT_EQ(back(a, total * 4), back(b, total * 4)) << "theta, " << what;
        EXPECT_EQ(back(am, total * 4), back(bm, total * 4)) << "m, " << what;
        EXPECT_EQ(back(av, total * 4), back(bv, total * 4)) << "v, " << what;
        const std::vector<uint8_t> before((const uint8_t*)theta0.data(),
                                          (const uint8_t*)theta0.data() + total * 4);
        EXPECT_NE(back(a, total * 4), before) << "the update moved nothing, " << what;
        for (float* p : {a, am, av, b, bm, bv}) be->free(p);
      }
    }
  }
  EXPECT_EQ(sim->stats().hazards, 0) << sim->stats().first_hazard;
}

}  // namespace

namespace {

zof::ZKey low_rank_key(uint64_t seed, uint32_t step, uint32_t query, uint32_t rank,
                       uint32_t every, uint32_t cols) {
  zof::ZKey k{seed, step, query};
  k.rank = rank, k.rank_every = every, k.cols = cols;
  return k;
}

// LOZO's z (philox.h): element (i, j) of a matrix is sum_k U[i][k] V[j][k] / sqrt(r), the
// factors dense normals of their own counters (checked here in double against z_element of a
// dense key, the oracle of the whole stream); V is the same for rank_every steps and U new every
// step; a key without a rank or without a width (a vector) draws the dense z.
TEST(LowRank, ZIsTheProductOfItsFactors) {
  const uint32_t rows = 7, cols = 13, r = 3, tensor = 9;
  for (uint32_t step : {0u, 4u, 5u, 4000000001u}) {
    const zof::ZKey key = low_rank_key(0xfeedull << 32 | 7, step, 2, r, 5, cols);
    const zof::ZKey u_key{key.seed, step, 2}, v_key{key.seed, step / 5, 2};
    for (uint32_t i = 0; i < rows; ++i)
      for (uint32_t j = 0; j < cols; ++j) {
        double want = 0;
        for (uint32_t k = 0; k < r; ++k)
          want += (double)zof::z_element(u_key, tensor | (1u << 30), i * r + k) *
                  zof::z_element(v_key, tensor | (1u << 31), j * r + k);
        want /= std::sqrt(3.0);
        const float got = zof::z_element(key, tensor, i * cols + j);
        ASSERT_NEAR(got, want, 1e-5 * (1 + std::fabs(want))) << "step " << step << " (" << i
                                                              << ", " << j << ")";
        float g[4];
        zof::z_group(key, tensor, (i * cols + j) / 4, g);
        ASSERT_EQ(g[(i * cols + j) % 4], got);
      }
  }
  // V is shared by steps 5..9 of rank_every 5, U is not: the z of two such steps differ, but
  // their column factors agree.
  const zof::ZKey a = low_rank_key(1, 5, 0, 2, 5, cols), b = low_rank_key(1, 9, 0, 2, 5, cols),
                  c = low_rank_key(1, 10, 0, 2, 5, cols);
  EXPECT_EQ(zof::z_factor(a, tensor, zof::kZFactorV, 3), zof::z_factor(b, tensor, zof::kZFactorV, 3));
  EXPECT_NE(zof::z_factor(a, tensor, zof::kZFactorV, 3), zof::z_factor(c, tensor, zof::kZFactorV, 3));
  EXPECT_NE(zof::z_factor(a, tensor, zof::kZFactorU, 3), zof::z_factor(b, tensor, zof::kZFactorU, 3));
  EXPECT_NE(zof::z_element(a, tensor, 17), zof::z_element(b, tensor, 17));
  // Dense where there is no rank or no width.
  const zof::ZKey dense{1, 5, 0};
  for (uint64_t e : {0ull, 17ull, 1000ull}) {
    EXPECT_EQ(zof::z_element(low_rank_key(1, 5, 0, 2, 5, 0), tensor, e),
              zof::z_element(dense, tensor, e));
    EXPECT_EQ(zof::z_element(low_rank_key(1, 5, 0, 0, 5, cols), tensor, e),
              zof::z_element(dense, tensor, e));
  }
}

// The 1 / sqrt(r) keeps a low-rank z's entries at unit variance (the dense z's: --lr and --eps
// mean the same), and a rank-1 z is exactly rank one: every 2 x 2 minor vanishes.
TEST(LowRank, EntriesHaveUnitVarianceAndTheRank) {
  const int64_t rows = 512, cols = 384;
  for (uint32_t r : {1u, 2u, 8u}) {
    const zof::ZKey key = low_rank_key(42, 3, 0, r, 50, cols);
    double s1 = 0, s2 = 0;
    for (int64_t e = 0; e < rows * cols; ++e) {
      const double z = zof::z_element(key, 4, (uint64_t)e);
      s1 += z, s2 += z * z;
    }
    const double n = double(rows * cols);
    // mean z^2 is a product of two sample variances of 512 and 384 normals (about 7% each):
    // 0.3 is over 3 of their standard deviations.
    EXPECT_NEAR(s2 / n, 1.0, 0.3) << "rank " << r;
    EXPECT_NEAR(s1 / n, 0.0, 0.05) << "rank " << r;
  }
  const zof::ZKey one = low_rank_key(42, 3, 0, 1, 50, cols);
  auto z = [&](int64_t i, int64_t j) { return (double)zof::z_element(one, 4, uint64_t(i * cols + j)); };
  double worst = 0, scale = 0;
  for (int64_t i = 0; i + 1 < 40; ++i)
    for (int64_t j = 0; j + 1 < 40; ++j) {
      worst = std::max(worst, std::fabs(z(i, j) * z(i + 1, j + 1) - z(i, j + 1) * z(i + 1, j)));
      scale = std::max(scale, std::fabs(z(i, j) * z(i + 1, j + 1)));
    }
  EXPECT_LT(worst, 1e-6 * scale);
  const zof::ZKey dense{42, 3, 0};
  EXPECT_GT(std::fabs(zof::z_element(dense, 4, 0) * zof::z_element(dense, 4, cols + 1) -
                      zof::z_element(dense, 4, 1) * zof::z_element(dense, 4, cols)),
            1e-3);
}

// The CPU pass's low-rank z (its factors drawn once per pass into tables) is the scalar
// z_element's, bit for bit, over any sub-range (rows cut anywhere, chunks of 64 cut anywhere),
// with update terms of other steps (another V) and a perturbation, fp32 and bf16 copies, and
// through the optimizer-state pass.
TEST(LowRank, CpuPassEqualsScalarZAtAnyRange) {
  const int64_t rows = 37, cols = 29, total = rows * cols;
  const uint32_t tensor = 6;
  const zof::ZKey cur = low_rank_key(77, 3, 1, 2, 2, (uint32_t)cols);
  const zof::ZOUpdateTerm upd[2] = {{low_rank_key(77, 1, 0, 2, 2, (uint32_t)cols), 0.25f},
                                    {low_rank_key(77, 1, 1, 2, 2, (uint32_t)cols), -0.5f}};
  std::vector<float> theta0(total);
  for (int64_t i = 0; i < total; ++i) theta0[i] = 0.001f * (float)(i % 97) - 0.03f;
  const float lr_wd = 0.01f, eps = 0.1f;
  for (auto [first, n] : {std::pair<int64_t, int64_t>{0, total}, {1, 3}, {3, 70}, {63, 2},
                          {28, 31}, {130, 517}, {total - 1, 1}}) {
    SCOPED_TRACE(std::to_string(first) + "+" + std::to_string(n));
    std::vector<float> th = theta0, p(total, 7.f), m(total, 7.f);
    zof::cpu::zo_pass(th.data() + first, n, tensor, first, upd, 2, lr_wd, &cur, eps,
                      p.data() + first, m.data() + first);
    std::vector<uint16_t> pb(total, 0), mb(total, 0);
    std::vector<float> thb = theta0;
    zof::cpu::zo_pass(zof::Theta(thb.data() + first), n, tensor, first, upd, 2, lr_wd, &cur, eps,
                      pb.data() + first, mb.data() + first, zof::DType::BF16);
    for (int64_t i = first; i < first + n; ++i) {
      const uint64_t e = (uint64_t)i;
      // The pass's order: acc = lr_wd theta, then each term's fmaf, theta - acc.
      float acc = lr_wd * theta0[i];
      for (const auto& t : upd) acc = fmaf(t.coef, zof::z_element(t.key, tensor, e), acc);
      const float want = theta0[i] - acc;
      ASSERT_EQ(th[i], want) << i;
      ASSERT_EQ(thb[i], want) << i;
      const float z = zof::z_element(cur, tensor, e);
      ASSERT_EQ(p[i], zof::zo_perturbed(want, z, eps)) << i;
      ASSERT_EQ(m[i], zof::zo_perturbed(want, z, -eps)) << i;
      ASSERT_EQ(pb[i], zof::f32_to_bf16(zof::zo_perturbed(want, z, eps))) << i;
      ASSERT_EQ(mb[i], zof::f32_to_bf16(zof::zo_perturbed(want, z, -eps))) << i;
    }
    for (int64_t i = 0; i < total; ++i) {
      if (i < first || i >= first + n) {
        ASSERT_EQ(th[i], theta0[i]) << i;
      }
    }
    // Momentum through the state pass: gh = sum coef z, m = beta1 m + (gh + wd theta).
    zof::ZOOptimizer o;
    o.kind = zof::ZOOptimizer::Momentum;
    o.lr = 0.5f, o.beta1 = 0.8f, o.wd = 0.1f;
    std::vector<float> ts = theta0, ms(total, 0.25f);
    zof::cpu::zo_update_state(zof::Theta(ts.data() + first), ms.data() + first, nullptr, n,
                              tensor, first, upd, 2, o, nullptr);
    for (int64_t i = first; i < first + n; ++i) {
      float gh = 0.f;
      for (const auto& t : upd) gh = fmaf(t.coef, zof::z_element(t.key, tensor, (uint64_t)i), gh);
      const float mm = fmaf(o.beta1, 0.25f, fmaf(o.wd, theta0[i], gh));
      ASSERT_EQ(ms[i], mm) << i;
      ASSERT_EQ(ts[i], fmaf(-o.lr, mm, theta0[i])) << i;
    }
  }
}

// A pass large enough to run in bands of rows (the U tables' bound: 2^18 / r rows) and across
// the OpenMP team, after passes over other tensors and queries (the thread's cache of V tables):
// the scalar bits at the bands' edges and throughout.
TEST(LowRank, BandsAndThreadsGiveTheScalarBits) {
  const int64_t cols = 24, rows = 2 * (int64_t(1) << 18) / 8 + 77, total = rows * cols;
  std::vector<float> theta((size_t)total, 0.f), plus((size_t)total), other((size_t)total);
  for (uint32_t q : {0u, 1u}) {
    const zof::ZKey key = low_rank_key(5, 9, q, 8, 4, (uint32_t)cols);
    // Another tensor first, with the same key: its V must not be this one's.
    zof::cpu::zo_pass(theta.data(), total, 2, 0, nullptr, 0, 0.f, &key, 1.f, other.data(),
                      nullptr);
    zof::cpu::zo_pass(theta.data(), total, 3, 0, nullptr, 0, 0.f, &key, 1.f, plus.data(),
                      nullptr);
    const int64_t band = (int64_t(1) << 18) / 8 * cols;
    std::vector<int64_t> at;
    for (int64_t e = 0; e < total; e += 997) at.push_back(e);
    for (int64_t b : {band, 2 * band})
      for (int64_t d = -70; d < 70; ++d) at.push_back(b + d);
    at.push_back(total - 1);
    for (int64_t e : at) {
      ASSERT_EQ(plus[size_t(e)], zof::z_element(key, 3, (uint64_t)e)) << "query " << q << " at " << e;
      ASSERT_EQ(other[size_t(e)], zof::z_element(key, 2, (uint64_t)e)) << "query " << q << " at " << e;
    }
  }
}

}  // namespace
