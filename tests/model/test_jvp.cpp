// The forward-gradient (JVP) estimator on whole models: its directional derivative against
// PyTorch's float64 autograd gradient (grad.safetensors) dotted with Philox's z, against a
// float64 central difference of its own float64 forward (whose loss matches transformers'
// float64 forward), SPSA's g converging to it as eps shrinks, and `zof finetune --estimator jvp`.
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common.h"
#include "golden_batch.h"
#include "model/host_kernels.h"
#include "zof/backend.h"
#include "zof/forward.h"
#include "zo/jvp.h"
#include "zof/model.h"
#include "util/philox.h"
#include "hf/safetensors.h"
#include "cpu/sim_device.h"
#include "zof/streaming.h"
#include "zof/zo.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::test::run_command;

namespace {

using zof::test::autograd_dot_z;
using zof::test::golden_batch;
using zof::test::golden_dir;

std::string stories() { return zof::test::assets_dir() + "/models/stories260K"; }
// Where a golden model's weights live (stories260K's are not copied into tests/golden).
std::string model_dir(const std::string& name) {
  return name == "stories260K" ? stories() : golden_dir(name);
}

json golden_json(const std::string& name) {
  std::ifstream f(golden_dir(name) + "/golden.json");
  return json::parse(f);
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

// The JVP directional derivative is PyTorch's float64 gradient dotted with z, for two
// directions in one walk; the float64 loss at theta is PyTorch's float64 loss.
TEST(Jvp, MatchesAutogradGradientDotZ) {
  for (const char* name : {"llama_gqa", "gpt2", "llama3_scaled", "qwen3", "phi3", "gemma2",
                           "gemma3", "mistral_window", "qwen2_window"}) {
    ZOF_REQUIRE_PATH(golden_dir(name) + "/grad.safetensors");
    zof::Model m = zof::Model::load(golden_dir(name));
    const zof::LossBatch lb = golden_batch(name);
    const int64_t rows = lb.batch.B * lb.batch.T;
    const std::vector<zof::ZKey> keys{{99, 3, 0}, {99, 3, 1}};
    auto be = zof::test::cpu_backend(0);
    zof::test::OracleJVP e64(m, *be, rows);
    zof::JVPEstimator e32(m, *be, rows);
    const zof::JVPSums s64 = e64.directional_derivatives(keys, {lb});
    const zof::JVPSums s32 = e32.directional_derivatives(keys, {lb});
    const auto g64 = s64.gradients(), g32 = s32.gradients();
    EXPECT_EQ(s64.count, (double)lb.scored());
    // 12 digits. GPT-2 is float64 throughout in transformers; Llama's RMSNorm computes in fp32
    // even in a float64 model (measured: 7.5e-9).
    const double loss_ref = golden_json(name)["grad_loss_f64"].get<double>();
    EXPECT_LT(rel(s64.sum_loss / s64.count, loss_ref), std::string(name) == "gpt2" ? 1e-10 : 5e-8)
        << name;
    EXPECT_LT(rel(s32.sum_loss / s32.count, loss_ref), 2e-6) << name;
    for (size_t j = 0; j < keys.size(); ++j) {
      const double dd = autograd_dot_z(m, name, keys[j]);
      std::printf("  %s z%zu: grad.z %.9f  jvp f64 %.9f (rel %.1e)  jvp f32 %.9f (rel %.1e)\n",
                  name, j, dd, g64[j], rel(g64[j], dd), g32[j], rel(g32[j], dd));
      // grad.safetensors is stored in fp32: its rounding alone is ~1e-7 of the terms.
      EXPECT_LT(rel(g64[j], dd), 1e-5) << name;
      EXPECT_LT(rel(g32[j], dd), 1e-4) << name;
    }
    EXPECT_NE(g64[0], g64[1]);  // two directions, two derivatives
  }
}

// Every architecture in tests/golden and the real stories260K: the float64 walk's loss is
// transformers' float64 loss, its directional derivative is the central difference of that
// float64 forward along z, and the fp32 walk (oneDNN matmuls) agrees with the float64 one.
TEST(Jvp, EveryArchitectureMatchesCentralDifference) {
  for (const char* name : {"llama_gqa", "qwen2_bias", "mistral", "opt", "opt350_shape", "gpt2",
                           "llama_bf16", "stories260K", "llama3_scaled", "llama_linear", "qwen3",
                           "phi3", "gemma2", "gemma3", "mistral_window", "qwen2_window"}) {
    ZOF_REQUIRE_PATH(model_dir(name) + "/model.safetensors");
    zof::Model m = zof::Model::load(model_dir(name));
    const zof::LossBatch lb = golden_batch(name);
    const int64_t rows = lb.batch.B * lb.batch.T;
    const zof::ZKey key{5, 11, 0};
    auto be = zof::test::cpu_backend(0);
    zof::test::OracleJVP e64(m, *be, rows);
    const zof::JVPSums s = e64.directional_derivatives({key}, {lb});
    const double g = s.gradients()[0];
    // nll_mean_f64 has 8 digits, and transformers' RMSNorm computes in fp32 even in a float64
    // model (measured: up to 2.6e-8 for mistral).
    const double nll_ref = golden_json(name)["nll_mean_f64"].get<double>();
    EXPECT_LT(rel(s.sum_loss / s.count, nll_ref), 1e-7) << name;
    // The five-point central difference of the float64 forward along z: truncation
    // ~h^4 L^(5) / 30, rounding ~1e-15 L / h. h stays small so that no ReLU input (OPT)
    // crosses its kink within +/- 2h.
    const double h = 1e-5;
    auto at = [&](double t) { return e64.loss_along(key, t, {lb}).sum_loss; };
    const double fd = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h) / s.count;
    zof::JVPEstimator e32(m, *be, rows);
    const double g32 = e32.directional_derivatives({key}, {lb}).gradients()[0];
    std::printf("  %-13s loss %.10f (ref %.8f, rel %.1e)  jvp f64 %.9f  fd %.9f (rel %.1e)  "
                "f32 rel %.1e\n", name, s.sum_loss / s.count, nll_ref,
                rel(s.sum_loss / s.count, nll_ref), g, fd, rel(g, fd), rel(g32, g));
    EXPECT_LT(rel(g, fd), 1e-8) << name;  // measured: at most 1.2e-10
    EXPECT_LT(rel(g32, g), 1e-4) << name;
    EXPECT_GT(std::fabs(g), 1e-3) << name << ": z should move the loss";
  }
}

// SPSA's projected gradient is a central difference in fp32: it approaches the JVP value as eps
// shrinks (its bias is O(eps^2)) until fp32 rounding of the losses takes over.
TEST(Jvp, SpsaConvergesToJvp) {
  for (const char* name : {"llama_gqa", "gpt2", "stories260K"}) {
    ZOF_REQUIRE_PATH(model_dir(name) + "/model.safetensors");
    zof::Model m = zof::Model::load(model_dir(name));
    const zof::LossBatch lb = golden_batch(name);
    const int64_t rows = lb.batch.B * lb.batch.T;
    const uint64_t seed = 42;
    const uint32_t step = 2;
    auto be = zof::test::cpu_backend(0);
    zof::JVPEstimator jvp(m, *be, rows);
    const double g = jvp.directional_derivatives({zof::ZKey{seed, step, 0}}, {lb}).gradients()[0];
    std::vector<double> err;
    for (float eps : {1e-2f, 1e-3f}) {
      zof::ZOEngine eng(m, *be, rows, zof::ZOStepOptions{eps, 0.f, 1, seed});
      const double gs = eng.projected_gradients(eng.perturbed_losses(step, {lb}))[0];
      err.push_back(std::fabs(gs - g));
    }
    std::printf("  %-12s jvp g %.6f  |spsa - jvp| eps 1e-2: %.2e  eps 1e-3: %.2e\n", name, g,
                err[0], err[1]);
    EXPECT_LT(err[1], err[0] / 10) << name;  // ~100x for a pure O(eps^2) bias
    EXPECT_LT(err[1], 2e-2 * std::fabs(g) + 1e-3) << name;
  }
}

// Directions are independent (a walk with three gives each one's value alone) and sums over
// micro-batches add up to the whole batch's.
TEST(Jvp, QueriesAndMicroBatchesAdd) {
  ZOF_REQUIRE_PATH(golden_dir("llama_gqa") + "/model.safetensors");
  zof::Model m = zof::Model::load(golden_dir("llama_gqa"));
  const json gj = golden_json("llama_gqa");
  std::vector<std::vector<int32_t>> seqs;
  for (size_t b = 0; b < gj["input_ids"].size(); ++b) {
    std::vector<int32_t> s;
    for (int t = 0; t < gj["lengths"][b].get<int>(); ++t) s.push_back(gj["input_ids"][b][t]);
    seqs.push_back(s);
  }
  const auto whole = zof::LossBatch::next_token(zof::Batch::from_sequences(seqs));
  std::vector<zof::LossBatch> parts;
  for (auto& s : seqs) parts.push_back(zof::LossBatch::next_token(zof::Batch::from_sequences({s})));
  auto be = zof::test::cpu_backend(0);
  zof::JVPEstimator est(m, *be, whole.batch.B * whole.batch.T);
  const std::vector<zof::ZKey> keys{{7, 0, 0}, {7, 0, 1}, {7, 0, 2}};
  const zof::JVPSums all = est.directional_derivatives(keys, {whole});
  for (size_t j = 0; j < keys.size(); ++j) {
    const zof::JVPSums one = est.directional_derivatives({keys[j]}, {whole});
    EXPECT_EQ(one.sum_dir[0], all.sum_dir[j]) << j;
    EXPECT_EQ(one.sum_loss, all.sum_loss);
  }
  const zof::JVPSums split = est.directional_derivatives(keys, parts);
  EXPECT_EQ(split.count, all.count);
  EXPECT_LT(rel(split.sum_loss, all.sum_loss), 1e-6);
  for (size_t j = 0; j < keys.size(); ++j) EXPECT_LT(rel(split.sum_dir[j], all.sum_dir[j]), 1e-5) << j;
  // And the loss at theta is Forward's.
  zof::Forward fwd(m, *be, whole.batch.B * whole.batch.T);
  std::vector<float> nll(whole.batch.B * whole.batch.T);
  fwd.nll(whole.batch, whole.position_targets().data(), nll.data());
  double s = 0;
  for (float x : nll) s += x;
  EXPECT_LT(rel(all.sum_loss, s), 1e-6);
}

// The fp32 walk through the Backend (every op and tangent op) against its plain loops, on the
// CPU backend and on the simulated device (which runs the same ops on its streams and checks
// that each access is ordered), for the three architectures' layer shapes (LLaMA GQA with RoPE
// and SwiGLU, GPT-2's fused QKV and tanh GELU, OPT's post-norm ReLU with project_in/out) and the
// newer blocks (Llama 3's scaled RoPE table, Qwen3's per-head q/k norms, Phi-3's fused
// projections viewed as q/k/v and gate/up, and its partial rotary; Gemma 2's soft-caps, sliding
// window, sandwich norms and GeGLU; Gemma 3's two RoPE tables).
TEST(Jvp, BackendOpsEqualPlainLoops) {
  for (const char* name : {"llama_gqa", "gpt2", "opt350_shape", "llama3_scaled", "qwen3", "phi3",
                           "gemma2", "gemma3"}) {
    ZOF_REQUIRE_PATH(golden_dir(name) + "/model.safetensors");
    zof::Model m = zof::Model::load(golden_dir(name));
    const zof::LossBatch lb = golden_batch(name);
    const std::vector<zof::ZKey> keys{{3, 1, 0}, {3, 1, 1}};
    auto cpu = zof::test::cpu_backend(0);
    zof::test::PlainLoopJVP plain_est(m, *cpu, lb.batch.B * lb.batch.T);
    const zof::JVPSums plain = plain_est.directional_derivatives(keys, {lb});
    auto sim = zof::make_sim_device(zof::test::cpu_backend(0), {});
    for (zof::Backend* be : {cpu.get(), static_cast<zof::Backend*>(sim.get())}) {
      zof::JVPEstimator est(m, *be, lb.batch.B * lb.batch.T);
      const zof::JVPSums fast = est.directional_derivatives(keys, {lb});
      EXPECT_LT(rel(fast.sum_loss, plain.sum_loss), 1e-6) << name << " on " << be->name();
      // Relative to the larger of the directions' sums: a sum that cancels across tokens
      // (llama3_scaled's direction 1: -1.66 beside -104) keeps the absolute fp32 error of its
      // terms (measured 3.5e-5, 2.1e-5 of it, 3.4e-7 of the scale).
      const double scale = std::max(std::fabs(plain.sum_dir[0]), std::fabs(plain.sum_dir[1]));
      for (size_t j = 0; j < keys.size(); ++j)
        EXPECT_LT(std::fabs(fast.sum_dir[j] - plain.sum_dir[j]) / scale, 1e-5)
            << name << " on " << be->name() << ": direction " << j << " fast " << fast.sum_dir[j]
            << " plain " << plain.sum_dir[j] << " (other direction " << plain.sum_dir[1 - j]
            << ")";
    }
    EXPECT_EQ(sim->stats().hazards, 0) << sim->stats().first_hazard;
  }
}

// A bf16 walk (--dtype bf16, JVPEstimator's products BF16): every matrix product of the primal
// and of its tangent reads its weight and its z rounded to bf16. Against the reference backend's
// bf16 products (plain loops: the same roundings, another fp32 summation order); the simulated
// device with the weights streamed at the least budget (slots that held other blocks: the
// rounded copies are made anew) gives the CPU backend's bits; and the derivative is nearer the
// float64 truth than SPSA's in a bf16 run (--dtype bf16, eps 1e-3: the perturbed copies rounded
// to bf16), the estimate zof's bf16 runs train on, while its error is well above fp32's (the
// products did round). bench/jvp_dtype.py measures the same in PyTorch on stories260K.
TEST(Jvp, Bf16ProductsMatchTheReferenceAndStayNearTheTruth) {
  for (const char* name : {"llama_gqa", "gpt2", "opt350_shape", "llama3_scaled", "qwen3", "phi3",
                           "gemma2", "gemma3", "stories260K"}) {
    ZOF_REQUIRE_PATH(model_dir(name) + "/model.safetensors");
    zof::Model m = zof::Model::load(model_dir(name));
    const zof::LossBatch lb = golden_batch(name);
    const std::vector<zof::LossBatch> micro{lb, lb};
    const int64_t rows = lb.batch.B * lb.batch.T;
    const std::vector<zof::ZKey> keys{{7, 2, 0}, {7, 2, 1}, {7, 2, 2}, {7, 2, 3}};
    auto cpu = zof::test::cpu_backend(0);
    auto grads = [&](zof::Backend& be, zof::DType t, zof::BlockStreamer* s = nullptr) {
      zof::JVPEstimator e(m, be, rows, (int)keys.size(), t);
      e.set_weights(s);
      return e.directional_derivatives(keys, micro).gradients();
    };
    zof::test::OracleJVP e64(m, *cpu, rows);
    const std::vector<double> g64 = e64.directional_derivatives(keys, micro).gradients();
    const std::vector<double> g32 = grads(*cpu, zof::DType::F32);
    const std::vector<double> gb = grads(*cpu, zof::DType::BF16);
    auto ref = zof::make_reference_backend();
    const std::vector<double> gr = grads(*ref, zof::DType::BF16);
    zof::SimDeviceOptions so;
    so.budget = zof::BlockStreamer::min_bytes(m) + (size_t(64) << 20);
    auto sim = zof::make_sim_device(zof::test::cpu_backend(0), so);
    std::vector<double> gs;
    {
      zof::BlockStreamer streamer(m, *sim, zof::BlockStreamer::min_bytes(m));
      gs = grads(*sim, zof::DType::BF16, &streamer);
    }
    zof::ZOStepOptions so_spsa{1e-3f, 0.f, (int)keys.size(), keys[0].seed};
    so_spsa.compute = zof::DType::BF16;
    zof::ZOEngine spsa(m, *cpu, rows, so_spsa);
    const std::vector<double> gspsa =
        spsa.projected_gradients(spsa.perturbed_losses(keys[0].step, micro));
    EXPECT_EQ(gs, gb) << name << ": streamed on the simulated device";
    EXPECT_EQ(sim->stats().hazards, 0) << sim->stats().first_hazard;
    EXPECT_EQ(sim->stats().foreign, 0) << sim->stats().first_foreign;
    // Relative to the largest direction's derivative (one may cancel across tokens).
    // Over the directions, relative to the truth's size: sqrt(sum (g - g64)^2 / sum g64^2).
    auto err = [&](const std::vector<double>& g, const std::vector<double>& want) {
      double num = 0, den = 0;
      for (size_t j = 0; j < keys.size(); ++j) {
        num += (g[j] - want[j]) * (g[j] - want[j]);
        den += g64[j] * g64[j];
      }
      return std::sqrt(num / den);
    };
    const double err_b = err(gb, g64), err_32 = err(g32, g64), err_spsa = err(gspsa, g64);
    const double err_ref = err(gb, gr);
    std::printf("  %-13s vs f64: jvp bf16 %.1e, spsa bf16 %.1e, jvp f32 %.1e; jvp bf16 cpu vs "
                "reference %.1e\n", name, err_b, err_spsa, err_32, err_ref);
    // Measured: jvp bf16 3.5e-3 to 5.8e-2 of the truth, spsa bf16 1.5e-1 to 5.9e-1 (3.4x to 45x
    // further); the backends 4e-8 to 8.5e-4 apart (bf16 roundings of activations that differ in
    // their last fp32 bits), at most 1/11 of the bf16 error on AVX-512 and AMX machines, and up
    // to 0.45 of it (GPT-2: 2.7e-3 against 5.9e-3) on an AVX2 machine, whose bf16 products sum
    // the same bf16 values in fp32 kernels of another order. Two bf16 walks each that far from
    // the truth could be sqrt(2) of it apart; a wrong product is O(1) away.
    EXPECT_LT(err_b, 0.5 * err_spsa) << name;
    EXPECT_GT(err_b, 10 * err_32) << name << ": the products should have rounded";
    EXPECT_LT(err_ref, 0.6 * err_b) << name;
    // The rounded copies the walk keeps follow what it reads: each direction alone gives its
    // value in the four-direction walk, and a walk after the weights changed in place gives a
    // fresh estimator's bits.
    for (size_t j = 0; j < keys.size(); ++j) {
      zof::JVPEstimator one(m, *cpu, rows, 1, zof::DType::BF16);
      EXPECT_EQ(one.directional_derivatives({keys[j]}, micro).gradients()[0], gb[j])
          << name << ": direction " << j << " alone";
    }
    zof::JVPEstimator again(m, *cpu, rows, (int)keys.size(), zof::DType::BF16);
    EXPECT_EQ(again.directional_derivatives(keys, micro).gradients(), gb) << name;
    float* w = m.storage();
    for (int64_t i = 0; i < m.storage_size(); ++i) w[i] *= 1.0f + 1.0f / 64;
    const std::vector<double> moved = again.directional_derivatives(keys, micro).gradients();
    EXPECT_EQ(moved, grads(*cpu, zof::DType::BF16)) << name << ": after the weights moved";
    EXPECT_NE(moved, gb) << name;
  }
}

// The fp32 walk on the simulated device with its weights streamed (every block resident, then
// at the least budget, every block through two slots): the same bits as on the CPU backend, no
// unordered access, and no operand outside device memory: the walk a GPU runs.
TEST(Jvp, StreamedOnADeviceEqualsTheCpuWalk) {
  for (const char* name : {"llama_gqa", "gpt2", "opt350_shape", "qwen3", "phi3", "gemma2"}) {
    ZOF_REQUIRE_PATH(golden_dir(name) + "/model.safetensors");
    zof::Model m = zof::Model::load(golden_dir(name));
    const zof::LossBatch lb = golden_batch(name);
    const std::vector<zof::LossBatch> micro{lb, lb};
    const std::vector<zof::ZKey> keys{{3, 1, 0}, {3, 1, 1}};
    auto cpu = zof::test::cpu_backend(0);
    zof::JVPEstimator host(m, *cpu, lb.batch.B * lb.batch.T);
    const zof::JVPSums want = host.directional_derivatives(keys, micro);
    for (bool tight : {false, true}) {
      SCOPED_TRACE(std::string(name) + (tight ? ", least budget" : ", all resident"));
      const size_t budget = tight ? zof::BlockStreamer::min_bytes(m)
                                  : zof::BlockStreamer::all_resident_bytes(m);
      zof::SimDeviceOptions so;
      so.budget = budget + (size_t(64) << 20);  // and the walk's buffers
      auto sim = zof::make_sim_device(zof::test::cpu_backend(0), so);
      zof::JVPEstimator est(m, *sim, lb.batch.B * lb.batch.T);
      zof::BlockStreamer streamer(m, *sim, budget);
      EXPECT_EQ(streamer.all_resident(), !tight) << streamer.describe();
      est.set_weights(&streamer);
      for (int rep = 0; rep < 2; ++rep) {  // the second walk finds resident blocks uploaded
        const zof::JVPSums got = est.directional_derivatives(keys, micro);
        EXPECT_EQ(got.sum_loss, want.sum_loss);
        EXPECT_EQ(got.sum_dir, want.sum_dir);
        EXPECT_EQ(got.count, want.count);
      }
      streamer.sync_to_host();
      const auto st = sim->stats();
      EXPECT_EQ(st.hazards, 0) << st.first_hazard;
      EXPECT_EQ(st.foreign, 0) << st.first_foreign;
    }
  }
}

// ---- zof finetune --estimator jvp -------------------------------------------------------------

class JvpFinetune : public zof::test::ShakespeareRunTest {
 protected:
  std::string args(const std::string& out) const {
    return " finetune --model " + stories() + " --task text --data " + (dir_ / "text.txt").string() +
           " --out " + out + " --batch 8 --seq-len 64 --seed 3 --eval-examples 16 --threads 2";
  }
};

TEST_F(JvpFinetune, LearnsWritesMetricsAndReplays) {
  const fs::path run = dir_ / "run";
  auto r = run_command(zof::test::zof_binary() + args(run.string()) +
                       " --estimator jvp --steps 30 --lr 1e-4 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json s = json::parse(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
  EXPECT_EQ(s["steps"], 30);
  // Held-out perplexity on Tiny Shakespeare improves (stories260K was trained on TinyStories;
  // measured 429 -> 239, the same as SPSA with --eps 1e-3).
  const double before = s["eval"]["before"], after = s["eval"]["after"];
  std::printf("  jvp finetune: ppl %.3f -> %.3f, train loss %.4f\n", before, after,
              s["train_loss"].get<double>());
  EXPECT_LT(after, 0.8 * before);
  const json opts = json::parse(zof::test::read_file((run / "run.json").string()))["options"];
  EXPECT_EQ(opts["estimator"], "jvp");
  // Every step logged: the loss at theta, one g per direction, no perturbed losses.
  std::ifstream f(run / "metrics.jsonl");
  std::string line;
  std::vector<double> losses;
  while (std::getline(f, line)) {
    const json j = json::parse(line);
    if (j["type"] != "step") continue;
    ASSERT_TRUE(j["loss"].is_number()) << line;
    EXPECT_FALSE(j.contains("loss_plus")) << line;
    EXPECT_EQ(j["g"].size(), 1u) << line;
    EXPECT_TRUE(std::isfinite(j["g"][0].get<double>())) << line;
    losses.push_back(j["loss"]);
  }
  ASSERT_EQ(losses.size(), 30u);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) {
    first += losses[i] / 10;
    last += losses[20 + i] / 10;
  }
  EXPECT_LT(last, first) << "the training loss should go down";
  // The step log alone rebuilds the weights bit for bit.
  auto rp = run_command(zof::test::zof_binary() + " replay --model " + stories() + " --log " +
                        run.string() + " --out " + (dir_ / "replayed").string() + " --threads 2");
  ASSERT_EQ(rp.code, 0) << rp.err;
  EXPECT_TRUE(zof::test::read_file((run / "model.safetensors").string()) ==
              zof::test::read_file((dir_ / "replayed" / "model.safetensors").string()));
}

// Killed mid-run and resumed from its checkpoint, a JVP run ends with exactly the weights of an
// uninterrupted one (run.json keeps --estimator; the pending update is flushed at the save).
// In bf16 (--dtype bf16: the walk's matrix products) too, with a bf16 master.
TEST_F(JvpFinetune, ResumesExactly) {
  for (const std::string dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const std::string flags = " --estimator jvp --steps 10 --lr 1e-4 --save-every 3 --dtype " +
                              dtype + (dtype == "bf16" ? " --master bf16" : "");
    const fs::path a = dir_ / ("a_" + dtype), b = dir_ / ("b_" + dtype);
    auto ra = run_command(zof::test::zof_binary() + args(a.string()) + flags);
    ASSERT_EQ(ra.code, 0) << ra.err;
    auto rb = run_command("ZOF_FAULT_KILL_AT_STEP=7 " + zof::test::zof_binary() +
                          args(b.string()) + flags);
    ASSERT_EQ(rb.code, 128 + SIGKILL) << rb.err;
    ASSERT_FALSE(fs::exists(b / "model.safetensors"));
    auto r = run_command(zof::test::zof_binary() + " finetune --resume " + b.string() +
                         " --threads 2");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(zof::test::read_file((a / "model.safetensors").string()) ==
                zof::test::read_file((b / "model.safetensors").string()));
    const json run = json::parse(zof::test::read_file((a / "run.json").string()));
    EXPECT_EQ(run["options"]["dtype"], dtype);
  }
}

TEST_F(JvpFinetune, BadEstimatorIsRefused) {
  auto r = run_command(zof::test::zof_binary() + args((dir_ / "bogus").string()) +
                       " --steps 2 --estimator bogus");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("zof: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("--estimator"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bogus"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "bogus" / "run.json"));
  auto p = run_command(zof::test::zof_binary() + args((dir_ / "pipe").string()) +
                       " --steps 2 --estimator jvp --pipeline-stages 2");
  EXPECT_EQ(p.code, 1) << p.err;
  EXPECT_NE(p.err.find("--estimator jvp"), std::string::npos) << p.err;
  EXPECT_NE(p.err.find("--pipeline-stages"), std::string::npos) << p.err;
}

}  // namespace
