// Learning-rate schedules: constant, linear and cosine decay to zero, with linear warm-up.
#include <cmath>

#include <gtest/gtest.h>

#include "zof/trainer.h"

namespace {

zof::TrainOptions opts(zof::Schedule schedule, int64_t steps, int64_t warmup) {
  zof::TrainOptions o;
  o.schedule = schedule;
  o.steps = steps;
  o.warmup = warmup;
  o.lr = 1.f;
  return o;
}

TEST(Schedule, Constant) {
  auto o = opts(zof::Schedule::Constant, 100, 0);
  for (int64_t s : {0, 50, 99}) EXPECT_FLOAT_EQ(zof::learning_rate(o, s), 1.f);
}

TEST(Schedule, WarmupRisesLinearlyThenHolds) {
  auto o = opts(zof::Schedule::Constant, 100, 10);
  EXPECT_FLOAT_EQ(zof::learning_rate(o, 0), 0.1f);
  EXPECT_FLOAT_EQ(zof::learning_rate(o, 4), 0.5f);
  EXPECT_FLOAT_EQ(zof::learning_rate(o, 9), 1.f);
  EXPECT_FLOAT_EQ(zof::learning_rate(o, 10), 1.f);
}

TEST(Schedule, LinearDecaysToZeroAfterWarmup) {
  auto o = opts(zof::Schedule::Linear, 110, 10);
  EXPECT_FLOAT_EQ(zof::learning_rate(o, 10), 1.f);
  EXPECT_FLOAT_EQ(zof::learning_rate(o, 60), 0.5f);
  EXPECT_NEAR(zof::learning_rate(o, 109), 0.01f, 1e-6);
}

TEST(Schedule, CosineFollowsHalfACosine) {
  auto o = opts(zof::Schedule::Cosine, 100, 0);
  EXPECT_FLOAT_EQ(zof::learning_rate(o, 0), 1.f);
  EXPECT_NEAR(zof::learning_rate(o, 50), 0.5f, 1e-6);
  EXPECT_NEAR(zof::learning_rate(o, 25), 0.5f * (1 + std::cos(M_PI * 0.25)), 1e-6);
  for (int64_t s = 1; s < 100; ++s) EXPECT_LE(zof::learning_rate(o, s), zof::learning_rate(o, s - 1));
}

}  // namespace
