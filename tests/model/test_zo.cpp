// The ZO step (dual-forward walk, fused update) against a plain scalar MeZO reference, and SPSA's
// projected gradient against the float64 directional derivative from PyTorch autograd.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "common.h"
#include "golden_batch.h"
#include "zof/backend.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "util/philox.h"
#include "hf/safetensors.h"
#include "zof/zo.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using zof::test::golden_batch;
using zof::test::golden_dir;
using zof::test::mean_loss;

// MeZO written plainly: theta +/- eps z for the whole model, two losses, g, SGD update.
struct Reference {
  std::vector<double> g;
  std::vector<float> theta1;  // storage after the update
  std::vector<double> lp, lm;
};

Reference reference_step(zof::Model& m, const zof::LossBatch& lb, const zof::ZOStepOptions& o,
                         uint32_t step, float lr) {
  auto be = zof::test::reference_backend();
  const std::vector<float> theta0(m.storage(), m.storage() + m.storage_size());
  auto& params = m.params();
  Reference r;
  std::vector<std::vector<float>> z(o.queries, std::vector<float>(m.storage_size(), 0.f));
  for (int j = 0; j < o.queries; ++j) {
    zof::ZKey key{o.seed, step, (uint32_t)j};
    for (size_t pi = 0; pi < params.size(); ++pi) {
      const int64_t off = params[pi].data - m.storage();
      for (int64_t e = 0; e < params[pi].numel; ++e)
        z[j][off + e] = zof::z_element(key, (uint32_t)pi, (uint64_t)e);
    }
    for (int sign : {1, -1}) {
      for (int64_t i = 0; i < m.storage_size(); ++i)
        m.storage()[i] = (float)((double)theta0[i] + sign * (double)o.eps * z[j][i]);
      (sign > 0 ? r.lp : r.lm).push_back(mean_loss(m, *be, lb));
    }
    r.g.push_back((r.lp[j] - r.lm[j]) / (2.0 * o.eps));
  }
  r.theta1 = theta0;
  for (auto& p : params) {
    const int64_t off = p.data - m.storage();
    for (int64_t e = 0; e < p.numel; ++e) {
      double upd = (p.decay ? (double)lr * o.weight_decay * theta0[off + e] : 0.0);
      for (int j = 0; j < o.queries; ++j) upd += (double)lr * r.g[j] / o.queries * z[j][off + e];
      r.theta1[off + e] = (float)(theta0[off + e] - upd);
    }
  }
  std::copy(theta0.begin(), theta0.end(), m.storage());
  return r;
}

struct StepCase {
  std::string model;
  int queries;
  float weight_decay;
  int64_t vocab_chunk = 0;  // LM head rows per chunk (0: the engine's default, one chunk here)
};

class ZOStepVsReference : public ::testing::TestWithParam<StepCase> {};

