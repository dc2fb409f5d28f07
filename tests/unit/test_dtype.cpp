// The fp16/bf16 <-> fp32 conversions of zof/dtype.h: exhaustive over all 16-bit inputs, and for
// fp32 -> 16 bit against an independent rounding reference (and the compiler's _Float16 if any).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "zof/dtype.h"

namespace {

using zof::bf16_to_f32;
using zof::f16_to_f32;
using zof::f32_to_bf16;
using zof::f32_to_f16;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value of an f16 bit pattern computed from the definition, in double.
double f16_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v;
  if (exp == 0) v = std::ldexp(double(mant), -24);
  else if (exp == 31) v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else v = std::ldexp(1024.0 + mant, exp - 25);
  return sign ? -v : v;
}

// Round-to-nearest-even to f16 by search over the finite f16 values, in double: slow, obviously
// right. Values at or past 65520 (halfway from 65504 to 2^16) go to inf, as IEEE says.
uint16_t f16_reference(float f) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7c00;
  // Largest magnitude pattern <= a (patterns of positive f16s order like their values).
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {
    uint16_t mid = uint16_t((lo + hi + 1) / 2);
    if (f16_value(mid) <= a) lo = mid;
    else hi = uint16_t(mid - 1);
  }
  if (f16_value(lo) == a) return sign | lo;
  const uint16_t up = uint16_t(lo + 1);
  const double dl = a - f16_value(lo), du = f16_value(up) - a;
  if (dl < du) return sign | lo;
  if (du < dl) return sign | up;
  return sign | ((lo & 1) ? up : lo);
}

// Round-to-nearest-even to bf16 in double: the candidates are the truncation and the next pattern.
uint16_t bf16_reference(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const uint32_t u = bits(f);
  const uint16_t lo = uint16_t(u >> 16), up = uint16_t(lo + 1);
  if ((u & 0xffff) == 0) return lo;
  const double a = std::fabs(double(f));
  const double vl = std::fabs(double(bf16_to_f32(lo)));
  // up may be inf (0x7f80 with sign): its "value" for rounding is 2^128.
  const double vu = (up & 0x7fff) == 0x7f80 ? std::ldexp(1.0, 128) : std::fabs(double(bf16_to_f32(up)));
  const double dl = a - vl, du = vu - a;
  if (dl < du) return lo;
  if (du < dl) return up;
  return (lo & 1) ? up : lo;
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(zof::dtype_size(zof::DType::F32), 4u);
  EXPECT_EQ(zof::dtype_size(zof::DType::F16), 2u);
  EXPECT_EQ(zof::dtype_size(zof::DType::BF16), 2u);
  EXPECT_STREQ(zof::dtype_name(zof::DType::BF16), "BF16");
  EXPECT_STREQ(zof::dtype_torch_name(zof::DType::F16), "float16");
}

TEST(DType, F16ToF32AllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    const double want = f16_value(uint16_t(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(bits(f) >> 31, h >> 15) << std::hex << h;  // sign kept
      continue;
    }
    ASSERT_EQ(double(f), want) << std::hex << h;
    ASSERT_EQ(std::signbit(f), bool(h & 0x8000)) << std::hex << h;
  }
}

TEST(DType, F16RoundTripAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    const uint16_t back = f32_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back & 0x7fff, 0x7e00) << std::hex << h;
      continue;
    }
    ASSERT_EQ(back, h) << std::hex << h;
  }
}

TEST(DType, F16EdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f16(0.f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_f16(inf), 0x7c00);
  EXPECT_EQ(f32_to_f16(-inf), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::quiet_NaN()) & 0x7fff, 0x7e00);
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);           // largest finite
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);         // just under the halfway point
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);           // tie, rounds to even = inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -24)), 0x0001);          // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -25)), 0x0000);          // tie with 0: to even
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.f, -25), 1.f)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.f, -25)), 0x0002);          // 1.5 units: tie to even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(5.f, -25)), 0x0002);          // 2.5 units: tie to even (2)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.f, -14)), 0x0400);          // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);      // largest subnormal + half: rounds up to normal
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(f32_to_f16(1.f + std::ldexp(1.f, -11)), 0x3c00);    // tie between 1 and 1+2^-10: even
  EXPECT_EQ(f32_to_f16(1.f + 3 * std::ldexp(1.f, -11)), 0x3c02);  // tie: even is the upper one
  EXPECT_EQ(f32_to_f16(2047.5f), 0x6800);  // 2047.5 ties between 2047 and 2048 (odd->even 2048)
}

