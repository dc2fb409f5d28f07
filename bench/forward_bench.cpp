// Forward-pass throughput of a model with random weights: tokens/s and achieved GFLOP/s of
// Forward::next_token_nll (the full forward: layers, LM head, loss) and of Forward::logits, beside
// the backend's matmul at one GEMM shape (M=1024, K=768, N=3072) timed in the same run as the
// machine's practical peak. bench/forward_peer.py times the same forward in PyTorch;
// bench/run_forward.sh runs both and prints the comparison.
//
// FLOPs are counted analytically, the same way in forward_peer.py:
//   2 * (matmul parameters of the layers) * tokens
//   + attention, causal half: QK^T and PV each cost 2 * B * H * D * T(T+1)/2 per layer
//   + LM head 2 * V * C * tokens (all B*T positions, though next_token_nll skips the last of each
//     row: 1 row in T, under 1% at T=128).
// Norms, biases, activations, softmax and the loss are not counted.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "zof/backend.h"
#include "zof/config.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/runtime.h"

using json = nlohmann::json;

namespace {

using namespace zof_bench;

// Per-op share of iters forwards run through a TimingBackend.
void print_profile(const zof::Model& model, zof::Backend& inner, const zof::Batch& batch,
                   bool logits, int iters) {
  TimingBackend tb(inner);
  zof::Forward fwd(model, tb, batch.B * batch.T);
  std::vector<float> out;
  auto run = [&] {
    if (logits) fwd.logits(batch, out);
    else fwd.next_token_nll(batch, out);
  };
  run();  // warm-up: oneDNN primitives, page faults
  tb.reset();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) run();
  const double total = seconds_since(t0) / iters;
  std::printf("\nper-op time of %s (%d forwards, %.1f ms each):\n", logits ? "logits" : "next_token_nll",
              iters, total * 1e3);
  print_op_table(tb, total, iters);
}

struct Args {
  std::string model_config = "gpt2-124m";
  int64_t batch = 8, seq = 128;
  int threads = 0;
  int warmup = 2, iters = 5;
  bool skip_logits = false, json = false, profile = false;
  uint64_t seed = 0;
};

