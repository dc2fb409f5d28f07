// Parameter streaming, measured: the ZO step (perturbed_losses + projected_gradients +
// schedule_update) of a random-weight model with its blocks streamed through a device budget of
// 1/4, 1/2 and all of the model (plus the engine's buffers), against the same steps on the plain
// backend in the same run. The device is the simulated one (sim_device.h: host memory, copy
// threads, optionally a bus of --copy-gbps), or with --device cuda the GPU (the scheduler only
// uses the Backend interface); there the whole-model row is the baseline, and the copy rate,
// waits and peak (simulated-device counters) are not reported.
// Reports per budget: tokens/s, bytes uploaded and written back per step, the copy streams'
// achieved bandwidth, the fraction of the step the compute stream waited on transfers, and the
// peak device memory against the budget. --optimizer momentum|adam streams the optimizer state
// with the blocks (two or three planes per block), so the same fractions hold 2-3x the bytes.
// --dtype bf16 runs the walks' matrix products and attention in bf16 (as zof finetune --dtype),
// their perturbed copies bf16 on the device; --master bf16 also streams the weights in 2 bytes.

#include <CLI/CLI.hpp>

#include "bench_common.h"
#include "zof/model.h"
#include "zof/runtime.h"
#include "zof/streaming.h"
#include "zof/zo.h"

namespace {

using namespace zof_bench;

// 8 layers of width 512 (a layer, 12.6 MB, outweighs the 8.4 MB embedding and LM head, so a
// quarter of the model still holds two slots): ~30M parameters, 118 MB in fp32.
const char* kLlama8x512 = R"({
  "model_type": "llama", "vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1376,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64,
  "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2
})";

struct Args {
  std::string model_config = "llama-8x512";
  int64_t batch = 4, seq = 64;
  int threads = 0, queries = 1, micro_batches = 1;
  int warmup = 1, iters = 3;
  std::string optimizer = "sgd";
  std::string master = "fp32";
  std::string dtype = "fp32";          // the flag
  zof::DType compute = zof::DType::F32;  // resolved on the measured device (auto)
  std::string device = "sim";
  double copy_gbps = 0;
  bool check = false, json = false;
  uint64_t seed = 0;
};

struct Row {
  std::string name;
  size_t budget = 0;
  double step_s = 0, tokens_per_s = 0;
  double up_per_step = 0, down_per_step = 0, copy_gbps = 0, wait_frac = 0;
  size_t peak = 0;
  std::string plan;
  int64_t hazards = 0;
};

std::vector<zof::LossBatch> make_batches(const Args& a, int64_t vocab) {
  std::mt19937_64 rng(a.seed + 1);
  std::vector<zof::LossBatch> mb;
  const int64_t per = std::max<int64_t>(1, a.batch / a.micro_batches);
  for (int m = 0; m < a.micro_batches; ++m) {
    std::vector<std::vector<int32_t>> seqs(per, std::vector<int32_t>(a.seq));
    for (auto& s : seqs)
      for (auto& t : s) t = (int32_t)(rng() % (uint64_t)vocab);
    mb.push_back(zof::LossBatch::next_token(zof::Batch::from_sequences(seqs)));
  }
  return mb;
}

zof::ZOStepOptions step_options(const Args& a) {
  zof::ZOStepOptions o;
  o.queries = a.queries;
  o.seed = a.seed;
  ZOF_CHECK(a.optimizer == "sgd" || a.optimizer == "momentum" || a.optimizer == "adam",
            "--optimizer must be sgd, momentum or adam, not '" + a.optimizer + "'");
  o.optimizer = a.optimizer == "adam"       ? zof::ZOStepOptions::Optimizer::Adam
                : a.optimizer == "momentum" ? zof::ZOStepOptions::Optimizer::Momentum
                                            : zof::ZOStepOptions::Optimizer::SGD;
  ZOF_CHECK(a.master == "fp32" || a.master == "bf16",
            "--master must be fp32 or bf16, not '" + a.master + "'");
  o.master = a.master == "bf16" ? zof::DType::BF16 : zof::DType::F32;
  o.compute = a.compute;
  return o;
}

// A bf16 master is held (and streamed) in 2 bytes a parameter, as zof finetune holds it.
zof::DType storage(const Args& a) { return a.master == "bf16" ? zof::DType::BF16 : zof::DType::F32; }

