// The zeroth-order pass over one parameter tensor on the device (Backend::zo_pass): the pending
// update and the next perturbation in one read of theta, z regenerated from philox.h's z_group,
// so the bits equal the CPU's.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"
#include "zof/backend.h"

namespace zof::cuda {

// Update terms travel as a kernel argument (24 bytes each; kernel arguments are capped at 4 KB).
constexpr int kMaxZOTerms = 128;

// As Backend::zo_pass; upd is a host array of n_update <= kMaxZOTerms terms, copied into the
// launch, so it may be freed as soon as this returns.
void zo_pass(float* theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
             int n_update, float lr_wd, const ZKey* cur, float eps, float* plus, float* minus, cudaStream_t s);

// As Backend::zo_rows (rows in device memory).
void zo_rows(const float* theta, int64_t width, const int32_t* rows, int64_t n_rows,
             uint32_t tensor, const ZKey& cur, float eps, float* plus, float* minus,
             cudaStream_t s);

// As Backend::zo_update_state (same limits on upd as zo_pass).
void zo_update_state(float* theta, float* m, float* v, int64_t n, uint32_t tensor, int64_t first,
                     const ZOUpdateTerm* upd, int n_update, const ZOOptimizer& o,
                     cudaStream_t s);

}  // namespace zof::cuda