int run(const Args& a) {
  ZOF_CHECK(a.batch > 0 && a.seq > 0, "--batch and --seq must be positive");
  ZOF_CHECK(a.iters > 0 && a.warmup >= 0, "--iters must be positive and --warmup non-negative");
  const int threads = a.threads > 0 ? a.threads : zof::default_host_threads();
  const zof::ModelConfig cfg = config_named(a.model_config);
  ZOF_CHECK(a.seq <= cfg.max_position, "--seq " + std::to_string(a.seq) +
                                           " exceeds the model's context of " +
                                           std::to_string(cfg.max_position));
  zof::BackendOptions bo;
  bo.threads = threads;
  auto backend = zof::make_backend(bo);

  // The machine's practical fp32 GEMM rate through the same backend: the MLP up-projection of a
  // 768-wide model at 1024 tokens. Timed (best of 5) after every timed forward and reported as
  // the median of those, so that peak and forward see the same stretch of a shared machine's load.
  GemmRate gemm(*backend);

  zof::Model model = zof::Model::random(cfg, a.seed);
  const int64_t B = a.batch, T = a.seq, rows = B * T;
  zof::Forward fwd(model, *backend, rows);
  const zof::Batch batch = random_batch(B, T, cfg.vocab_size, a.seed + 1);

  std::vector<float> nll, logits;
  gemm.clear();
  const double s_nll = median_seconds(a.warmup, a.iters, [&] { fwd.next_token_nll(batch, nll); },
                                      [&] { gemm.sample(); });
  double s_logits = 0;
  if (!a.skip_logits)
    s_logits = median_seconds(a.warmup, a.iters, [&] { fwd.logits(batch, logits); },
                              [&] { gemm.sample(); });
  const double gemm_gflops = gemm.gflops();
  double mean_nll = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) mean_nll += nll[b * T + t];
  mean_nll /= double(B * (T - 1));

  const Flops f = count_flops(cfg, B, T);
  const double gflops = f.total() / s_nll * 1e-9;
  const double gflops_logits = s_logits > 0 ? f.total() / s_logits * 1e-9 : 0;

  std::printf("%-12s %7s %9s %16s %12s %10s %10s %8s\n", "model", "threads", "B x T", "op",
              "ms/forward", "tokens/s", "GFLOP/s", "of GEMM");
  auto row = [&](const char* op, double s) {
    std::printf("%-12s %7d %4ld x %-4ld %16s %12.1f %10.0f %10.1f %7.0f%%\n",
                a.model_config.c_str(), threads, long(B), long(T), op, s * 1e3, rows / s,
                f.total() / s * 1e-9, 100.0 * f.total() / s * 1e-9 / gemm_gflops);
  };
  row("next_token_nll", s_nll);
  if (s_logits > 0) row("logits", s_logits);
  std::printf("GEMM %ldx%ldx%ld (M,N,K) through the backend: %.1f GFLOP/s\n",
              long(GemmRate::M), long(GemmRate::N), long(GemmRate::K), gemm_gflops);
  std::printf("GFLOP per forward: %.1f (layers %.1f, attention %.1f, LM head %.1f); mean nll %.4f"
              " (ln V = %.4f)\n",
              f.total() * 1e-9, f.layers * 1e-9, f.attention * 1e-9, f.head * 1e-9, mean_nll,
              std::log(double(cfg.vocab_size)));
  if (a.profile) {
    print_profile(model, *backend, batch, false, a.iters);
    if (!a.skip_logits) print_profile(model, *backend, batch, true, a.iters);
  }
  if (a.json) {
    json j = {{"impl", "zof"},
              {"model", a.model_config},
              {"threads", threads},
              {"batch", B},
              {"seq", T},
              {"params", model.num_params()},
              {"gflop_per_forward", f.total() * 1e-9},
              {"nll_ms", s_nll * 1e3},
              {"nll_tokens_per_s", rows / s_nll},
              {"nll_gflops", gflops},
              {"logits_ms", s_logits * 1e3},
              {"logits_tokens_per_s", s_logits > 0 ? rows / s_logits : 0.0},
              {"logits_gflops", gflops_logits},
              {"gemm_gflops", gemm_gflops},
              {"fraction_of_gemm", gflops / gemm_gflops},
              {"mean_nll", mean_nll}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"forward_bench: forward tokens/s and GFLOP/s of a random-weight model (CPU)"};
  Args a;
  app.add_option("--model-config", a.model_config,
                 "gpt2-124m, llama-125m, or a path to a config.json")
      ->capture_default_str();
  app.add_option("--batch", a.batch, "sequences per batch")->capture_default_str();
  app.add_option("--seq", a.seq, "tokens per sequence")->capture_default_str();
  app.add_option("--threads", a.threads, "CPU threads (0: OpenMP's default)")->capture_default_str();
  app.add_option("--warmup", a.warmup, "untimed forwards first")->capture_default_str();
  app.add_option("--iters", a.iters, "timed forwards (the median is reported)")->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the weights and tokens")->capture_default_str();
  app.add_flag("--skip-logits", a.skip_logits, "time only next_token_nll, not Forward::logits");
  app.add_flag("--profile", a.profile,
               "also print the time of each backend op (matmuls by shape) over the forward");
  app.add_flag("--json", a.json, "end with one JSON line of the results");
  try {
    app.parse(argc, argv);
    return run(a);
  } catch (const CLI::ParseError& err) {
    return app.exit(err);
  } catch (const zof::Error& err) {
    std::fprintf(stderr, "forward_bench: error: %s\n", err.what());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "forward_bench: error: out of memory\n");
  }
  return 1;
}
