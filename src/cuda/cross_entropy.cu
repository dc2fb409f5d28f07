// Cross-entropy: one block per row, two passes over the logits (the row max, then the sum of
// e^(x - max) below the max and the count at it), combined as the CPU backend does.
#include "cuda/cross_entropy.cuh"
#include "cuda/op_math.h"

namespace zof::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void cross_entropy_kernel(const float* logits, const int32_t* targets, float* nll,
                                     int64_t vocab) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int32_t t = targets[r];
  if (t < 0 || t >= vocab) {  // the whole block takes this branch
    if (threadIdx.x == 0) nll[r] = t < 0 ? 0.0f : NAN;
    return;
  }
  const float* lr = logits + r * vocab;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, lr[j]);
  mx = block_reduce<true>(mx, scratch);
  float rest = 0.0f, at_max = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) opmath::ce_accumulate(lr[j], mx, rest, at_max);
  rest = block_reduce<false>(rest, scratch);
  at_max = block_reduce<false>(at_max, scratch);
  if (threadIdx.x == 0) nll[r] = opmath::ce_nll(mx, rest, at_max, lr[t]);
}

// One block per row: the chunk's max, then its sum of e^(x - max), folded into the running
// state as the host backends' cpu::cross_entropy_chunk does.
__global__ void cross_entropy_chunk_kernel(const float* logits, const int32_t* targets, int64_t n,
                                           int64_t v0, float* max, float* sum, float* target) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int32_t t = targets[r];
  if (t < 0) return;  // the whole block takes this branch
  const float* lr = logits + r * n;
  float mx = max[r];
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmaxf(mx, lr[j]);
  mx = block_reduce<true>(mx, scratch);
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s += expf(lr[j] - mx);
  s = block_reduce<false>(s, scratch);
  if (threadIdx.x == 0) {
    sum[r] = sum[r] * expf(max[r] - mx) + s;
    max[r] = mx;
    if (t >= v0 && t < v0 + n) target[r] = lr[t - v0];
  }
}

}  // namespace

void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows, int64_t n,
                         int64_t v0, float* max, float* sum, float* target, cudaStream_t s) {
  if (rows <= 0 || n <= 0) return;
  cross_entropy_chunk_kernel<<<unsigned(rows), kThreads, 0, s>>>(logits, targets, n, v0, max, sum,
                                                                 target);
  CUDA_CHECK(cudaGetLastError());
}

void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                   int64_t vocab, cudaStream_t s) {
  if (rows <= 0) return;
  cross_entropy_kernel<<<unsigned(rows), kThreads, 0, s>>>(logits, targets, nll, vocab);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace zof::cuda
