// The key of one perturbation direction, the only part of zof's random stream (Philox,
// src/util/philox.h) that the public API names: a ZO update term, a JVP direction and the
// backends' ZO passes carry it, and regenerate z from it.
#pragma once
#include <cstdint>

namespace zof {

// z for (seed, step, query) over all tensors.
// dist: 0 standard normal (Box-Muller), 1 Rademacher (+-1 from each word's top bit; the same
// Philox blocks). mask (Sparse MeZO): the ZO passes take z as 0 wherever |theta| > mask (theta
// before the update, for update terms); infinity: dense. z_group itself ignores the mask.
// rank (LOZO, --low-rank): 0 draws z element by element; r > 0 draws a matrix's z as the
// low-rank product U V^T / sqrt(r) of Gaussian factors, U (rows x r) new every step and V
// (cols x r) new every rank_every steps (philox.h's z_lowrank_element); cols is the matrix's
// width, set per tensor by whoever passes a tensor's key on (0: the tensor is drawn dense,
// as vectors are).
struct ZKey {
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t query = 0;
  uint32_t dist = 0;
  float mask = __builtin_inff();
  uint32_t rank = 0;
  uint32_t rank_every = 1;
  uint32_t cols = 0;
};
constexpr uint32_t kZGaussian = 0, kZRademacher = 1;

}  // namespace zof
