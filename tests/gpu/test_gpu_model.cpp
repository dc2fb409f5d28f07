// Whole models on the GPU through src's own classes over the CUDA backend, the weights on the
// device through a BlockStreamer as the trainer's walks read them: Forward's logits of every
// golden model against transformers' fp64 forward and against the CPU forward, twice with
// identical bits, and its per-token NLL over several head chunks against transformers; the
// ZOEngine step (dual forward, fused update) against the CPU engine, all resident and streamed:
// losses to fp32 accuracy, the updated weights bit for bit when both apply the same update; the
// JVP walk against the CPU walk; and `zof finetune --device cuda` against the CPU run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common.h"
#include "golden_batch.h"
#include "gpu/gpu_test.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zo/jvp.h"
#include "zof/model.h"
#include "hf/safetensors.h"
#include "zof/streaming.h"
#include "zof/zo.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Golden {
  json meta;
  std::string model_dir;
  zof::Batch batch;
  std::vector<float> logits_f64, nll;
};

fs::path golden_dir(const std::string& name) {
  return fs::path(zof::test::source_dir()) / "tests/golden" / name;
}

Golden load_golden(const std::string& name) {
  Golden g;
  std::ifstream f(golden_dir(name) / "golden.json");
  g.meta = json::parse(f);
  const std::string md = g.meta["model_dir"];
  g.model_dir = md.rfind("assets:", 0) == 0 ? zof::test::assets_dir() + "/" + md.substr(7)
                                            : golden_dir(name).string();
  std::vector<std::vector<int32_t>> seqs;
  for (size_t b = 0; b < g.meta["input_ids"].size(); ++b) {
    std::vector<int32_t> s;
    for (int t = 0; t < g.meta["lengths"][b].get<int>(); ++t) s.push_back(g.meta["input_ids"][b][t]);
    seqs.push_back(s);
  }
  g.batch = zof::Batch::from_sequences(seqs);
  auto a = zof::safetensors::Archive::open_file((golden_dir(name) / "golden.safetensors").string());
  auto read = [&](const char* n, std::vector<float>& v) {
    auto* t = a.find(n);
    ZOF_ASSERT(t);
    v.resize(t->numel());
    zof::safetensors::to_f32(*t, v.data());
  };
  read("logits_f64", g.logits_f64);
  read("nll", g.nll);
  return g;
}

using zof::test::golden_models;  // tests/golden_batch.h

// A streaming budget that keeps every block of m resident (the streamer takes no less than two
// slots of the largest block, more than the whole of a model that one block dominates).
size_t resident_budget(const zof::Model& m, int planes = 1) {
  return std::max(zof::BlockStreamer::all_resident_bytes(m, planes),
                  zof::BlockStreamer::min_bytes(m, planes));
}

// Forward on a device backend, the model's blocks all resident in device memory (the engine's
// evaluation reads them the same way).
class ResidentForward {
 public:
  ResidentForward(zof::Model& model, zof::Backend& be, int64_t max_rows)
      : weights_(model, be, resident_budget(model)),
        fwd_(model, be, max_rows) {
    fwd_.set_weights(&weights_);
  }
  zof::Forward& operator*() { return fwd_; }
  zof::Forward* operator->() { return &fwd_; }

 private:
  zof::BlockStreamer weights_;  // declared first: outlives the Forward that reads it
  zof::Forward fwd_;
};

// The model's logits (B*T, V) on the device.
std::vector<float> device_logits(zof::Backend& be, zof::Model& model, const zof::Batch& batch) {
  ResidentForward fwd(model, be, batch.B * batch.T);
  std::vector<float> logits;
  fwd->logits(batch, logits);
  return logits;
}

class GpuGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGolden, LogitsMatchTransformersAndCpu) {
  ZOF_REQUIRE_GPU();
  const std::string name = GetParam();
  ZOF_REQUIRE_PATH(golden_dir(name) / "golden.json");
  Golden g = load_golden(name);
  ZOF_REQUIRE_PATH(g.model_dir);
  zof::Model model = zof::Model::load(g.model_dir);
  const int64_t V = model.config().vocab_size, T_file = g.meta["input_ids"][0].size();
  auto be = zof::make_cuda_backend(0);
  const std::vector<float> logits = device_logits(*be, model, g.batch);
  double max_rel = 0;
  for (int64_t b = 0; b < g.batch.B; ++b)
    for (int64_t t = 0; t < g.batch.lengths[b]; ++t) {
      const float* ours = logits.data() + (b * g.batch.T + t) * V;
      const float* ref = g.logits_f64.data() + (b * T_file + t) * V;
      double scale = 1e-6;
      for (int64_t v = 0; v < V; ++v) scale = std::max(scale, (double)std::fabs(ref[v]));
      for (int64_t v = 0; v < V; ++v) {
        ASSERT_TRUE(std::isfinite(ours[v]));
        max_rel = std::max(max_rel, std::fabs(ours[v] - ref[v]) / scale);
      }
    }
  RecordProperty("max_rel_vs_fp64", std::to_string(max_rel));
  EXPECT_LT(max_rel, 2e-5) << name;

  // Against the CPU forward over the valid positions.
  auto cpu = zof::make_cpu_backend(0);
  zof::Forward cpu_fwd(model, *cpu, g.batch.B * g.batch.T);
  std::vector<float> cpu_logits;
  cpu_fwd.logits(g.batch, cpu_logits);
  std::vector<float> a, b;
  for (int64_t r = 0; r < g.batch.B; ++r)
    for (int64_t t = 0; t < g.batch.lengths[r]; ++t)
      for (int64_t v = 0; v < V; ++v) {
        a.push_back(cpu_logits[(r * g.batch.T + t) * V + v]);
        b.push_back(logits[(r * g.batch.T + t) * V + v]);
      }
  EXPECT_TRUE(zof::gpu_test::close(a, b, 2e-5)) << name << ": GPU vs CPU";

  // Per-token next-token NLL on the device against transformers, the golden rows repeated until
  // more than three times 256 rows are scored: Forward::nll forms the LM head's logits 256
  // scored rows at a time (forward.cpp), so the head runs in several chunks, the last one ragged.
  int64_t scored = 0;
  for (int64_t r = 0; r < g.batch.B; ++r) scored += g.batch.lengths[r] - 1;
  ASSERT_GT(scored, 0);
  const int64_t copies = 3 * 256 / scored + 1;
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t c = 0; c < copies; ++c)
    for (int64_t r = 0; r < g.batch.B; ++r) {
      const int32_t* row = g.batch.ids.data() + r * g.batch.T;
      seqs.emplace_back(row, row + g.batch.lengths[r]);
    }
  const zof::Batch repeated = zof::Batch::from_sequences(seqs);
  ASSERT_EQ(repeated.T, g.batch.T);
  ResidentForward fwd(model, *be, repeated.B * repeated.T);
  std::vector<float> nll;
  fwd->next_token_nll(repeated, nll);
  for (int64_t c = 0; c < copies; ++c)
    for (int64_t r = 0; r < g.batch.B; ++r)
      for (int64_t t = 0; t + 1 < g.batch.lengths[r]; ++t) {
        const float ref = g.nll[r * (T_file - 1) + t];
        EXPECT_NEAR(nll[(c * g.batch.B + r) * repeated.T + t], ref,
                    1e-4 * std::max(1.f, std::fabs(ref)))
            << "copy " << c << ", row " << r << ", position " << t;
      }
}

TEST_P(GpuGolden, Deterministic) {
  ZOF_REQUIRE_GPU();
  const std::string name = GetParam();
  ZOF_REQUIRE_PATH(golden_dir(name) / "golden.json");
  Golden g = load_golden(name);
  ZOF_REQUIRE_PATH(g.model_dir);
  zof::Model model = zof::Model::load(g.model_dir);
  auto be = zof::make_cuda_backend(0);
  const auto a = device_logits(*be, model, g.batch), b = device_logits(*be, model, g.batch);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Models, GpuGolden, ::testing::ValuesIn(golden_models()),
                         [](const auto& info) { return info.param; });

