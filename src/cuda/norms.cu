// Row normalizations: one block per row, each thread a strided slice of it, reduced over the
// block (sum of squares for RMSNorm; Welford states merged pairwise for LayerNorm).
#include "cuda/norms.cuh"
#include "cuda/op_math.h"

namespace zof::cuda {

namespace {

// Up to 256 threads per row, fewer for short rows (dim 64 needs two warps, not eight).
int threads_for(int64_t dim) {
  const int64_t warps = (dim + 31) / 32;
  return int(warps >= 8 ? 256 : warps * 32);
}

// kOffset: the weight is w + w_offset (Gemma), else w itself (no addition, not even of 0).
template <class T, bool kOffset>
__global__ void rms_norm_kernel(const T* x, const float* w, T* y, int64_t dim, float eps,
                                float w_offset) {
  __shared__ float scratch[32];
  const T* xr = x + blockIdx.x * dim;
  T* yr = y + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = load_f32(xr + i);
    ss += v * v;
  }
  ss = block_reduce<false>(ss, scratch);
  const float inv = opmath::rms_inv(ss, dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    store_f32(yr + i, load_f32(xr + i) * inv * (kOffset ? w[i] + w_offset : w[i]));
}

__device__ __forceinline__ opmath::Welford shfl_welford(const opmath::Welford& a, int offset) {
  opmath::Welford b;
  b.n = __shfl_xor_sync(0xffffffffu, a.n, offset);
  b.mean = __shfl_xor_sync(0xffffffffu, a.mean, offset);
  b.m2 = __shfl_xor_sync(0xffffffffu, a.m2, offset);
  return b;
}

template <class T>
__global__ void layer_norm_kernel(const T* x, const float* w, const float* b, T* y, int64_t dim,
                                  float eps) {
  __shared__ float part_n[32], part_mean[32], part_m2[32];  // one Welford state per warp
  const T* xr = x + blockIdx.x * dim;
  T* yr = y + blockIdx.x * dim;
  opmath::Welford acc;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) opmath::welford_push(acc, load_f32(xr + i));
  for (int o = 16; o > 0; o >>= 1) acc = opmath::welford_merge(acc, shfl_welford(acc, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) part_n[warp] = acc.n, part_mean[warp] = acc.mean, part_m2[warp] = acc.m2;
  __syncthreads();
  acc = opmath::Welford{};
  if (lane < warps) acc.n = part_n[lane], acc.mean = part_mean[lane], acc.m2 = part_m2[lane];
  for (int o = 16; o > 0; o >>= 1) acc = opmath::welford_merge(acc, shfl_welford(acc, o));
  const float mean = acc.mean, inv = opmath::layer_norm_inv(acc, eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    store_f32(yr + i, (load_f32(xr + i) - mean) * inv * w[i] + b[i]);
}

}  // namespace

template <class T>
void rms_norm(const T* x, const float* w, T* y, int64_t rows, int64_t dim, float eps,
              float w_offset, cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return;
  if (w_offset != 0.0f)
    rms_norm_kernel<T, true><<<unsigned(rows), threads_for(dim), 0, s>>>(x, w, y, dim, eps,
                                                                        w_offset);
  else
    rms_norm_kernel<T, false><<<unsigned(rows), threads_for(dim), 0, s>>>(x, w, y, dim, eps,
                                                                         0.0f);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void layer_norm(const T* x, const float* w, const float* b, T* y, int64_t rows, int64_t dim,
                float eps, cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return;
  layer_norm_kernel<<<unsigned(rows), threads_for(dim), 0, s>>>(x, w, b, y, dim, eps);
  CUDA_CHECK(cudaGetLastError());
}

template void rms_norm<float>(const float*, const float*, float*, int64_t, int64_t, float, float,
                              cudaStream_t);
template void layer_norm<float>(const float*, const float*, const float*, float*, int64_t, int64_t,
                                float, cudaStream_t);

}  // namespace zof::cuda