// budget 0: the plain backend, no streaming.
Row measure(const Args& a, const zof::ModelConfig& cfg, const std::string& name, size_t budget,
            int threads) {
  zof::Model model = zof::Model::random(cfg, a.seed, storage(a));
  const auto micro = make_batches(a, cfg.vocab_size);
  int64_t rows = 0, tokens = 0;
  for (auto& m : micro) {
    rows = std::max(rows, m.batch.B * m.batch.T);
    tokens += m.batch.B * m.batch.T;
  }
  zof::BackendOptions bo;
  bo.device = a.device == "cuda" ? zof::DeviceChoice::Cuda : zof::DeviceChoice::Cpu;
  bo.threads = threads;
  bo.sim_device = budget > 0 && a.device != "cuda";
  bo.sim_budget = budget;
  bo.sim_copy_bandwidth = a.copy_gbps * 1e9;
  bo.sim_check_hazards = a.check;
  std::unique_ptr<zof::Backend> be = zof::make_backend(bo);
  const bool sim = bo.sim_device;
  const zof::ZOStepOptions o = step_options(a);
  Row r;
  r.name = name;
  r.budget = budget;
  zof::ZOEngine eng(model, *be, rows, o);
  if (budget > 0) {
    // The minimum as this device counts the engine's buffers (a GPU's pool may round them up
    // beyond the simulated device's measure of it).
    budget = std::max(budget, eng.streaming_minimum());
    r.budget = budget;
    eng.enable_streaming(budget);
    r.plan = eng.streamer()->describe();
  }
  uint32_t step = 0;
  auto one_step = [&] {
    const auto ql = eng.perturbed_losses(step, micro);
    eng.schedule_update(step, 1e-5f, eng.projected_gradients(ql));
    ++step;
  };
  for (int i = 0; i < a.warmup; ++i) one_step();
  if (sim) zof::reset_sim_device_counters(*be);
  const zof::StreamingStats s0 = budget ? eng.streamer()->stats() : zof::StreamingStats{};
  std::vector<double> times;
  for (int i = 0; i < a.iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    one_step();
    times.push_back(seconds_since(t0));
  }
  double total = 0;
  for (double t : times) total += t;
  r.step_s = median(times);
  r.tokens_per_s = (double)tokens / r.step_s;
  if (budget > 0) {
    const zof::StreamingStats s1 = eng.streamer()->stats();
    r.up_per_step = double(s1.bytes_uploaded - s0.bytes_uploaded) / a.iters;
    r.down_per_step = double(s1.bytes_written_back - s0.bytes_written_back) / a.iters;
  }
  if (sim) {
    const zof::SimDeviceReport ss = *zof::sim_device_report(*be);
    r.copy_gbps = ss.copy_busy_s > 0 ? double(ss.bytes_to_device + ss.bytes_to_host) / ss.copy_busy_s * 1e-9 : 0;
    r.wait_frac = ss.compute_wait_s / total;
    r.peak = ss.peak;
    r.hazards = ss.hazards;
  }
  eng.flush();
  return r;
}

