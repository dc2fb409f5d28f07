// Rotary embedding in place (Hugging Face rotate_half pairs (i, i + head_dim/2)) on fp32 or bf16.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

// x (rows, n_heads, head_dim), pos (rows) on the device; head_dim even.
template <class T>
void rope(T* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim, float theta,
          cudaStream_t s);

}  // namespace zof::cuda
