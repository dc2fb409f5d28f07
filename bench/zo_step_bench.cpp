// The ZO step on the CPU, measured: ZOEngine::perturbed_losses + projected_gradients +
// schedule_update (the pending update lands in the next walk) on a model with random weights (a
// built-in config, a config.json, or a model directory), at batch B x T of random tokens.
// Reports the step time split into the two forward passes (backend ops other than the parameter
// passes), the passes over parameters (Backend::zo_pass: pending update + perturbation) and the
// rest (bookkeeping in the walk); tokens/s; the forward's GFLOP/s against the backend's GEMM rate
// measured in the same run; peak resident memory against the model as held (fp32, or a bf16
// master's 2 bytes a parameter: --master bf16, so a LLaMA-2-7B shape, --model-config llama2-7b,
// fits a 24 GiB machine) plus one forward's activations. bench/zo_peer.py times MeZO's step in PyTorch; bench/run_zo_step.sh runs both.
//
// FLOPs per step: 2 x the forward count of bench_common.h (two forwards per query).

#include <CLI/CLI.hpp>

#include "bench_common.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/runtime.h"
#include "zof/zo.h"

namespace {

using namespace zof_bench;

struct Args {
  std::string model_config = "gpt2-124m", model_dir, dtype = "auto", master = "fp32";
  int64_t batch = 8, seq = 128, vocab_chunk = 0;
  int threads = 0, queries = 1, round_every = 1;
  int warmup = 2, iters = 5;
  bool json = false, profile = false;
  uint64_t seed = 0;
};

int run(const Args& a) {
  ZOF_CHECK(a.batch > 0 && a.seq > 0, "--batch and --seq must be positive");
  ZOF_CHECK(a.iters > 0 && a.warmup >= 0, "--iters must be positive and --warmup non-negative");
  const int threads = a.threads > 0 ? a.threads : zof::default_host_threads();
  zof::BackendOptions bo;
  bo.threads = threads;
  auto backend = zof::make_backend(bo);
  const zof::DType dtype = zof::resolve_compute_dtype(
      zof::read_choice_text<zof::ComputeChoice>("--dtype", a.dtype), *backend);
  const std::string unit = backend->compute_info().isa;

  // The GEMM rate in the step's dtype, sampled before and after the steps; its buffers exist
  // before the memory baseline is read.
  GemmRate gemm(*backend, dtype);
  gemm.sample();

  const double rss_base = proc_status_bytes("VmRSS");
  // A bf16 master is held in 2 bytes a parameter, as zof finetune holds it on the host.
  const zof::DType storage = a.master == "bf16" ? zof::DType::BF16 : zof::DType::F32;
  const auto t_load = std::chrono::steady_clock::now();
  zof::Model model = a.model_dir.empty()
                         ? zof::Model::random(config_named(a.model_config), a.seed, storage)
                         : zof::Model::load(a.model_dir, storage);
  const double load_s = seconds_since(t_load);
  const zof::ModelConfig& cfg = model.config();
  const std::string name = a.model_dir.empty() ? a.model_config : a.model_dir;
  ZOF_CHECK(a.seq <= cfg.max_position, "--seq " + std::to_string(a.seq) +
                                           " exceeds the model's context of " +
                                           std::to_string(cfg.max_position));
  const int64_t B = a.batch, T = a.seq, rows = B * T;
  const double model_bytes =
      (double)zof::dtype_size(model.storage_dtype()) * (double)model.storage_size();
  TimingBackend tb(*backend);
  // One forward's activation buffers, as Forward allocates them for `rows` tokens.
  double act_bytes = 0;
  {
    zof::Forward probe(model, tb, rows);
    act_bytes = (double)tb.live_bytes;
  }
  zof::ZOStepOptions zo;
  zo.eps = 1e-3f;
  zo.queries = a.queries;
  zo.seed = a.seed;
  zo.vocab_chunk = a.vocab_chunk;
  zo.compute = dtype;
  zo.master = a.master == "bf16" ? zof::DType::BF16 : zof::DType::F32;
  zo.round_every = a.round_every;
  const size_t live0 = tb.live_bytes;
  zof::ZOEngine engine(model, tb, rows, zo);
  const double engine_bytes = (double)(tb.live_bytes - live0);

  const std::vector<zof::LossBatch> micro{
      zof::LossBatch::next_token(random_batch(B, T, cfg.vocab_size, a.seed + 1))};

  uint32_t step = 0;
  double loss = 0;
  auto zo_step = [&] {
    const zof::QueryLosses ql = engine.perturbed_losses(step, micro);
    const std::vector<double> g = engine.projected_gradients(ql);
    loss = 0.5 * (ql.sum_plus[0] + ql.sum_minus[0]) / ql.count;
    engine.schedule_update(step, 1e-6f, g);
    ++step;
  };
  for (int i = 0; i < a.warmup; ++i) zo_step();
  std::vector<double> t_step, t_pass, t_ops;
  for (int i = 0; i < a.iters; ++i) {
    tb.reset();
    auto t0 = std::chrono::steady_clock::now();
    zo_step();
    t_step.push_back(seconds_since(t0));
    double pass = 0, ops = 0;
    for (auto& [k, e] : tb.entries) (k == TimingBackend::kZOPass ? pass : ops) += e.seconds;
    t_pass.push_back(pass);
    t_ops.push_back(ops);
  }
  gemm.sample();
  const double rss_peak = proc_status_bytes("VmHWM");
  // A rounding window's steps differ (each regenerates the window's z's so far): their mean
  // over whole windows is the cost; otherwise the median.
  auto mid = [&](const std::vector<double>& v) {
    if (a.round_every <= 1) return median(v);
    double sum = 0;
    for (double x : v) sum += x;
    return sum / (double)v.size();
  };
  const double s = mid(t_step), s_pass = mid(t_pass), s_ops = mid(t_ops);
  const double gemm_gflops = gemm.gflops();
  const Flops f = count_flops(cfg, B, T);
  const double flop_step = 2.0 * a.queries * f.total();
  const double net_peak = rss_peak - rss_base;
  const double mem_ratio = net_peak / (model_bytes + act_bytes);

  std::printf("%-14s %4ld x %-4ld q=%d threads=%d %s (%s), %s master: %.1f ms/step (forwards %.1f ms = "
              "%.1f%%, parameter passes %.1f ms = %.1f%%, rest %.1f ms)\n",
              name.c_str(), long(B), long(T), a.queries, threads, zof::compute_dtype_word(dtype),
              unit.c_str(), a.master.c_str(), s * 1e3, s_ops * 1e3,
              100 * s_ops / s, s_pass * 1e3, 100 * s_pass / s, (s - s_ops - s_pass) * 1e3);
  std::printf("  %.0f tokens/s (%ld tokens/step); %.1f GFLOP/s over the step, %.1f GFLOP/s in the "
              "forwards = %.0f%% of the %s GEMM rate %.1f GFLOP/s\n",
              rows / s, long(rows), flop_step / s * 1e-9, flop_step / s_ops * 1e-9,
              100 * flop_step / s_ops * 1e-9 / gemm_gflops, zof::compute_dtype_word(dtype),
              gemm_gflops);
  std::printf("  memory: peak RSS %.0f MB above a %.0f MB baseline (peak %.0f MB); %s model %.0f "
              "MB (%.2fB parameters, made in %.1f s) + one forward's activations %.0f MB = %.0f "
              "MB -> ratio %.2f (engine buffers %.0f MB)\n",
              net_peak / 1e6, rss_base / 1e6, rss_peak / 1e6,
              zof::compute_dtype_word(model.storage_dtype()), model_bytes / 1e6,
              model.num_params() / 1e9, load_s, act_bytes / 1e6,
              (model_bytes + act_bytes) / 1e6, mem_ratio, engine_bytes / 1e6);
  std::printf("  mean loss at theta +/- eps z: %.4f (ln V = %.4f)\n", loss,
              std::log(double(cfg.vocab_size)));
  if (a.profile) {
    // One more step, op by op.
    tb.reset();
    auto t0 = std::chrono::steady_clock::now();
    zo_step();
    const double total = seconds_since(t0);
    std::printf("\nper-op time of one step (%.1f ms):\n", total * 1e3);
    print_op_table(tb, total, 1);
  }
  if (a.json) {
    json j = {{"impl", "zof"},
              {"dtype", zof::compute_dtype_word(dtype)},
              {"unit", unit},
              {"master", a.master},
              {"round_every", a.round_every},
              {"model", name},
              {"threads", threads},
              {"batch", B},
              {"seq", T},
              {"queries", a.queries},
              {"params", model.num_params()},
              {"step_ms", s * 1e3},
              {"forward_ms", s_ops * 1e3},
              {"param_pass_ms", s_pass * 1e3},
              {"rest_ms", (s - s_ops - s_pass) * 1e3},
              {"tokens_per_s", rows / s},
              {"gflop_per_step", flop_step * 1e-9},
              {"step_gflops", flop_step / s * 1e-9},
              {"forward_gflops", flop_step / s_ops * 1e-9},
              {"gemm_gflops", gemm_gflops},
              {"model_mb", model_bytes / 1e6},
              {"activations_mb", act_bytes / 1e6},
              {"engine_mb", engine_bytes / 1e6},
              {"rss_base_mb", rss_base / 1e6},
              {"rss_peak_mb", rss_peak / 1e6},
              {"master_storage", zof::compute_dtype_word(model.storage_dtype())},
              {"model_s", load_s},
              {"mem_ratio", mem_ratio},
              {"loss", loss}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zo_step_bench: the CPU ZO step of a random-weight model, split and measured"};
  Args a;
  app.add_option("--model-config", a.model_config,
                 "gpt2-124m, llama-125m, llama2-7b, or a path to a config.json (random weights)")
      ->capture_default_str();
  app.add_option("--model", a.model_dir, "a Hugging Face model directory instead (its weights)");
  app.add_option("--batch", a.batch, "sequences per step")->capture_default_str();
  app.add_option("--dtype", a.dtype, "matrix products: auto | bf16 | fp32 (as zof finetune)")
      ->capture_default_str();
  app.add_option("--master", a.master, "master weights: fp32 | bf16 (as zof finetune)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per sequence")->capture_default_str();
  app.add_option("--round-every", a.round_every,
                 "a bf16 master rounded once every N steps (as zof finetune; time: the mean "
                 "over the timed steps, give --iters a multiple of N)")
      ->capture_default_str();
  app.add_option("--queries", a.queries, "SPSA directions per step")->capture_default_str();
  app.add_option("--vocab-chunk", a.vocab_chunk, "LM head rows per chunk (0: the engine's)")
      ->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: OpenMP's default)")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--iters", a.iters, "timed steps (medians are reported)")->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the weights, tokens and perturbations")
      ->capture_default_str();
  app.add_flag("--profile", a.profile, "also print one step's time per backend op");
  app.add_flag("--json", a.json, "end with one JSON line of the results");
  try {
    app.parse(argc, argv);
    return run(a);
  } catch (const CLI::ParseError& err) {
    return app.exit(err);
  } catch (const zof::Error& err) {
    std::fprintf(stderr, "zo_step_bench: error: %s\n", err.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "zo_step_bench: error: out of memory\n");
  }
  return 1;
}
