// fp32 exp and erf written as branch-free straight-line code, so that GCC vectorizes the loops
// that call them (glibc's expf/erff are only vectorized under -ffast-math, which zof avoids).
// Both are within a few ulp of the correctly rounded result; tests/unit/test_ops.cpp checks them
// against the double reference through every op that uses them.
#pragma once
#include <bit>
#include <cstdint>
#include <limits>

namespace zof::cpu {

// Cephes expf: Cody-Waite reduction x = n ln2 + r, degree-6 polynomial for e^r, 2^n from the
// exponent bits. Flushes to 0 below -87.34 (where e^x becomes denormal) and returns +inf above 88
// (e^88 < FLT_MAX < e^88.73, a sliver no caller of this header cares about); NaN stays NaN.
inline float exp_f32(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.0f;
  float xc = x < kLo ? kLo : x;
  xc = xc > kHi ? kHi : xc;
  // Adding 1.5 * 2^23 rounds x / ln2 to the nearest integer n and leaves n in the low mantissa
  // bits, so 2^n is built without a float-to-int conversion.
  constexpr float kShift = 12582912.0f;
  float t = xc * 1.44269504088896341f + kShift;
  float n = t - kShift;
  uint32_t biased = std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u;  // n + 127, in [1, 254]
  float pow2n = std::bit_cast<float>(biased << 23);
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = (p * r * r + r + 1.0f) * pow2n;
  y = x < kLo ? 0.0f : y;
  y = x > kHi ? std::numeric_limits<float>::infinity() : y;
  return y;
}

// Eigen's rational approximation of erf (absolute error under 2e-7); |x| >= 4 is +-1 in fp32.
inline float erf_f32(float x) {
  float xc = x < -4.0f ? -4.0f : x;
  xc = xc > 4.0f ? 4.0f : xc;
  float x2 = xc * xc;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return xc * p / q;
}

// tanh, branch-free: the odd Taylor series to x^11 where |x| < 0.25 (remainder under 1e-9
// relative), else (1 - e) / (1 + e) with e = e^(-2|x|) <= 0.61 (1 - e cancels at most ~1.4
// bits there: 3 ulp worst, measured by tests/unit/test_ops.cpp; never overflows) and the sign
// put back. NaN stays NaN.
inline float tanh_f32(float x) {
  const float a = x < 0.0f ? -x : x;
  const float e = exp_f32(-2.0f * a);
  const float big = (1.0f - e) / (1.0f + e);
  const float x2 = x * x;
  float p = -1382.0f / 155925.0f;  // tanh(x) / x = 1 - x^2/3 + 2x^4/15 - 17x^6/315 + ...
  p = p * x2 + 62.0f / 2835.0f;
  p = p * x2 + -17.0f / 315.0f;
  p = p * x2 + 2.0f / 15.0f;
  p = p * x2 + -1.0f / 3.0f;
  const float small = a * (1.0f + p * x2);
  const float t = a < 0.25f ? small : big;
  return x < 0.0f ? -t : t;
}

}  // namespace zof::cpu