TEST_P(ZOStepVsReference, LossesGradientAndWeightsAgree) {
  const StepCase c = GetParam();
  ZOF_REQUIRE_PATH(golden_dir(c.model) + "/model.safetensors");
  const zof::LossBatch lb = golden_batch(c.model);
  zof::ZOStepOptions o{1e-2f, c.weight_decay, c.queries, 1234, c.vocab_chunk};
  const uint32_t step = 7;
  const float lr = 1e-3f;
  zof::Model ref_model = zof::Model::load(golden_dir(c.model));
  Reference ref = reference_step(ref_model, lb, o, step, lr);

  zof::Model m = zof::Model::load(golden_dir(c.model));
  auto be = zof::test::cpu_backend(0);
  zof::ZOEngine eng(m, *be, lb.batch.B * lb.batch.T, o);
  auto ql = eng.perturbed_losses(step, {lb});
  auto g = eng.projected_gradients(ql);
  for (int j = 0; j < c.queries; ++j) {
    EXPECT_NEAR(ql.sum_plus[j] / ql.count, ref.lp[j], 2e-6 * ref.lp[j]);
    EXPECT_NEAR(ql.sum_minus[j] / ql.count, ref.lm[j], 2e-6 * ref.lm[j]);
    // g = dL / 2eps: the losses' fp32 noise (~1e-6 relative) over 2 eps = 0.02.
    EXPECT_NEAR(g[j], ref.g[j], 2e-3 * std::max(1.0, std::fabs(ref.g[j])));
  }
  // The weights are untouched by the walk: perturbations live in copies.
  for (int64_t i = 0; i < m.storage_size(); ++i)
    ASSERT_EQ(m.storage()[i], ref_model.storage()[i]) << "theta changed at " << i;
  eng.schedule_update(step, lr, g);
  eng.flush();
  double max_err = 0, max_delta = 0;
  for (int64_t i = 0; i < m.storage_size(); ++i) {
    max_err = std::max(max_err, (double)std::fabs(m.storage()[i] - ref.theta1[i]));
    max_delta = std::max(max_delta, (double)std::fabs(ref.theta1[i] - ref_model.storage()[i]));
  }
  EXPECT_GT(max_delta, 1e-5);  // the update did something measurable
  EXPECT_LT(max_err, 1e-3 * max_delta + 1e-7);
}

INSTANTIATE_TEST_SUITE_P(Models, ZOStepVsReference,
                         ::testing::Values(StepCase{"llama_gqa", 1, 0.f},
                                           StepCase{"llama_gqa", 2, 0.1f},
                                           StepCase{"gpt2", 1, 0.05f},
                                           StepCase{"opt350_shape", 3, 0.f},
                                           StepCase{"qwen2_bias", 1, 0.f},
                                           StepCase{"llama3_scaled", 1, 0.f},
                                           StepCase{"qwen3", 2, 0.1f},
                                           StepCase{"phi3", 2, 0.1f},
                                           StepCase{"gemma2", 2, 0.1f},
                                           StepCase{"gemma3", 1, 0.f},
                                           StepCase{"mistral_window", 1, 0.f},
                                           StepCase{"gemma2", 1, 0.f, 64},
                                           // the LM head in several vocabulary chunks
                                           StepCase{"llama_gqa", 2, 0.1f, 64},
                                           StepCase{"gpt2", 1, 0.05f, 64},
                                           StepCase{"opt350_shape", 3, 0.f, 128}),
                         [](const auto& info) {
                           return info.param.model + "_q" + std::to_string(info.param.queries) +
                                  (info.param.weight_decay > 0 ? "_wd" : "") +
                                  (info.param.vocab_chunk > 0
                                       ? "_chunk" + std::to_string(info.param.vocab_chunk)
                                       : "");
                         });

// SPSA's g approaches grad . z (float64, PyTorch autograd in grad.safetensors) as eps shrinks,
// until fp32 rounding of the losses takes over.
TEST(ZOStep, SpsaApproachesDirectionalDerivative) {
  for (const char* name : {"llama_gqa", "gpt2"}) {
    ZOF_REQUIRE_PATH(golden_dir(name) + "/grad.safetensors");
    zof::Model m = zof::Model::load(golden_dir(name));
    const uint64_t seed = 99;
    const zof::ZKey key{seed, 3, 0};
    const double dd = zof::test::autograd_dot_z(m, name, key);
    const zof::LossBatch lb = golden_batch(name);
    auto be = zof::test::cpu_backend(0);
    std::vector<double> err;
    double loss = 0;
    // Measured: llama_gqa err 0.61, 0.053, 0.0058 (dd 7.35); gpt2 0.035, 9e-4, 6e-5 to 2.6e-4
    // (dd 1.21): the O(eps^2) bias of the central difference, until the fp32 rounding of the
    // losses (about 1e-7 L, divided by 2 eps) takes over: for gpt2 that floor is ~3e-4 at eps
    // 1e-3, and where it lands depends on the compiler's vectorization.
    for (float eps : {1e-2f, 3e-3f, 1e-3f}) {
      zof::ZOEngine eng(m, *be, lb.batch.B * lb.batch.T, zof::ZOStepOptions{eps, 0.f, 1, seed});
      const auto ql = eng.perturbed_losses(3, {lb});
      auto g = eng.projected_gradients(ql);
      err.push_back(std::fabs(g[0] - dd));
      loss = 0.5 * (ql.sum_plus[0] + ql.sum_minus[0]) / ql.count;
    }
    const double noise = 2e-7 * loss / (2 * 1e-3);
    EXPECT_LT(err[1], err[0] / 4) << name;  // quadratic convergence: (10/3)^2 = 11
    EXPECT_LT(err[2], std::max(err[1] / 4, noise)) << name << " noise floor " << noise;
    EXPECT_LT(err[2], 2e-3 * std::fabs(dd) + 1e-4) << name << " dd=" << dd;
  }
}

