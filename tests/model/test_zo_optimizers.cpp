// The ZO estimator and optimizer options against plain reference implementations: Rademacher
// and Gaussian z, one-sided and two-point differences, Sparse MeZO's masks, ZO-SGD, ZO-SGD with
// momentum and ZO-Adam, over three steps (so that optimizer state and lazy updates carry over).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common.h"
#include "golden_batch.h"
#include "cpu/cpu_zo.h"
#include "zof/backend.h"
#include "zof/error.h"
#include "util/philox.h"
#include "cpu/sim_device.h"
#include "zof/zo.h"

namespace {

using zof::ZOStepOptions;
using zof::test::golden_batch;
using zof::test::golden_dir;
using zof::test::mean_loss;
using Opt = ZOStepOptions::Optimizer;

TEST(ZDistribution, RademacherIsPlusMinusOneAndBalanced) {
  const int64_t n = 1 << 16;
  std::vector<float> theta(n, 0.f), plus(n), minus(n);
  zof::ZKey key{99, 4, 1};
  key.dist = zof::kZRademacher;
  zof::cpu::zo_pass(theta.data(), n, 3, 0, nullptr, 0, 0.f, &key, 1.f, plus.data(), minus.data());
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(plus[i] == 1.f || plus[i] == -1.f) << i;
    ASSERT_EQ(plus[i], zof::z_element(key, 3, (uint64_t)i)) << i;
    ASSERT_EQ(minus[i], -plus[i]);
    sum += plus[i];
  }
  EXPECT_LT(std::fabs(sum / n), 5.0 / std::sqrt((double)n));  // 5 standard errors
}

// Sparse MeZO's mask: z is 0 where |theta| exceeds it, in the perturbation and in the update
// (judged on theta before the update).
// An engine that only applies updates (the JVP estimator's: ZOStepOptions::perturb off) applies
// them bit for bit as the full engine does, ZO-SGD and Adam, with far fewer device bytes, and
// refuses to estimate.
TEST(ZOEngine, UpdateOnlyEngineAppliesTheSameUpdates) {
  ZOF_REQUIRE_PATH(golden_dir("llama_gqa") + "/model.safetensors");
  const zof::LossBatch lb = golden_batch("llama_gqa");
  const int64_t rows = lb.batch.B * lb.batch.T;
  for (Opt kind : {Opt::SGD, Opt::Adam}) {
    ZOStepOptions o;
    o.queries = 2;
    o.seed = 4;
    o.weight_decay = 0.1f;
    o.optimizer = kind;
    ZOStepOptions u = o;
    u.perturb = false;
    zof::Model a = zof::Model::load(golden_dir("llama_gqa"));
    zof::Model b = zof::Model::load(golden_dir("llama_gqa"));
    // On the simulated device, whose free memory counts every byte (the engines hand it the
    // Model's storage, without streaming: its pointer checker is off).
    zof::SimDeviceOptions so;
    so.budget = size_t(1) << 30;
    so.check_pointers = false;
    auto be = zof::make_sim_device(zof::test::cpu_backend(0), so);
    zof::ZOEngine full(a, *be, rows, o), apply(b, *be, rows, u);
    EXPECT_GT(apply.buffer_bytes(), 0u);
    EXPECT_LT(apply.buffer_bytes(), full.buffer_bytes() / 2);
    EXPECT_THROW(apply.perturbed_losses(0, {lb}), zof::Error);
    for (uint32_t step = 0; step < 3; ++step) {
      const zof::PendingUpdate upd = zof::ZOEngine::make_update(o, step, 1e-3f, {0.5, -1.5});
      full.set_pending(upd);
      apply.set_pending(upd);
      full.flush();
      apply.flush();
    }
    ASSERT_EQ(a.storage_size(), b.storage_size());
    EXPECT_EQ(0, std::memcmp(a.storage(), b.storage(), size_t(a.storage_size()) * sizeof(float)));
  }
}

