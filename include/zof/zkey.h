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
struct ZKey {
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t query = 0;
  uint32_t dist = 0;
  float mask = __builtin_inff();
};
constexpr uint32_t kZGaussian = 0, kZRademacher = 1;

}  // namespace zof
