// Dequantization of the GGUF tensor types zof reads into fp32, bit for bit as gguf-py's
// gguf.quants.dequantize: every scale is an fp16 widened exactly, and each product and sum is
// rounded to fp32 in the order numpy evaluates it. Block layouts: ggml-common.h (block_q4_0 ...).
#include <cstring>

#include "hf/gguf.h"
#include "zof/dtype.h"
#include "zof/error.h"

// numpy rounds a * b + c twice; a fused multiply-add rounds once and would differ in the last bit.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace zof::gguf {
namespace {

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Q8_0: fp16 d, 32 int8: x * d.
void q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 32; ++j) y[j] = float(int8_t(b[2 + j])) * d;
}

// Q4_0: fp16 d, 16 bytes: element j is the low nibble of byte j, element j + 16 its high one;
// d * (q - 8).
void q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(qs[j] & 0x0F) - 8);
    y[j + 16] = d * float(int(qs[j] >> 4) - 8);
  }
}

// Q4_1: fp16 d, fp16 m, 16 bytes as Q4_0's: d * q + m.
void q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    const float lo = d * float(qs[j] & 0x0F);
    const float hi = d * float(qs[j] >> 4);
    y[j] = lo + m;
    y[j + 16] = hi + m;
  }
}

// Q4_K: fp16 d, fp16 dmin, 12 bytes of eight 6-bit scales and mins, 128 bytes of 4-bit values:
// eight sub-blocks of 32, sub-block 2g the low nibbles of bytes [32g, 32g + 32), 2g + 1 the high
// ones; (d * sc) * q - dmin * m.
void q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qs = b + 16;
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 0x3F;
    mn[j] = s[4 + j] & 0x3F;
    sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
    mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
  }
  for (int sub = 0; sub < 8; ++sub) {
    const float ds = d * float(sc[sub]);
    const float dm = dmin * float(mn[sub]);
    const uint8_t* q = qs + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int l = 0; l < 32; ++l) {
      const float p = ds * float((q[l] >> shift) & 0x0F);
      y[32 * sub + l] = p - dm;
    }
  }
}

// Q6_K: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales, fp16 d. Element e of the
// 256: half h = e / 128, within it k = e % 128; low bits from ql[64h + k % 64] (high nibble when
// k >= 64), high bits from qh[32h + k % 32] at bit 2 * (k / 32); q - 32 times d * scales[e / 16].
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  float ds[16];
  for (int s = 0; s < 16; ++s) ds[s] = d * float(scales[s]);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = e % 128;
    const int lo = (ql[64 * h + k % 64] >> (4 * (k / 64))) & 0x0F;
    const int hi = (qh[32 * h + k % 32] >> (2 * (k / 32))) & 0x03;
    y[e] = ds[e / 16] * float((lo | (hi << 4)) - 32);
  }
}

}  // namespace

void dequantize(TensorType type, const uint8_t* src, int64_t n, float* out) {
  const TypeTraits* tt = type_traits(static_cast<uint32_t>(type));
  ZOF_ASSERT(tt && tt->readable && n % tt->block == 0);
  const int64_t blocks = n / tt->block, bs = tt->block, bytes = tt->bytes;
  switch (type) {
    case TensorType::F32:
      if (n) std::memcpy(out, src, size_t(n) * 4);
      return;
    case TensorType::F16:
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) out[i] = f16_at(src + 2 * i);
      return;
    case TensorType::BF16:
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      return;
    default:
      break;
  }
  void (*block)(const uint8_t*, float*) = nullptr;
  switch (type) {
    case TensorType::Q8_0: block = q8_0; break;
    case TensorType::Q4_0: block = q4_0; break;
    case TensorType::Q4_1: block = q4_1; break;
    case TensorType::Q4_K: block = q4_k; break;
    case TensorType::Q6_K: block = q6_k; break;
    default: ZOF_ABORT("dequantize: a type marked readable has no kernel");
  }
#pragma omp parallel for schedule(static) if (blocks > 4096)
  for (int64_t k = 0; k < blocks; ++k) block(src + k * bytes, out + k * bs);
}

}  // namespace zof::gguf
