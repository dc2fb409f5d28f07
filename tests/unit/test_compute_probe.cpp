// --dtype auto's probe (zof/runtime.h resolve_compute_dtype with a model's shapes): a model too
// small to pay stays fp32 unmeasured, a large one is measured and decided by its own numbers, and
// an explicit dtype is never measured.
#include <gtest/gtest.h>

#include <cstdio>

#include "zof/backend.h"
#include "zof/error.h"
#include "zof/runtime.h"

namespace {

using zof::ComputeChoice;
using zof::ComputeProbe;
using zof::DType;
using zof::MatmulShape;

// stories260K's products at a batch of 16 x 64 tokens: 5 layers of dim 64, hidden 172, vocab 512.
std::vector<MatmulShape> small_model() {
  std::vector<MatmulShape> s;
  for (int l = 0; l < 5; ++l)
    for (MatmulShape m : {MatmulShape{1024, 64, 64}, MatmulShape{1024, 64, 64},
                          MatmulShape{1024, 64, 64}, MatmulShape{1024, 64, 64},
                          MatmulShape{1024, 172, 64}, MatmulShape{1024, 172, 64},
                          MatmulShape{1024, 64, 172}})
      s.push_back(m);
  s.push_back({1024, 512, 64});
  return s;
}

TEST(ComputeProbe, ASmallModelStaysFp32Unmeasured) {
  auto be = zof::make_cpu_backend(0);
  ComputeProbe p;
  const DType t = zof::resolve_compute_dtype(ComputeChoice::Auto, *be, small_model(), &p);
  if (be->compute_info().bf16_fast) {  // AMX: the unit decides, whatever the size, unmeasured
    EXPECT_EQ(t, DType::BF16);
    EXPECT_FALSE(p.measured);
    std::printf("[ probe    ] this CPU has AMX: auto is bf16 without a probe\n");
    return;
  }
  EXPECT_EQ(t, DType::F32);
  EXPECT_FALSE(p.measured);
  int64_t weights = 0;
  for (const MatmulShape& s : small_model()) weights += s.N * s.K;
  EXPECT_EQ(p.weights, weights);
  EXPECT_LT(p.weights, zof::kProbeMinWeights);
  EXPECT_TRUE(p.small);
}

TEST(ComputeProbe, AnExplicitDtypeIsNeverMeasured) {
  auto be = zof::make_cpu_backend(0);
  const std::vector<MatmulShape> big{{64, 4096, 4096}};
  ComputeProbe p;
  p.measured = true;  // reset by the call
  EXPECT_EQ(zof::resolve_compute_dtype(ComputeChoice::Fp32, *be, big, &p), DType::F32);
  EXPECT_FALSE(p.measured);
  EXPECT_FALSE(p.small);
}

// Above kProbeMinWeights the probe times both dtypes and takes bf16 exactly when its rate is
// kBf16ProbeMargin times fp32's; its record says so.
TEST(ComputeProbe, ALargeModelIsDecidedByItsOwnNumbers) {
  auto be = zof::make_cpu_backend(0);
  const std::vector<MatmulShape> big{{64, 4096, 4096}, {64, 4096, 4096}, {64, 1024, 4096}};
  ComputeProbe p;
  const DType t = zof::resolve_compute_dtype(ComputeChoice::Auto, *be, big, &p);
  if (be->compute_info().bf16_fast) {
    EXPECT_EQ(t, DType::BF16);
    EXPECT_FALSE(p.measured);
    return;
  }
  bool has_bf16 = true;
  try {
    (void)zof::resolve_compute_dtype(ComputeChoice::Bf16, *be);
  } catch (const zof::Error&) {
    has_bf16 = false;
  }
  if (!has_bf16) {  // no bf16 products to time
    EXPECT_EQ(t, DType::F32);
    EXPECT_FALSE(p.measured);
    return;
  }
  ASSERT_TRUE(p.measured);
  EXPECT_FALSE(p.small);
  EXPECT_EQ(p.shapes, 2);  // the repeated shape is timed once
  EXPECT_EQ(p.weights, 2 * 4096 * 4096 + 1024 * 4096);
  EXPECT_GT(p.fp32_gflops, 0);
  EXPECT_GT(p.bf16_gflops, 0);
  EXPECT_GT(p.seconds, 0);
  EXPECT_LT(p.seconds, 10);
  EXPECT_EQ(t == DType::BF16, p.bf16_gflops >= zof::kBf16ProbeMargin * p.fp32_gflops)
      << p.fp32_gflops << " " << p.bf16_gflops;
  const nlohmann::json j = p.to_json();
  EXPECT_EQ(j["shapes"], 2);
  EXPECT_EQ(j["bf16_margin"], zof::kBf16ProbeMargin);
  EXPECT_EQ(j["weights"], p.weights);
}

// The probe keeps to its wall-clock budget: on a starved CPU its fixed work once took 30 s.
// Past the budget it stops after the shape it is timing, always times at least one, and says
// how many it left; with time enough it times them all. The shapes go smallest first.
TEST(ComputeProbe, ItStopsAtItsBudgetAndSaysWhatItLeft) {
  auto be = zof::make_cpu_backend(0);
  const std::vector<MatmulShape> shapes{{64, 1024, 1024}, {64, 512, 512}, {64, 768, 512},
                                        {64, 512, 512}};  // three distinct
  const ComputeProbe cut = zof::measure_compute(*be, shapes, 0.0);
  EXPECT_TRUE(cut.measured);
  EXPECT_EQ(cut.shapes, 1);
  EXPECT_EQ(cut.skipped, 2);
  EXPECT_EQ(cut.budget_s, 0.0);
  EXPECT_GT(cut.fp32_gflops, 0);
  EXPECT_GT(cut.bf16_gflops, 0);
  EXPECT_EQ(cut.to_json()["shapes_skipped"], 2);
  const ComputeProbe whole = zof::measure_compute(*be, shapes, 600.0);
  EXPECT_EQ(whole.shapes, 3);
  EXPECT_EQ(whole.skipped, 0);
  EXPECT_EQ(whole.weights, 2 * 512 * 512 + 1024 * 1024 + 768 * 512);
  EXPECT_EQ(whole.to_json()["budget_s"], 600.0);
}

}  // namespace
