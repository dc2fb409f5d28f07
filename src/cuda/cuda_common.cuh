// What every CUDA op file shares: the CUDA_CHECK / CUBLAS_CHECK macros (library status codes are
// broken invariants: abort with file, line and the library's message), fp32 <-> storage-type
// loads and stores for kernels templated on float and bf16, and warp/block reductions.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "zof/error.h"

namespace zof::cuda {

[[noreturn]] void cuda_fail(cudaError_t e, const char* expr, const char* file, int line);
[[noreturn]] void cublas_fail(cublasStatus_t s, const char* expr, const char* file, int line);

using bf16 = __nv_bfloat16;

// Blocks for a grid-stride loop over n items: enough to fill any GPU, never more than needed.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return (unsigned)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

__device__ __forceinline__ float load_f32(const float* p) { return *p; }
__device__ __forceinline__ float load_f32(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_f32(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f32(bf16* p, float v) { *p = __float2bfloat16_rn(v); }

// fp32 -> bf16 rounded to nearest even, a NaN kept a quiet NaN with its sign and top payload
// bits: zof::f32_to_bf16 (zof/dtype.h) on the device, the same integer steps and so the same
// bits for every input. (__float2bfloat16_rn is cvt.rn.bf16.f32: the same for every number, but
// it turns each NaN into the canonical 0x7fff.) For the tensors the host reproduces bit for bit:
// casts, the bf16 input of a matrix product, the ZO pass's perturbed copies.
__device__ __forceinline__ bf16 f32_to_bf16_exact(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return __ushort_as_bfloat16((unsigned short)((u >> 16) | 0x40u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return __ushort_as_bfloat16((unsigned short)(u >> 16));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the block, returned to every thread. scratch: 32 floats of shared memory.
// Every thread of the block must call it (it synchronizes).
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const float identity = kMax ? -INFINITY : 0.0f;
  v = lane < warps ? scratch[lane] : identity;
  return kMax ? warp_max(v) : warp_sum(v);
}

}  // namespace zof::cuda

#define CUDA_CHECK(expr)                                                               \
  do {                                                                                 \
    const cudaError_t zof_cuda_status_ = (expr);                                       \
    if (zof_cuda_status_ != cudaSuccess)                                               \
      ::zof::cuda::cuda_fail(zof_cuda_status_, #expr, __FILE__, __LINE__);             \
  } while (0)

#define CUBLAS_CHECK(expr)                                                             \
  do {                                                                                 \
    const cublasStatus_t zof_cublas_status_ = (expr);                                  \
    if (zof_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::zof::cuda::cublas_fail(zof_cublas_status_, #expr, __FILE__, __LINE__);         \
  } while (0)