int run(Args a) {
  ZOF_CHECK(a.batch > 0 && a.seq > 1 && a.iters > 0 && a.micro_batches > 0,
            "--batch, --seq, --iters and --micro-batches must be positive (--seq at least 2)");
  ZOF_CHECK(a.device == "sim" || a.device == "cuda", "--device must be sim or cuda");
  const int threads = zof::setup_host_threads(a.threads > 0 ? a.threads : zof::default_host_threads(), 1);
  {  // --dtype auto follows the measured device: the GPU's tensor cores, or this CPU's
    zof::BackendOptions bo;
    bo.device = a.device == "cuda" ? zof::DeviceChoice::Cuda : zof::DeviceChoice::Cpu;
    bo.threads = threads;
    a.compute = zof::resolve_compute_dtype(
        zof::read_choice_text<zof::ComputeChoice>("--dtype", a.dtype), *zof::make_backend(bo));
  }
  const zof::ModelConfig cfg = a.model_config == "llama-8x512"
                                   ? zof::ModelConfig::from_json(json::parse(kLlama8x512), a.model_config)
                                   : config_named(a.model_config);
  // The engine's buffers and the minimum, measured on a roomy simulated device.
  size_t buffers = 0, minimum = 0, whole = 0;
  {
    zof::Model model = zof::Model::random(cfg, a.seed, storage(a));
    zof::BackendOptions bo;
    bo.threads = threads;
    bo.sim_device = true;
    bo.sim_budget = size_t(1) << 40;
    bo.sim_check_hazards = false;
    auto sim = zof::make_backend(bo);
    zof::ZOEngine eng(model, *sim, std::max<int64_t>(1, a.batch / a.micro_batches) * a.seq,
                      step_options(a));
    buffers = eng.streaming_buffers();  // the engine's, and a bf16 evaluation's scratch
    minimum = eng.streaming_minimum();
    whole = zof::BlockStreamer::all_resident_bytes(model, 1 + eng.state_planes());
  }
  std::vector<Row> rows;
  // On the GPU the weights must be on the device: no unstreamed row there.
  if (a.device != "cuda")
    rows.push_back(measure(a, cfg, "plain " + zof::make_backend({.threads = 1})->name(), 0, threads));
  for (double f : {1.0, 0.5, 0.25}) {
    size_t budget = buffers + (size_t)(f * (double)whole);
    std::string name = f == 1.0 ? "whole model" : f == 0.5 ? "1/2 model" : "1/4 model";
    if (budget < minimum) {
      budget = minimum;
      name += " (raised to the minimum)";
    }
    rows.push_back(measure(a, cfg, name, budget, threads));
  }

  char bus[160] = "memcpy speed";
  if (a.device == "cuda") std::snprintf(bus, sizeof bus, "none (the GPU's own copy engines)");
  if (a.copy_gbps > 0) std::snprintf(bus, sizeof bus, "%.2f GB/s per copy stream", a.copy_gbps);
  const std::string state = a.optimizer == "sgd" ? "" : " with the " + a.optimizer + " state";
  std::printf("%s, %ld parameters (%.1f MB %s master%s in %zu blocks), %s products, batch %ld "
              "x %ld, q=%d, %d micro-batch(es), %d threads; engine buffers %.1f MB, minimum budget "
              "%.1f MB; simulated bus: %s\n\n",
              a.model_config.c_str(), (long)zof::Model::random(cfg, a.seed).num_params(),
              whole / 1e6, a.master.c_str(), state.c_str(), (size_t)cfg.num_layers + 2,
              zof::compute_dtype_word(a.compute), (long)a.batch, (long)a.seq,
              a.queries, a.micro_batches, threads, buffers / 1e6, minimum / 1e6, bus);
  std::printf("| %-36s | %9s | %8s | %9s | %12s | %12s | %10s | %9s | %9s |\n", "run",
              "budget MB", "ms/step", "tokens/s", "up MB/step", "down MB/step", "copy GB/s",
              "waited", "peak MB");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(38, '-').c_str(),
              std::string(11, '-').c_str(), std::string(10, '-').c_str(), std::string(11, '-').c_str(),
              std::string(14, '-').c_str(), std::string(14, '-').c_str(), std::string(12, '-').c_str(),
              std::string(11, '-').c_str(), std::string(11, '-').c_str());
  for (const Row& r : rows) {
    if (r.budget == 0) {
      std::printf("| %-36s | %9s | %8.1f | %9.0f | %12s | %12s | %10s | %9s | %9s |\n",
                  r.name.c_str(), "-", r.step_s * 1e3, r.tokens_per_s, "-", "-", "-", "-", "-");
      continue;
    }
    if (a.device == "cuda") {  // no simulated-device counters
      std::printf("| %-36s | %9.1f | %8.1f | %9.0f | %12.1f | %12.1f | %10s | %9s | %9s |\n",
                  r.name.c_str(), r.budget / 1e6, r.step_s * 1e3, r.tokens_per_s,
                  r.up_per_step / 1e6, r.down_per_step / 1e6, "-", "-", "-");
      continue;
    }
    std::printf("| %-36s | %9.1f | %8.1f | %9.0f | %12.1f | %12.1f | %10.2f | %8.1f%% | %9.1f |\n",
                r.name.c_str(), r.budget / 1e6, r.step_s * 1e3, r.tokens_per_s, r.up_per_step / 1e6,
                r.down_per_step / 1e6, r.copy_gbps, 100 * r.wait_frac, r.peak / 1e6);
  }
  std::printf("\n");
  for (const Row& r : rows)
    if (!r.plan.empty()) std::printf("  %s: %s%s\n", r.name.c_str(), r.plan.c_str(),
                                     a.check ? (", hazards " + std::to_string(r.hazards)).c_str() : "");
  if (a.json) {
    json j = json::array();
    for (const Row& r : rows)
      j.push_back({{"run", r.name}, {"budget_bytes", r.budget}, {"step_s", r.step_s},
                   {"tokens_per_s", r.tokens_per_s}, {"uploaded_per_step", r.up_per_step},
                   {"written_back_per_step", r.down_per_step}, {"copy_gbps", r.copy_gbps},
                   {"compute_wait_fraction", r.wait_frac}, {"peak_bytes", r.peak}});
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Parameter streaming: the ZO step with blocks streamed through a device budget"};
  app.add_option("--model-config", a.model_config,
                 "llama-8x512 (default), gpt2-124m, llama-125m or a config.json")
      ->capture_default_str();
  app.add_option("--batch", a.batch, "sequences per step")->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per sequence")->capture_default_str();
  app.add_option("--micro-batches", a.micro_batches, "micro-batches per step")->capture_default_str();
  app.add_option("--queries", a.queries, "SPSA directions per step")->capture_default_str();
  app.add_option("--master", a.master, "master weights: fp32 or bf16 (held and streamed in 2 "
                 "bytes a parameter)")->capture_default_str();
  app.add_option("--dtype", a.dtype, "the walks' matrix products and attention: fp32, bf16 or "
                 "auto (as zof finetune --dtype)")->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "sgd, momentum or adam (its state streams too)")
      ->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: OpenMP's default)")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--iters", a.iters, "timed steps (medians are reported)")->capture_default_str();
  app.add_option("--copy-gbps", a.copy_gbps, "simulated bus per copy stream, GB/s (0: memcpy)")
      ->capture_default_str();
  app.add_option("--device", a.device, "sim (the simulated device) or cuda (GPU 0)")
      ->capture_default_str();
  app.add_flag("--check", a.check, "run the simulated device's hazard checker (slower)");
  app.add_flag("--json", a.json, "end with one JSON line");
  app.add_option("--seed", a.seed, "seed of the weights, tokens and perturbations")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(a);
  } catch (const zof::Error& err) {
    std::fprintf(stderr, "stream_bench: error: %s\n", err.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "stream_bench: error: out of memory\n");
  }
  return 1;
}