// The update applied lazily, block by block during the next walk, gives the same bits as
// flushing it right away: the fused pass is a schedule, not a different computation.
TEST(ZOStep, FusedUpdateEqualsImmediateFlush) {
  ZOF_REQUIRE_PATH(golden_dir("llama_gqa") + "/model.safetensors");
  const zof::LossBatch lb = golden_batch("llama_gqa");
  zof::ZOStepOptions o{1e-2f, 0.01f, 2, 5};
  zof::Model a = zof::Model::load(golden_dir("llama_gqa"));
  zof::Model b = zof::Model::load(golden_dir("llama_gqa"));
  auto be = zof::test::cpu_backend(0);
  zof::ZOEngine ea(a, *be, lb.batch.B * lb.batch.T, o), eb(b, *be, lb.batch.B * lb.batch.T, o);
  for (uint32_t step = 0; step < 3; ++step) {
    auto la = ea.perturbed_losses(step, {lb});
    auto lbq = eb.perturbed_losses(step, {lb});
    ASSERT_EQ(la.sum_plus, lbq.sum_plus);
    ASSERT_EQ(la.sum_minus, lbq.sum_minus);
    ea.schedule_update(step, 1e-2f, ea.projected_gradients(la));
    eb.schedule_update(step, 1e-2f, eb.projected_gradients(lbq));
    eb.flush();
  }
  ea.flush();
  ASSERT_EQ(0, std::memcmp(a.storage(), b.storage(), a.storage_size() * sizeof(float)));
}

// --master bf16: every update is rounded back to bf16 stochastically. A decay of lr * wd = 1e-4
// per step is 1/20 of half a bf16 ulp: round-to-nearest keeps every weight where it is forever,
// stochastic rounding shrinks them as fp32 does, on average. A step adds ulp * delta of variance
// to a weight (delta = 1e-4 |theta|, ulp ~ 2^-7.5 |theta|), so after 200 steps the noise of sum
// |theta| over llama_gqa's decayed weights is ~6e-5 of it (measured 9e-5 off), against a 2% signal.
TEST(ZOStep, Bf16MasterKeepsUpdatesFarBelowAnUlp) {
  ZOF_REQUIRE_PATH(golden_dir("llama_gqa") + "/model.safetensors");
  const float lr = 1e-3f, wd = 0.1f;  // lr * wd = 1e-4
  const int steps = 200;
  zof::ZOStepOptions o;
  o.weight_decay = wd, o.seed = 3, o.perturb = false;
  auto be = zof::test::cpu_backend(0);
  auto abs_sum = [](const zof::Model& m) {
    double s = 0;
    for (const zof::Param& p : m.params())
      if (p.decay)
        for (int64_t i = 0; i < p.numel; ++i) s += std::fabs((double)p.data[i]);
    return s;
  };
  // Stochastic rounding (the engine rounds the model to bf16 first).
  zof::Model sr = zof::Model::load(golden_dir("llama_gqa"));
  o.master = zof::DType::BF16;
  zof::ZOEngine esr(sr, *be, 1, o);
  const double start = abs_sum(sr);
  // Round-to-nearest: an fp32 engine from the same bf16 start, its weights rounded after each step.
  zof::Model rn = zof::Model::load(golden_dir("llama_gqa"));
  rn.round_to(zof::DType::BF16);
  ASSERT_EQ(0, std::memcmp(rn.storage(), sr.storage(), sr.storage_size() * sizeof(float)));
  o.master = zof::DType::F32;
  zof::ZOEngine ern(rn, *be, 1, o);
  for (int t = 0; t < steps; ++t) {
    for (zof::ZOEngine* e : {&esr, &ern}) {
      e->schedule_update((uint32_t)t, lr, {0.0});  // g = 0: the decay alone
      e->flush();
    }
    rn.round_to(zof::DType::BF16);
  }
  const double want = std::pow(1.0 - (double)lr * wd, steps);  // 0.98020
  EXPECT_NEAR(abs_sum(sr) / start, want, 1e-3);
  EXPECT_EQ(abs_sum(rn), start) << "round-to-nearest moved a weight";
  std::printf("  sum |theta| after %d steps of decay 1e-4: fp32 math %.5f, stochastic %.5f, "
              "nearest %.5f\n", steps, want, abs_sum(sr) / start, abs_sum(rn) / start);
  for (int64_t i = 0; i < sr.storage_size(); ++i) {
    uint32_t u;
    std::memcpy(&u, sr.storage() + i, 4);
    ASSERT_EQ(u & 0xFFFFu, 0u) << "weight " << i << " is off the bf16 grid";
  }
}