TEST(ZDistribution, SparseMaskZeroesLargeWeights) {
  const int64_t n = 4096;
  std::vector<float> theta0(n);
  for (int64_t i = 0; i < n; ++i) theta0[i] = 0.01f * (float)((i * 37) % 201 - 100);  // [-1, 1]
  zof::ZKey cur{5, 6, 0};
  cur.mask = 0.5f;
  zof::ZOUpdateTerm upd{zof::ZKey{5, 5, 0}, 0.1f};
  upd.key.mask = 0.5f;
  std::vector<float> theta = theta0, plus(n), minus(n);
  zof::cpu::zo_pass(theta.data(), n, 2, 0, &upd, 1, 0.f, &cur, 0.01f, plus.data(), minus.data());
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool small0 = std::fabs(theta0[i]) <= 0.5f;
    const float want =
        small0 ? theta0[i] - fmaf(0.1f, zof::z_element(upd.key, 2, (uint64_t)i), 0.f * theta0[i])
               : theta0[i];
    ASSERT_EQ(theta[i], want) << i;
    const bool small1 = std::fabs(theta[i]) <= 0.5f;
    kept += small1;
    const float z = small1 ? zof::z_element(cur, 2, (uint64_t)i) : 0.f;
    ASSERT_EQ(plus[i], zof::zo_perturbed(theta[i], z, 0.01f)) << i;
    ASSERT_EQ(minus[i], zof::zo_perturbed(theta[i], z, -0.01f)) << i;
  }
  EXPECT_GT(kept, n / 3);
  EXPECT_LT(kept, n);
}

struct Variant {
  std::string name;
  uint32_t dist = zof::kZGaussian;
  bool one_sided = false;
  float sparsity = 0.f;
  Opt optimizer = Opt::SGD;
  int queries = 1;
  float lr = 1e-3f, wd = 0.f;
  uint32_t low_rank = 0, low_rank_every = 50;  // LOZO
};

class ZOOptionsVsReference : public ::testing::TestWithParam<Variant> {};