// ---- the ZO step ------------------------------------------------------------------------------

// Each test: a golden model's batch with next-token targets, as two micro-batches (a pending
// update lands only in the first).
class GpuZOStep : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ZOF_REQUIRE_GPU();
    ZOF_REQUIRE_PATH(golden_dir(GetParam()) / "golden.json");
    g = load_golden(GetParam());
    ZOF_REQUIRE_PATH(g.model_dir);
    lb = zof::LossBatch::next_token(g.batch);
    micro = {lb, lb};
    rows = lb.batch.B * lb.batch.T;
  }
  Golden g;
  zof::LossBatch lb;
  std::vector<zof::LossBatch> micro;
  int64_t rows = 0;
};

// Relative closeness of loss sums, and of g = (L+ - L-) / (2 eps count) through the same bound.
void expect_losses_close(const zof::QueryLosses& cpu, const zof::QueryLosses& gpu, double eps) {
  ASSERT_EQ(cpu.sum_plus.size(), gpu.sum_plus.size());
  EXPECT_EQ(cpu.count, gpu.count);
  for (size_t j = 0; j < cpu.sum_plus.size(); ++j) {
    const double tol = 2e-5 * std::max(std::fabs(cpu.sum_plus[j]), std::fabs(cpu.sum_minus[j]));
    EXPECT_NEAR(cpu.sum_plus[j], gpu.sum_plus[j], tol) << "query " << j;
    EXPECT_NEAR(cpu.sum_minus[j], gpu.sum_minus[j], tol) << "query " << j;
    const double g_cpu = (cpu.sum_plus[j] - cpu.sum_minus[j]) / cpu.count / (2 * eps);
    const double g_gpu = (gpu.sum_plus[j] - gpu.sum_minus[j]) / gpu.count / (2 * eps);
    EXPECT_NEAR(g_cpu, g_gpu, 2 * tol / cpu.count / (2 * eps)) << "projected gradient " << j;
  }
}

bool same_weights(const zof::Model& a, const zof::Model& b) {
  if (a.storage_size() != b.storage_size() || a.storage_dtype() != b.storage_dtype()) return false;
  const size_t bytes = size_t(a.storage_size()) * zof::dtype_size(a.storage_dtype());
  return std::memcmp(a.storage_ptr(), b.storage_ptr(), bytes) == 0;
}