// With z in the updates: the bf16 master's moves track the fp32 master's from the same start.
// Per weight Delta_bf16 = Delta_fp32 + rounding noise (mean 0, at most ulp^2/4 of variance a
// step), so the slope sum(Df * Db) / sum(Df^2) is 1 to about ulp / (2 c sqrt(P)) ~ 0.01 here
// (updates c = 1e-4 per step, a sixth of a typical ulp); and the perturbed walk never writes the
// master (the losses' walk leaves it bit for bit).
TEST(ZOStep, Bf16MasterTracksTheFp32Master) {
  ZOF_REQUIRE_PATH(golden_dir("llama_gqa") + "/model.safetensors");
  const zof::LossBatch lb = golden_batch("llama_gqa");
  const int64_t rows = lb.batch.B * lb.batch.T;
  zof::ZOStepOptions o;
  o.seed = 9;
  auto be = zof::test::cpu_backend(0);
  zof::Model b = zof::Model::load(golden_dir("llama_gqa"));
  o.master = zof::DType::BF16;
  zof::ZOEngine eb(b, *be, rows, o);
  zof::Model f = zof::Model::load(golden_dir("llama_gqa"));
  f.round_to(zof::DType::BF16);
  o.master = zof::DType::F32;
  zof::ZOEngine ef(f, *be, rows, o);
  const std::vector<float> start(b.storage(), b.storage() + b.storage_size());
  ASSERT_EQ(0, std::memcmp(start.data(), f.storage(), start.size() * sizeof(float)));
  eb.perturbed_losses(0, {lb});  // the copies theta +/- eps z: the master is untouched
  ASSERT_EQ(0, std::memcmp(start.data(), b.storage(), start.size() * sizeof(float)));
  for (uint32_t t = 0; t < 20; ++t) {
    for (zof::ZOEngine* e : {&eb, &ef}) {
      e->schedule_update(t, 1e-4f, {1.0});  // theta -= 1e-4 z_t
      e->flush();
    }
  }
  double dd = 0, ff = 0;
  for (int64_t i = 0; i < b.storage_size(); ++i) {
    const double df = (double)f.storage()[i] - start[i], db = (double)b.storage()[i] - start[i];
    dd += df * db, ff += df * df;
  }
  ASSERT_GT(ff, 0);
  std::printf("  bf16 master's moves against fp32's: slope %.4f\n", dd / ff);
  EXPECT_NEAR(dd / ff, 1.0, 0.1);
}

