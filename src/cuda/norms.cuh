// RMSNorm and LayerNorm over rows (fp32 math, fp32 weights). Templated on the activation type,
// instantiated for fp32: every walk's activations are fp32, bf16 walks included (their products
// and attention round their inputs).
// y may alias x: a row is read in full (and reduced) before any of it is written.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

// y(rows,dim) = x / sqrt(mean(x^2) + eps) * (w + w_offset), the sum formed in fp32 (Gemma's
// RMSNorm: w_offset 1). w_offset 0 runs the plain kernel: the bits of y = x r w.
template <class T>
void rms_norm(const T* x, const float* w, T* y, int64_t rows, int64_t dim, float eps,
              float w_offset, cudaStream_t s);
// y(rows,dim) = (x - mean) / sqrt(var + eps) * w + b, mean and biased variance by Welford.
template <class T>
void layer_norm(const T* x, const float* w, const float* b, T* y, int64_t rows, int64_t dim,
                float eps, cudaStream_t s);

}  // namespace zof::cuda
