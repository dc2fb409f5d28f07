// Element types of stored tensors and their conversions to the fp32 that zof computes in.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace zof {

enum class DType : uint8_t { F32, F16, BF16 };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) {  // safetensors spelling
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
  }
  return "?";
}
// torch_dtype spelling in config.json
inline const char* dtype_torch_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "?";
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, NaN kept NaN (as torch does).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// f rounded to the nearest bf16 value (as f32_to_bf16), held in fp32.
inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, with overflow to inf and gradual underflow.
inline uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00);  // overflow (incl. inf)
  if (a < 0x38800000u) {                                 // subnormal or zero in f16
    if (a < 0x33000000u) return uint16_t(sign);          // below half the smallest subnormal
    uint32_t e = a >> 23;
    uint32_t m = (a & 0x7fffff) | 0x800000;
    // value = m * 2^(e-150); f16 subnormal unit 2^-24 -> q = m * 2^(e-126)
    uint32_t s = 126 - e;  // right shift amount, 1..
    uint32_t q = m >> s;
    uint32_t rem = m & ((1u << s) - 1);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t r = a + 0xfff + ((a >> 13) & 1);  // round mantissa to 10 bits
  r -= 0x38000000u;                           // rebias exponent 127 -> 15
  return uint16_t(sign | (r >> 13));
}

}  // namespace zof