// Losses and weights do not depend on the thread count.
TEST(ZOStep, IdenticalAtAnyThreadCount) {
  ZOF_REQUIRE_PATH(golden_dir("gpt2") + "/model.safetensors");
  const zof::LossBatch lb = golden_batch("gpt2");
  zof::ZOStepOptions o{1e-2f, 0.f, 1, 11};
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<float>> weights;
  for (int threads : {1, 2}) {
    zof::Model m = zof::Model::load(golden_dir("gpt2"));
    auto be = zof::test::cpu_backend(threads);
    zof::ZOEngine eng(m, *be, lb.batch.B * lb.batch.T, o);
    std::vector<double> l;
    for (uint32_t step = 0; step < 3; ++step) {
      auto ql = eng.perturbed_losses(step, {lb});
      l.push_back(ql.sum_plus[0]);
      l.push_back(ql.sum_minus[0]);
      eng.schedule_update(step, 1e-2f, eng.projected_gradients(ql));
    }
    eng.flush();
    losses.push_back(l);
    weights.emplace_back(m.storage(), m.storage() + m.storage_size());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_TRUE(weights[0] == weights[1]);
}

// Gradient accumulation: the batch split into micro-batches gives the same g.
TEST(ZOStep, MicroBatchesAccumulate) {
  ZOF_REQUIRE_PATH(golden_dir("llama_gqa") + "/model.safetensors");
  std::ifstream f(golden_dir("llama_gqa") + "/golden.json");
  json gj = json::parse(f);
  std::vector<std::vector<int32_t>> seqs;
  for (size_t b = 0; b < gj["input_ids"].size(); ++b) {
    std::vector<int32_t> s;
    for (int t = 0; t < gj["lengths"][b].get<int>(); ++t) s.push_back(gj["input_ids"][b][t]);
    seqs.push_back(s);
  }
  auto whole = zof::LossBatch::next_token(zof::Batch::from_sequences(seqs));
  std::vector<zof::LossBatch> parts;
  for (auto& s : seqs) parts.push_back(zof::LossBatch::next_token(zof::Batch::from_sequences({s})));
  zof::Model m = zof::Model::load(golden_dir("llama_gqa"));
  auto be = zof::test::cpu_backend(0);
  zof::ZOEngine eng(m, *be, whole.batch.B * whole.batch.T, zof::ZOStepOptions{1e-2f, 0.f, 1, 3});
  auto g1 = eng.projected_gradients(eng.perturbed_losses(0, {whole}));
  auto g2 = eng.projected_gradients(eng.perturbed_losses(0, parts));
  EXPECT_NEAR(g1[0], g2[0], 1e-3 * std::max(1.0, std::fabs(g1[0])));
}

}  // namespace