// The trainer's step (perturbed_losses, projected_gradients, schedule_update) of src/zo's engine
// on the CUDA backend, every block resident, against the CPU engine: step 0's losses; step 1's,
// with step 0's update fused into its perturbation, and the weights after it bit for bit; then
// an update applied by flush() alone (no perturbation), bit for bit. Both engines schedule the
// CPU's g (the GPU's differs by fp32 rounding). The GPU engine forms the LM head's logits in
// vocabulary chunks of 100 rows (several, the last one ragged), the CPU engine in one.
TEST_P(GpuZOStep, MatchesCpuStep) {
  zof::ZOStepOptions opt;
  opt.eps = 1e-3f;
  opt.queries = 2;
  opt.seed = 20240601;
  opt.weight_decay = 0.1f;
  zof::ZOStepOptions chunked = opt;
  chunked.vocab_chunk = 100;

  zof::Model cpu_model = zof::Model::load(g.model_dir);
  zof::Model gpu_model = zof::Model::load(g.model_dir);  // the GPU engine's host master
  ASSERT_GT(gpu_model.config().vocab_size, 2 * chunked.vocab_chunk);
  auto cpu = zof::make_cpu_backend(0);
  auto be = zof::make_cuda_backend(0);
  zof::ZOEngine cpu_zo(cpu_model, *cpu, rows, opt);
  zof::ZOEngine gpu_zo(gpu_model, *be, rows, chunked);
  gpu_zo.enable_streaming(gpu_zo.buffer_bytes() +
                          resident_budget(gpu_model, 1 + gpu_zo.state_planes()));
  ASSERT_TRUE(gpu_zo.streamer()->all_resident()) << gpu_zo.streamer()->describe();

  // Step 0: losses at theta +/- eps z_j.
  const zof::QueryLosses c0 = cpu_zo.perturbed_losses(0, micro);
  const zof::QueryLosses g0 = gpu_zo.perturbed_losses(0, micro);
  expect_losses_close(c0, g0, opt.eps);
  const std::vector<double> grad0 = cpu_zo.projected_gradients(c0);
  cpu_zo.schedule_update(0, 1e-3f, grad0);
  gpu_zo.schedule_update(0, 1e-3f, grad0);

  // Step 1 applies that update fused with its perturbation.
  const zof::QueryLosses c1 = cpu_zo.perturbed_losses(1, micro);
  const zof::QueryLosses g1 = gpu_zo.perturbed_losses(1, micro);
  expect_losses_close(c1, g1, opt.eps);
  ASSERT_TRUE(gpu_zo.pending().empty());
  gpu_zo.flush();  // nothing pending: only writes the device copies back to gpu_model
  EXPECT_TRUE(same_weights(cpu_model, gpu_model)) << "weights after the fused update differ";

  // A flushed update (no perturbation) is bit-identical too.
  const std::vector<double> grad1 = cpu_zo.projected_gradients(c1);
  cpu_zo.schedule_update(1, 1e-3f, grad1);
  gpu_zo.schedule_update(1, 1e-3f, grad1);
  cpu_zo.flush();
  gpu_zo.flush();
  EXPECT_TRUE(same_weights(cpu_model, gpu_model)) << "weights after flush differ";
}

