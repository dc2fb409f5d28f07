// The zeroth-order pass over one parameter tensor on the device (Backend::zo_pass): the pending
// update and the next perturbation in one read of theta, z regenerated from philox.h's z_group,
// so the bits equal the CPU's.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"
#include "zof/backend.h"

namespace zof::cuda {

// The most update terms one pass applies. The kernels read the terms from device memory (the
// backend stages them there, a slot of kMaxZOTerms terms per call), not from their argument
// block, which the 32-byte terms would push past 4 KB.
constexpr int kMaxZOTerms = 128;

// Throws zof::Error unless 0 <= n_update <= kMaxZOTerms (the message says how to get there).
void check_zo_terms(int n_update);

// As Backend::zo_pass; upd: n_update <= kMaxZOTerms terms in device memory (null when
// n_update == 0), read by the kernel when the stream reaches it. plus/minus of type copy_t (F32
// or BF16); theta of type theta_t (F32, or BF16: a bf16 master held in 2 bytes).
void zo_pass(void* theta, DType theta_t, int64_t n, uint32_t tensor, int64_t first,
             const ZOUpdateTerm* upd, int n_update, float lr_wd, const ZKey* round,
             const ZKey* cur, float eps, void* plus, void* minus, DType copy_t, cudaStream_t s);

// As Backend::round_bf16_stochastic.
void round_bf16_stochastic(float* x, int64_t n, uint32_t tensor, int64_t first, const ZKey& key,
                           cudaStream_t s);
// As Backend::zo_rows (rows in device memory).
void zo_rows(const void* theta, DType theta_t, int64_t width, const int32_t* rows,
             int64_t n_rows, uint32_t tensor, const ZKey& cur, float eps, float* plus,
             float* minus, cudaStream_t s);

// As Backend::zo_update_state; upd in device memory, as zo_pass.
void zo_update_state(void* theta, DType theta_t, float* m, float* v, int64_t n, uint32_t tensor,
                     int64_t first, const ZOUpdateTerm* upd, int n_update, const ZOOptimizer& o,
                     const ZKey* round, cudaStream_t s);

}  // namespace zof::cuda
