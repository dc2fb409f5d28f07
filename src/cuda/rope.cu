// RoPE: one thread per (row, pair index i) reads the model's fp32 frequency, computes the fp32
// angle and its sine and cosine once and rotates that pair in every head of the row. Dims from
// rotary_dim on pass through.
#include "cuda/op_math.h"
#include "cuda/rope.cuh"

namespace zof::cuda {

namespace {

template <class T>
__global__ void rope_kernel(T* x, const int32_t* pos, int64_t rows, int64_t n_heads,
                            int64_t head_dim, int64_t rotary_dim, const float* inv_freq) {
  const int64_t half = rotary_dim / 2, n = rows * half;
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < n;
       t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = t / half, i = t % half;
    const float angle = opmath::rope_angle(pos[r], inv_freq[i]);
    float s, c;
    sincosf(angle, &s, &c);
    for (int64_t h = 0; h < n_heads; ++h) {
      T* lo = x + (r * n_heads + h) * head_dim + i;
      float a = load_f32(lo), b = load_f32(lo + half);
      opmath::rope_rotate(a, b, c, s);
      store_f32(lo, a);
      store_f32(lo + half, b);
    }
  }
}

}  // namespace

template <class T>
void rope(T* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rotary_dim, const float* inv_freq, cudaStream_t s) {
  const int64_t n = rows * (rotary_dim / 2);
  if (n <= 0 || n_heads <= 0) return;
  rope_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, pos, rows, n_heads, head_dim, rotary_dim,
                                               inv_freq);
  CUDA_CHECK(cudaGetLastError());
}

template void rope<float>(float*, const int32_t*, int64_t, int64_t, int64_t, int64_t,
                          const float*, cudaStream_t);

}  // namespace zof::cuda