// src/zo's own engine on the CUDA backend, its weights streamed from host memory (all
// resident, then at the least budget, every block through two slots): the same losses as the
// CPU engine to fp32 accuracy, and the same weights bit for bit when both apply the same update.
// A bf16 master held in 2 bytes ("adam, bf16 master") streams in bf16 and is read and updated
// so by the kernels: the same weights bit for bit as the CPU's bf16-held master. With a
// rounding window ("sgd, bf16 master, window 2") step 1's walk reads the device blocks through
// step 0's update without writing them, and step 2's closes the window.
TEST_P(GpuZOStep, StreamedEngineOnCudaMatchesCpu) {
  for (const char* optimizer : {"sgd", "adam", "adam, bf16 master", "sgd, bf16 master, window 2"}) {
    for (bool tight : {false, true}) {
      SCOPED_TRACE(std::string(optimizer) + (tight ? ", least budget" : ", all resident"));
      const bool window = std::string(optimizer) == "sgd, bf16 master, window 2";
      const bool bf16 = std::string(optimizer) == "adam, bf16 master" || window;
      zof::ZOStepOptions opt;
      opt.eps = 1e-3f;
      opt.queries = 2;
      opt.seed = 20240601;
      opt.weight_decay = 0.1f;
      if (std::string(optimizer) == "adam" || std::string(optimizer) == "adam, bf16 master")
        opt.optimizer = zof::ZOStepOptions::Optimizer::Adam;
      if (bf16) opt.master = zof::DType::BF16;
      if (window) opt.round_every = 2;
      const zof::DType held = bf16 ? zof::DType::BF16 : zof::DType::F32;
      zof::Model cpu_model = zof::Model::load(g.model_dir, held);
      zof::Model gpu_model = zof::Model::load(g.model_dir, held);
      auto cpu = zof::make_cpu_backend(0);
      auto be = zof::make_cuda_backend(0);
      zof::ZOEngine cpu_zo(cpu_model, *cpu, rows, opt);
      zof::ZOEngine gpu_zo(gpu_model, *be, rows, opt);
      gpu_zo.enable_streaming(tight ? gpu_zo.streaming_minimum() : 0);
      EXPECT_EQ(gpu_zo.streamer()->all_resident(), !tight) << gpu_zo.streamer()->describe();
      for (uint32_t step = 0; step < 3; ++step) {
        const zof::QueryLosses c = cpu_zo.perturbed_losses(step, micro);
        const zof::QueryLosses d = gpu_zo.perturbed_losses(step, micro);
        expect_losses_close(c, d, opt.eps);
        const zof::PendingUpdate upd =
            zof::ZOEngine::make_update(opt, step, 1e-3f, cpu_zo.projected_gradients(c));
        cpu_zo.add_update(upd);  // a window's updates join those before them
        gpu_zo.add_update(upd);
      }
      cpu_zo.flush();
      gpu_zo.flush();  // writes the device copies back to gpu_model's storage
      EXPECT_TRUE(same_weights(cpu_model, gpu_model)) << "weights after three updates differ";
      // Evaluation through the streamer's device blocks.
      const double lc = cpu_zo.loss(micro), lg = gpu_zo.loss(micro);
      EXPECT_NEAR(lc, lg, 2e-5 * std::fabs(lc));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuZOStep, ::testing::Values("llama_gqa", "opt", "gpt2", "opt350_shape",
                                                            "llama3_scaled", "qwen3", "gemma2",
                                                            "gemma3"),
                         [](const auto& info) { return info.param; });


// The forward-gradient (JVP) walk on the CUDA backend, its weights streamed (all resident, then
// every block through two slots): the loss and the directional derivatives of the CPU walk, to
// fp32 accuracy (the tangent kernels of src/cuda/jvp.cu against the host loops, end to end);
// and with bf16 matrix products (--dtype bf16: each product's weight and z rounded into the
// walk's scratch, cuBLASLt's tensor cores), the CPU's bf16 walk to bf16's accuracy (the CPU and
// the reference backend's plain loops measured 8.5e-4 of the scale apart at most).
TEST_P(GpuZOStep, JvpWalkOnCudaMatchesCpu) {
  const std::vector<zof::ZKey> keys{{11, 2, 0}, {11, 2, 1}};
  zof::Model model = zof::Model::load(g.model_dir);
  auto cpu = zof::make_cpu_backend(0);
  for (zof::DType products : {zof::DType::F32, zof::DType::BF16}) {
    const bool bf = products == zof::DType::BF16;
    zof::JVPEstimator host(model, *cpu, rows, 2, products);
    const zof::JVPSums want = host.directional_derivatives(keys, micro);
    for (bool tight : {false, true}) {
      SCOPED_TRACE(std::string(tight ? "least budget" : "all resident") + (bf ? ", bf16" : ""));
      auto be = zof::make_cuda_backend(0);
      zof::JVPEstimator dev(model, *be, rows, 2, products);
      zof::BlockStreamer streamer(model, *be,
                                  tight ? zof::BlockStreamer::min_bytes(model)
                                        : zof::BlockStreamer::all_resident_bytes(model));
      dev.set_weights(&streamer);
      const zof::JVPSums got = dev.directional_derivatives(keys, micro);
      EXPECT_EQ(got.count, want.count);
      EXPECT_NEAR(got.sum_loss, want.sum_loss, (bf ? 2e-3 : 2e-5) * std::fabs(want.sum_loss));
      for (size_t j = 0; j < keys.size(); ++j)
        // A directional derivative is a sum of terms of both signs: its error is relative to the
        // loss scale, not to itself.
        EXPECT_NEAR(got.sum_dir[j], want.sum_dir[j],
                    (bf ? 1e-2 : 1e-4) *
                        std::max(std::fabs(want.sum_dir[j]), std::fabs(want.sum_loss)))
            << "direction " << j;
      streamer.sync_to_host();
    }
  }
}

// `zof finetune --device cuda`: the main job on the GPU, streamed at the least budget and all
// resident, against the same run on the CPU: the trajectories differ only by fp32 rounding in
// the losses (hence in g), so the evaluations agree closely and both learn.
class GpuFinetune : public zof::test::ShakespeareRunTest {};

TEST_F(GpuFinetune, CudaRunMatchesCpuRun) {
  ZOF_REQUIRE_GPU();
  auto run = [&](const std::string& out, const std::string& extra) {
    return zof::test::run_command(
        zof::test::zof_binary() + " finetune --model " + zof::test::assets_dir() +
        "/models/stories260K --task text --data " + (dir_ / "text.txt").string() + " --out " +
        (dir_ / out).string() + " --steps 30 --batch 8 --seq-len 64 --lr 1e-3 --seed 5 "
        "--eval-examples 16 --json " + extra);
  };
  auto last = [](const std::string& out) {
    const size_t end = out.find_last_not_of('\n');
    const size_t start = out.rfind('\n', end);
    return json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
  };
  const auto cpu = run("cpu", "--device cpu");
  ASSERT_EQ(cpu.code, 0) << cpu.err;
  const auto roomy = run("roomy", "--device cuda");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const json jc = last(cpu.out), jr = last(roomy.out);
  ASSERT_TRUE(jr.contains("streaming")) << jr.dump();
  EXPECT_EQ(jr["streaming"]["streamed_blocks"], 0);
  const auto tight = run("tight", "--device cuda --optimizer adam --gpu-mem " +
                                      std::to_string(jr["streaming"]["min_bytes"].get<uint64_t>() * 3));
  ASSERT_EQ(tight.code, 0) << tight.err;
  const double before = jc["eval"]["before"], after = jc["eval"]["after"];
  EXPECT_LT(after, before);
  EXPECT_NEAR(jr["eval"]["before"].get<double>(), before, 1e-4 * before);
  EXPECT_NEAR(jr["eval"]["after"].get<double>(), after, 2e-3 * after);
  EXPECT_LT(last(tight.out)["eval"]["after"].get<double>(), before);
  const auto bad = run("bad", "--device cuda --sim-device");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--sim-device"), std::string::npos) << bad.err;
}

// `zof eval` and `zof generate --device cuda`: the weights streamed through the GPU (tightly, and
// all resident) give the CPU's perplexity within fp32 rounding and its greedy text.
TEST(GpuText, EvalAndGenerateOnTheGpuMatchTheCpu) {
  ZOF_REQUIRE_GPU();
  const std::string m = zof::test::assets_dir() + "/models/stories260K";
  const std::string t = zof::test::assets_dir() + "/data/tinystories/tinystories_sample_cs336.txt";
  auto last = [](const std::string& out) {
    const size_t end = out.find_last_not_of('\n');
    const size_t start = out.rfind('\n', end);
    return json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
  };
  const std::string zof = zof::test::zof_binary();
  const std::string eval = zof + " eval --model " + m + " --text " + t + " --seq-len 128 --json";
  const std::string gen = zof + " generate --model " + m + " --max-new-tokens 24 --json";
  auto ec = zof::test::run_command(eval), gc = zof::test::run_command(gen);
  ASSERT_EQ(ec.code, 0) << ec.err;
  ASSERT_EQ(gc.code, 0) << gc.err;
  for (const char* budget : {"", " --gpu-mem 12MiB"}) {
    auto ed = zof::test::run_command(eval + " --device cuda" + budget);
    auto gd = zof::test::run_command(gen + " --device cuda" + budget);
    ASSERT_EQ(ed.code, 0) << ed.err;
    ASSERT_EQ(gd.code, 0) << gd.err;
    const double want = last(ec.out)["nll"].get<double>();
    EXPECT_NEAR(last(ed.out)["nll"].get<double>(), want, 1e-5 * want) << budget;
    EXPECT_EQ(last(gd.out)["ids"], last(gc.out)["ids"]) << budget;
  }
}

}  // namespace