// Every f16 value, and the midpoints and their float neighbours on both sides, against the
// reference: covers every rounding boundary.
TEST(DType, F32ToF16AtEveryBoundary) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double v = f16_value(uint16_t(h)), next = f16_value(uint16_t(h + 1));
    const double mids[] = {v, (v + next) / 2};
    for (double m : mids) {
      const float c = float(m);  // exact: midpoints of f16 values are floats
      ASSERT_EQ(double(c), m);
      for (float f : {c, std::nextafter(c, 0.f), std::nextafter(c, 1e30f)})
        for (float s : {f, -f}) ASSERT_EQ(f32_to_f16(s), f16_reference(s)) << s;
    }
  }
}

// A sweep over all float exponents and a spread of mantissas, against the reference.
TEST(DType, F32ToF16Sweep) {
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) {  // prime stride: varied mantissas
    const float f = from_bits(uint32_t(u));
    const uint16_t got = f32_to_f16(f), want = f16_reference(f);
    if (std::isnan(f)) ASSERT_EQ(got & 0x7fff, 0x7e00);
    else ASSERT_EQ(got, want) << std::hex << u;
  }
}

#if defined(__FLT16_MAX__)
// The compiler's _Float16 conversion rounds to nearest even in hardware or libgcc.
TEST(DType, F32ToF16MatchesCompilerFloat16) {
  auto native = [](float f) {
    _Float16 h = static_cast<_Float16>(f);
    uint16_t r;
    std::memcpy(&r, &h, 2);
    return r;
  };
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) {
    const float f = from_bits(uint32_t(u));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), native(f)) << std::hex << u;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 x;
    const uint16_t hh = uint16_t(h);
    std::memcpy(&x, &hh, 2);
    const float want = static_cast<float>(x), got = f16_to_f32(hh);
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(got));
    else ASSERT_EQ(bits(got), bits(want)) << std::hex << h;
  }
}
#endif

TEST(DType, BF16ToF32AllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) ASSERT_EQ(bits(bf16_to_f32(uint16_t(h))), h << 16);
}

TEST(DType, BF16RoundTripAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(uint16_t(h));
    const uint16_t back = f32_to_bf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(back))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(back, h) << std::hex << h;
  }
}

TEST(DType, BF16EdgeCases) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80);
  EXPECT_EQ(f32_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(f32_to_bf16(1.f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, lower is even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, upper is even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);  // just past the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fff)), 0x3f80);  // just before it
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fff)), 0x7f7f);               // stays finite
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);  // subnormal tie, upper is even
  // Every NaN stays NaN, including signalling NaNs whose payload sits in the low 16 bits only.
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const uint16_t b = f32_to_bf16(from_bits(u));
    EXPECT_TRUE(std::isnan(bf16_to_f32(b))) << std::hex << u;
  }
}

TEST(DType, F32ToBF16Sweep) {
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 65521) {
    const float f = from_bits(uint32_t(u));
    const uint16_t got = f32_to_bf16(f);
    if (std::isnan(f)) ASSERT_TRUE(std::isnan(bf16_to_f32(got)));
    else ASSERT_EQ(got, bf16_reference(f)) << std::hex << u;
  }
  // Every tie and its neighbours.
  for (uint32_t h = 0; h < 0x7f80; ++h)
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u})
      for (uint32_t s : {0u, 0x80000000u}) {
        const float f = from_bits(s | h << 16 | low);
        ASSERT_EQ(f32_to_bf16(f), bf16_reference(f)) << std::hex << (s | h << 16 | low);
      }
}

}  // namespace
