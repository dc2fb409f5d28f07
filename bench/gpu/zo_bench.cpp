// ZO step throughput on the GPU: src/zo's ZOEngine step as the trainer runs it (perturbed_losses
// + projected_gradients + schedule_update: two-point SPSA, q directions, the previous update
// fused into the next walk) over the CUDA backend, for a ~1B LLaMA-shaped model with random
// weights built on the host (Model::random) and resident in GPU memory in fp32 (enable_streaming
// with room for every block, so nothing streams after the first upload).
// Prints one JSON line: step seconds and tokens/s, and the engine's plain forward with loss
// (Forward::nll, the walk evaluation runs) for comparison.
// bench/gpu/mezo_peer.py times PyTorch/transformers' MeZO step on the same config and batch.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "zof/config.h"
#include "cuda/cuda_backend.h"
#include "zof/error.h"
#include "zof/model.h"
#include "zof/streaming.h"
#include "zof/runtime.h"
#include "zof/zo.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zo_bench: MeZO step tokens/s of a ~1B model on the GPU (resident)"};
  std::string config = std::string(ZOF_SOURCE_DIR) + "/bench/gpu/tinyllama_1b.json";
  int64_t batch = 8, seq = 512;
  int steps = 3, queries = 1;
  std::string dtype = "fp32";
  app.add_option("--model-config", config, "config.json of the model (random weights)");
  app.add_option("--batch", batch, "sequences per step");
  app.add_option("--seq", seq, "tokens per sequence");
  app.add_option("--steps", steps, "timed steps (after one warm-up)");
  app.add_option("--queries", queries, "ZO directions per step");
  app.add_option("--dtype", dtype, "the step's matrix products: fp32 | bf16 | auto (as zof finetune)");
  CLI11_PARSE(app, argc, argv);
  try {
    ZOF_CHECK(zof::cuda_device_count() > 0, "zo_bench needs a CUDA device; none is visible");
    ZOF_CHECK(batch > 0 && seq > 1 && steps > 0 && queries > 0,
              "--batch, --steps and --queries must be positive, --seq at least 2");
    const zof::ModelConfig cfg = zof::ModelConfig::load(config);
    const auto t_build = std::chrono::steady_clock::now();
    zof::Model model = zof::Model::random(cfg, 1);  // the host master (fp32, ~4.4 GB at 1.1B)
    std::fprintf(stderr, "zo_bench: %lld parameters built on the host in %.1f s\n",
                 (long long)model.num_params(), seconds_since(t_build));

    std::mt19937 rng(5);
    std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(batch),
                                           std::vector<int32_t>(static_cast<size_t>(seq)));
    for (auto& s : seqs)
      for (auto& id : s) id = int32_t(rng() % uint32_t(cfg.vocab_size));
    const zof::LossBatch lb = zof::LossBatch::next_token(zof::Batch::from_sequences(seqs));
    const std::vector<zof::LossBatch> micro = {lb};
    const int64_t rows = batch * seq;

    zof::ZOStepOptions opt;
    opt.eps = 1e-3f;
    opt.queries = queries;
    opt.seed = 1;
    auto be = zof::make_cuda_backend(0);
    opt.compute = zof::resolve_compute_dtype(
        zof::read_choice_text<zof::ComputeChoice>("--dtype", dtype), *be);
    zof::ZOEngine zo(model, *be, rows, opt);
    // Room for every block beside the engine's buffers: all resident, as in a run whose model
    // fits (the trainer's --device cuda without --gpu-mem).
    const int planes = 1 + zo.state_planes();
    const size_t blocks = std::max(zof::BlockStreamer::all_resident_bytes(model, planes),
                                   zof::BlockStreamer::min_bytes(model, planes));
    ZOF_CHECK(be->free_memory() >= blocks,
              "zo_bench keeps the whole model on the device: its blocks need " +
                  zof::format_bytes(blocks) + " beside the engine's buffers, the device has " +
                  zof::format_bytes(be->free_memory()) + " free; pick a smaller --model-config");
    zo.enable_streaming(zo.buffer_bytes() + blocks);
    ZOF_CHECK(zo.streamer()->all_resident(), "not all resident: " + zo.streamer()->describe());

    double loss = 0;
    auto step = [&](uint32_t s) {
      const zof::QueryLosses l = zo.perturbed_losses(s, micro);
      zo.schedule_update(s, 1e-6f, zo.projected_gradients(l));
      loss = l.sum_plus[0] / l.count;
    };
    step(0);  // warm-up: uploads the blocks; the timed steps apply the previous update fused
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 1; s <= steps; ++s) step(uint32_t(s));
    const double step_s = seconds_since(t0) / steps;

    // A plain forward with loss (no perturbation) of the same batch, for the step's overhead: the
    // engine's own Forward, reading the resident blocks (the pending update stays pending).
    std::vector<float> nll(static_cast<size_t>(rows));
    const std::vector<int32_t> targets = lb.position_targets();
    auto forward = [&] { zo.forward().nll(lb.batch, targets.data(), nll.data()); };
    forward();
    const auto t1 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) forward();
    const double fwd_s = seconds_since(t1) / steps;

    std::printf("{\"impl\": \"zof\", \"dtype\": \"%s\", \"params\": %lld, \"batch\": %lld, "
                "\"seq\": %lld, \"queries\": %d, \"step_s\": %.4f, \"tokens_per_s\": %.1f, "
                "\"forward_s\": %.4f, \"loss\": %.4f}\n",
                zof::compute_dtype_word(opt.compute), (long long)model.num_params(),
                (long long)batch, (long long)seq, queries, step_s,
                double(rows) / step_s, fwd_s, loss);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zo_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
