// Rotary embedding in place (Hugging Face rotate_half pairs (i, i + rotary_dim/2) over the first
// rotary_dim dims of each head). Templated on the activation type, instantiated for fp32 (the
// walks' activations).
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

// x (rows, n_heads, head_dim), pos (rows) and inv_freq (rotary_dim/2) on the device; rotary_dim
// even and <= head_dim.
template <class T>
void rope(T* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rotary_dim, const float* inv_freq, cudaStream_t s);

}  // namespace zof::cuda