namespace {

// Data-parallel ranks and micro-batches add their partial sums in an order of their own. Rows
// of confident tokens (losses far below the batch's total) used to make the total depend on
// that order; rounded to the row quantum (zo.h), the sums are exact and the order is moot.
TEST(ZOStep, SumsDoNotDependOnTheOrderOfMicroBatchesWithConfidentTokens) {
  const std::string name = "llama_gqa";
  ZOF_REQUIRE_PATH(golden_dir(name) + "/model.safetensors");
  std::ifstream f(golden_dir(name) + "/golden.json");
  json gj = json::parse(f);
  std::vector<std::vector<int32_t>> seqs;
  for (size_t b = 0; b < gj["input_ids"].size(); ++b) {
    std::vector<int32_t> s;
    for (int t = 0; t < gj["lengths"][b].get<int>(); ++t) s.push_back(gj["input_ids"][b][t]);
    seqs.push_back(s);
  }
  zof::Model m = zof::Model::load(golden_dir(name));
  auto be = zof::test::cpu_backend(0);
  zof::Param* head = nullptr;
  for (auto& p : m.params())
    if (p.name == "lm_head.weight") head = &p;
  ASSERT_NE(head, nullptr);
  // Sharpen the head until the predicted token of a typical row has an NLL below 1e-6; every
  // other row keeps its real next token (an ordinary, larger loss).
  const int64_t V = m.config().vocab_size;
  std::vector<zof::LossBatch> parts;
  double median = 1;
  for (int doubling = 0; doubling < 12 && median >= 1e-6; ++doubling) {
    for (int64_t i = 0; i < head->numel; ++i) head->data[i] *= 2.f;
    parts.clear();
    std::vector<double> tiny;
    for (const auto& s : seqs) {
      const zof::LossBatch next = zof::LossBatch::next_token(zof::Batch::from_sequences({s}));
      std::vector<int32_t> targets = next.position_targets();
      zof::Forward fwd(m, *be, next.batch.B * next.batch.T);
      std::vector<float> logits;
      fwd.logits(next.batch, logits);
      for (int64_t r = 0; r < next.batch.T; r += 2) {
        if (targets[r] < 0) continue;
        const float* l = logits.data() + r * V;
        const int64_t best = std::max_element(l, l + V) - l;
        double z = 0;
        for (int64_t v = 0; v < V; ++v) z += std::exp((double)l[v] - (double)l[best]);
        targets[r] = (int32_t)best;
        tiny.push_back(std::log(z));
      }
      parts.push_back(zof::LossBatch::from_positions(next.batch, targets));
    }
    std::nth_element(tiny.begin(), tiny.begin() + tiny.size() / 2, tiny.end());
    median = tiny[tiny.size() / 2];
  }
  ASSERT_LT(median, 1e-6);
  // More, smaller parts: each sequence four times, scoring every fourth pair of rows (the rows'
  // losses do not change; only how they are grouped).
  {
    std::vector<zof::LossBatch> split;
    for (const auto& lb : parts)
      for (int k = 0; k < 4; ++k) {
        std::vector<int32_t> targets = lb.position_targets();
        for (size_t r = 0; r < targets.size(); ++r)
          if ((int)((r / 2) % 4) != k) targets[r] = -1;
        split.push_back(zof::LossBatch::from_positions(lb.batch, targets));
      }
    parts = split;
  }
  int64_t rows = 0;
  for (const auto& p : parts) rows = std::max<int64_t>(rows, p.batch.B * p.batch.T);
  // The old way, each row's loss rounded to float and summed in double, depends on the order
  // here: the data exercises the problem.
  std::vector<double> part_sums;
  for (const auto& lb : parts) {
    zof::Forward fwd(m, *be, rows);
    std::vector<float> nll(lb.batch.B * lb.batch.T);
    fwd.nll(lb.batch, lb.position_targets().data(), nll.data());
    double s = 0;
    for (float x : nll) s += x;
    part_sums.push_back(s);
  }
  std::vector<size_t> order(parts.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(5);
  std::set<double> naive;
  for (int trial = 0; trial < 64; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    double s = 0;
    for (size_t i : order) s += part_sums[i];
    naive.insert(s);
  }
  EXPECT_GT(naive.size(), 1u) << "the data no longer shows the order dependence";
  zof::ZOStepOptions o{1e-2f, 0.f, 2, 7};
  zof::ZOEngine eng(m, *be, rows, o);
  const zof::QueryLosses a = eng.perturbed_losses(0, parts);
  const double loss = eng.loss(parts);
  for (int trial = 0; trial < 64; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<zof::LossBatch> shuffled;
    for (size_t i : order) shuffled.push_back(parts[i]);
    const zof::QueryLosses b = eng.perturbed_losses(0, shuffled);
    ASSERT_EQ(a.sum_plus, b.sum_plus) << "order " << trial;
    ASSERT_EQ(a.sum_minus, b.sum_minus) << "order " << trial;
    ASSERT_EQ(eng.projected_gradients(a), eng.projected_gradients(b));
    ASSERT_EQ(loss, eng.loss(shuffled));
  }
}

}  // namespace
