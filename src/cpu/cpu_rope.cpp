// The CPU backend's rotary embedding (Hugging Face rotate_half pairs (i, i + rotary_dim/2) over
// the first rotary_dim dims of each head; the rest pass through): cos and sin once per (row, i)
// for a chunk of i, then applied to every head of the row.
#include <cmath>

#include "cpu/cpu_ops.h"

namespace zof::cpu {

void rope(float* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rotary_dim, const float* inv_freq, int threads) {
  const int64_t half = rotary_dim / 2;
  // The model's fp32 frequencies; the fp32 angle as the reference and Hugging Face (backend.h).
  const float* f = inv_freq;
  constexpr int64_t kChunk = 128;
#pragma omp parallel for num_threads(threads) schedule(static) \
    if (rows * n_heads * head_dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    float c[kChunk], s[kChunk];
    for (int64_t i0 = 0; i0 < half; i0 += kChunk) {
      const int64_t len = half - i0 < kChunk ? half - i0 : kChunk;
      for (int64_t i = 0; i < len; ++i) {
        float angle = float(pos[r]) * f[i0 + i];
        c[i] = std::cos(angle);
        s[i] = std::sin(angle);
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* lo = x + (r * n_heads + h) * head_dim + i0;
        float* hi = lo + half;
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) {
          float a = lo[i], b = hi[i];
          lo[i] = a * c[i] - b * s[i];
          hi[i] = b * c[i] + a * s[i];
        }
      }
    }
  }
}

}  // namespace zof::cpu
