// Elementwise ops (SwiGLU and GeGLU gates, GELU, ReLU, residual add, scaling, soft-capping,
// dtype conversion) and the embedding gather, with fp32 math. The activation ops are templated on
// the activation type and instantiated for fp32 (the walks' activations, bf16 walks included).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

// out(n) = silu(gate) * up; out may alias gate or up.
template <class T>
void silu_mul(const T* gate, const T* up, T* out, int64_t n, cudaStream_t s);
// out(n) = gelu_tanh(gate) * up (the tanh GELU of gelu_tanh below); out may alias gate or up.
template <class T>
void gelu_tanh_mul(const T* gate, const T* up, T* out, int64_t n, cudaStream_t s);
// x(n) *= a, in place.
template <class T>
void mul_scalar(T* x, float a, int64_t n, cudaStream_t s);
// y(n) = cap * tanh(x / cap); y may alias x.
template <class T>
void softcap(const T* x, T* y, float cap, int64_t n, cudaStream_t s);
// In place.
template <class T>
void gelu_tanh(T* x, int64_t n, cudaStream_t s);
template <class T>
void gelu_erf(T* x, int64_t n, cudaStream_t s);
template <class T>
void relu(T* x, int64_t n, cudaStream_t s);
// y(n) += x(n)
template <class T>
void add(T* y, const T* x, int64_t n, cudaStream_t s);
// out(n,dim) = table[ids[i]] (+= when accumulate); ids on the device, in range.
void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
               bool accumulate, cudaStream_t s);
// y(n) = x(n) converted. fp32 -> bf16 and fp32 -> fp16 round to nearest even, bit for bit as
// zof::f32_to_bf16 and zof::f32_to_f16 (zof/dtype.h), NaNs included.
void to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t s);
// y = bf16(scale * x) (the fp32 product rounded as zof::f32_to_bf16): a bf16 walk's scaled
// queries (Backend::attention).
void to_bf16_scaled(const float* x, float scale, bf16* y, int64_t n, cudaStream_t s);
void to_f16(const float* x, __half* y, int64_t n, cudaStream_t s);
void to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s);

}  // namespace zof::cuda
