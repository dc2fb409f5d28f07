// Shared by the GPU tests: the rule for a missing GPU (skip here, fail where one is expected:
// ZOF_EXPECT_GPU=1, which bench/gpu/run.sh sets), random inputs and the fp32/bf16 comparison.
#pragma once
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/cuda_backend.h"
#include "zof/dtype.h"

namespace zof::gpu_test {

inline bool gpu_expected() {
  const char* e = std::getenv("ZOF_EXPECT_GPU");
  return e && std::string(e) == "1";
}

inline std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |got - want| / max |want| under tol, never a NaN or inf.
inline ::testing::AssertionResult close(const std::vector<float>& want,
                                        const std::vector<float>& got, double tol) {
  if (want.size() != got.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  double scale = 0.0, err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) return ::testing::AssertionFailure() << "reference[" << i << "] = " << want[i];
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "out[" << i << "] = " << got[i];
    scale = std::max(scale, std::fabs(double(want[i])));
    const double e = std::fabs(double(got[i]) - double(want[i]));
    if (e > err) err = e, worst = i;
  }
  const double rel = err / std::max(scale, 1e-30);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << rel << " > " << tol << " at ["
                                       << worst << "]: " << got[worst] << " vs " << want[worst]
                                       << " (scale " << scale << ")";
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}
// x rounded to bf16 and back: the inputs a bf16 op actually sees.
inline std::vector<float> bf16_round(const std::vector<float>& x) { return from_bf16(to_bf16(x)); }

}  // namespace zof::gpu_test

// Skips the test without a GPU, fails it where one is expected.
#define ZOF_REQUIRE_GPU()                                                                     \
  do {                                                                                        \
    if (::zof::cuda_device_count() == 0) {                                                    \
      if (::zof::gpu_test::gpu_expected()) FAIL() << "no CUDA device, but ZOF_EXPECT_GPU=1";  \
      GTEST_SKIP() << "no CUDA device";                                                       \
    }                                                                                         \
  } while (0)
