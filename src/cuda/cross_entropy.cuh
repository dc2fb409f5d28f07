// Token loss on the device: nll(rows) = logsumexp(logits[r]) - logits[r][targets[r]].
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

// logits (rows, vocab), targets (rows) on the device; targets < 0 give 0, targets >= vocab NaN
// (the caller checks ids on the host, as Forward does).
void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                   int64_t vocab, cudaStream_t s);

// As Backend::cross_entropy_chunk, on device buffers.
void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows, int64_t n,
                         int64_t v0, float* max, float* sum, float* target, cudaStream_t s);

}  // namespace zof::cuda