// Three steps of the engine against the same steps written plainly in double: the losses at the
// perturbed weights (each step from the reference's own weights), and the weights after three
// updates. The reference takes the engine's g, so the weight check tests the update alone.
TEST_P(ZOOptionsVsReference, ThreeStepsAgree) {
  const Variant c = GetParam();
  const std::string name = "llama_gqa";
  ZOF_REQUIRE_PATH(golden_dir(name) + "/model.safetensors");
  const zof::LossBatch lb = golden_batch(name);
  ZOStepOptions o;
  o.eps = 1e-2f;
  o.weight_decay = c.wd;
  o.queries = c.queries;
  o.seed = 4321;
  o.dist = c.dist;
  o.one_sided = c.one_sided;
  o.sparsity = c.sparsity;
  o.low_rank = c.low_rank;
  o.low_rank_every = c.low_rank_every;
  o.optimizer = c.optimizer;
  o.beta1 = 0.8f;
  o.beta2 = 0.95f;
  o.adam_eps = 1e-6f;

  zof::Model m = zof::Model::load(golden_dir(name));
  zof::Model ref = zof::Model::load(golden_dir(name));
  auto cpu = zof::test::cpu_backend(0);
  auto scalar = zof::test::reference_backend();
  zof::ZOEngine eng(m, *cpu, lb.batch.B * lb.batch.T, o);
  auto& params = ref.params();

  // Thresholds written independently: sort |theta|, take the (1 - sparsity) quantile.
  std::vector<float> thr(params.size(), std::numeric_limits<float>::infinity());
  if (c.sparsity > 0)
    for (size_t pi = 0; pi < params.size(); ++pi) {
      if (params[pi].shape.size() < 2) continue;
      std::vector<float> a(params[pi].data, params[pi].data + params[pi].numel);
      for (auto& x : a) x = std::fabs(x);
      std::sort(a.begin(), a.end());
      const int64_t k = std::min<int64_t>(params[pi].numel - 1,
                                          (int64_t)((1.0 - c.sparsity) * params[pi].numel));
      thr[pi] = a[k];
      EXPECT_EQ(eng.masks()[pi], thr[pi]) << params[pi].name;
    }
  const int64_t S = ref.storage_size();
  std::vector<double> mom(S, 0.0), vel(S, 0.0);
  // LOZO written plainly: a matrix's z is sum_k U[i][k] V[j][k] / sqrt(r) in double, U and V
  // dense normals of their own streams (tensor ids with bit 30 or 31 set; V's step is the
  // step / low_rank_every), drawn through the dense z_element.
  auto factor = [&](const zof::ZKey& key, size_t pi, uint32_t side, uint32_t step, uint64_t i) {
    zof::ZKey f{key.seed, step, key.query};
    return (double)zof::z_element(f, (uint32_t)pi | side, i);
  };
  auto z_of = [&](const zof::ZKey& key, size_t pi, int64_t e, float theta) -> double {
    if (std::fabs(theta) > thr[pi]) return 0.0;
    if (c.low_rank > 0 && params[pi].shape.size() >= 2) {
      const int64_t cols = params[pi].shape.back(), i = e / cols, j = e % cols;
      double s = 0;
      for (uint32_t k = 0; k < c.low_rank; ++k)
        s += factor(key, pi, 1u << 30, key.step, (uint64_t)i * c.low_rank + k) *
             factor(key, pi, 1u << 31, key.step / c.low_rank_every, (uint64_t)j * c.low_rank + k);
      return s / std::sqrt((double)c.low_rank);
    }
    return zof::z_element(key, (uint32_t)pi, (uint64_t)e);
  };
  for (uint32_t step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const zof::QueryLosses ql = eng.perturbed_losses(step, {lb});
    const std::vector<double> g = eng.projected_gradients(ql);
    const std::vector<float> theta0(ref.storage(), ref.storage() + S);
    auto loss_at = [&](int j, double sign) {
      zof::ZKey key{o.seed, step, (uint32_t)j};
      key.dist = c.dist;
      for (size_t pi = 0; pi < params.size(); ++pi) {
        const int64_t off = params[pi].data - ref.storage();
        for (int64_t e = 0; e < params[pi].numel; ++e)
          ref.storage()[off + e] =
              (float)((double)theta0[off + e] +
                      sign * o.eps * z_of(key, pi, e, theta0[off + e]));
      }
      const double l = mean_loss(ref, *scalar, lb);
      std::copy(theta0.begin(), theta0.end(), ref.storage());
      return l;
    };
    const double l0 = c.one_sided ? loss_at(0, 0.0) : 0.0;
    for (int j = 0; j < c.queries; ++j) {
      const double lp = loss_at(j, 1.0), lm = c.one_sided ? l0 : loss_at(j, -1.0);
      EXPECT_NEAR(ql.sum_plus[j] / ql.count, lp, 3e-6 * lp) << "query " << j;
      EXPECT_NEAR(ql.sum_minus[j] / ql.count, lm, 3e-6 * lm) << "query " << j;
      const double gr = (lp - lm) / ((c.one_sided ? 1.0 : 2.0) * o.eps);
      EXPECT_NEAR(g[j], gr, 3e-3 * std::max(1.0, std::fabs(gr))) << "query " << j;
    }
    eng.schedule_update(step, c.lr, g);
    // The reference update, in double from the engine's g.
    const double t = step + 1.0;
    for (size_t pi = 0; pi < params.size(); ++pi) {
      const auto& p = params[pi];
      const int64_t off = p.data - ref.storage();
      const double wd = p.decay ? c.wd : 0.0;
      for (int64_t e = 0; e < p.numel; ++e) {
        const double th = theta0[off + e];
        double gh = 0;
        for (int j = 0; j < c.queries; ++j) {
          zof::ZKey key{o.seed, step, (uint32_t)j};
          key.dist = c.dist;
          gh += g[j] / c.queries * z_of(key, pi, e, (float)th);
        }
        double next = th;
        switch (c.optimizer) {
          case Opt::SGD: next = th - c.lr * (gh + wd * th); break;
          case Opt::Momentum:
            mom[off + e] = o.beta1 * mom[off + e] + gh + wd * th;
            next = th - c.lr * mom[off + e];
            break;
          case Opt::Adam: {
            mom[off + e] = o.beta1 * mom[off + e] + (1 - o.beta1) * gh;
            vel[off + e] = o.beta2 * vel[off + e] + (1 - o.beta2) * gh * gh;
            const double mh = mom[off + e] / (1 - std::pow((double)o.beta1, t));
            const double vh = vel[off + e] / (1 - std::pow((double)o.beta2, t));
            next = th - c.lr * (mh / (std::sqrt(vh) + o.adam_eps) + wd * th);
            break;
          }
        }
        ref.storage()[off + e] = (float)next;
      }
    }
  }
  eng.flush();
  double max_err = 0, max_delta = 0;
  zof::Model base = zof::Model::load(golden_dir(name));
  int64_t unchanged = 0, matrix_elems = 0;
  for (int64_t i = 0; i < S; ++i) {
    max_err = std::max(max_err, (double)std::fabs(m.storage()[i] - ref.storage()[i]));
    max_delta = std::max(max_delta, (double)std::fabs(ref.storage()[i] - base.storage()[i]));
  }
  for (size_t pi = 0; pi < params.size(); ++pi) {
    if (params[pi].shape.size() < 2) continue;
    const int64_t off = params[pi].data - ref.storage();  // the same layout in every copy
    for (int64_t e = 0; e < params[pi].numel; ++e) {
      unchanged += m.storage()[off + e] == base.storage()[off + e];
      ++matrix_elems;
    }
  }
  EXPECT_GT(max_delta, 1e-5);  // the updates did something measurable
  EXPECT_LT(max_err, 2e-3 * max_delta + 1e-7);
  // The state checkpoints save (read_state) is the reference's m and v.
  std::vector<float> em, ev;
  eng.read_state(em, ev);
  const bool has_m = c.optimizer != Opt::SGD, has_v = c.optimizer == Opt::Adam;
  ASSERT_EQ((int64_t)em.size(), has_m ? S : 0);
  ASSERT_EQ((int64_t)ev.size(), has_v ? S : 0);
  auto state_err = [&](const std::vector<float>& got, const std::vector<double>& want) {
    double err = 0, scale = 0;
    for (int64_t i = 0; i < S; ++i) {
      err = std::max(err, std::fabs((double)got[i] - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    EXPECT_GT(scale, 0.0);
    return err / scale;
  };
  if (has_m) {
    EXPECT_LT(state_err(em, mom), 1e-4);
  }
  if (has_v) {
    EXPECT_LT(state_err(ev, vel), 1e-4);
  }
  // Sparse MeZO's mask is |theta_t| <= h, from the thresholds of the starting weights and the
  // weights of each step (zo.h): entries move in and out of it as the weights move, and the
  // engine followed the reference through those moves.
  if (c.sparsity > 0) {
    int64_t moved = 0;
    for (size_t pi = 0; pi < params.size(); ++pi) {
      if (params[pi].shape.size() < 2) continue;
      const int64_t off = params[pi].data - ref.storage();
      for (int64_t e = 0; e < params[pi].numel; ++e)
        moved += (std::fabs(base.storage()[off + e]) <= thr[pi]) !=
                 (std::fabs(ref.storage()[off + e]) <= thr[pi]);
    }
    std::printf("  %s: %lld entries crossed a Sparse MeZO threshold in 3 steps\n",
                c.name.c_str(), (long long)moved);
    EXPECT_GT(moved, 0);
  }
  // Sparse MeZO leaves about `sparsity` of each matrix untouched (weight decay aside); dense
  // updates touch almost all.
  const double frac = (double)unchanged / (double)matrix_elems;
  if (c.sparsity > 0 && c.wd == 0) {
    EXPECT_NEAR(frac, c.sparsity, 0.05);
  } else if (c.sparsity == 0) {
    EXPECT_LT(frac, 0.05);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, ZOOptionsVsReference,
    ::testing::Values(Variant{"sgd_rademacher", zof::kZRademacher},
                      Variant{"sgd_one_sided_q2", zof::kZGaussian, true, 0.f, Opt::SGD, 2},
                      Variant{"sparse_q2", zof::kZGaussian, false, 0.75f, Opt::SGD, 2},
                      Variant{"momentum_wd", zof::kZGaussian, false, 0.f, Opt::Momentum, 1, 1e-3f, 0.1f},
                      Variant{"adam_q2", zof::kZGaussian, false, 0.f, Opt::Adam, 2, 1e-4f},
                      Variant{"adam_sparse_rademacher_one_sided", zof::kZRademacher, true, 0.5f,
                              Opt::Adam, 1, 1e-4f, 0.05f},
                      // LOZO: V drawn at steps 0 and 2 (every 2), U every step
                      Variant{"low_rank2_q2", zof::kZGaussian, false, 0.f, Opt::SGD, 2, 1e-3f,
                              0.f, 2, 2},
                      Variant{"low_rank1_momentum_wd", zof::kZGaussian, true, 0.f, Opt::Momentum,
                              1, 1e-3f, 0.1f, 1, 50}),
    [](const auto& info) { return info.param.name; });

}  // namespace
