// ZO step throughput on the GPU: the MeZO step (two-point SPSA, q directions, the previous
// update fused into the next perturbation) of a ~1B LLaMA-shaped model with random weights,
// resident in GPU memory in fp32, through tests/gpu/device_walk.h over the CUDA backend.
// Prints one JSON line: step seconds and tokens/s, and a plain forward's for comparison.
// bench/gpu/mezo_peer.py times PyTorch/transformers' MeZO step on the same config and batch.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <tuple>

#include "gpu/device_walk.h"
#include "zof/config.h"
#include "zof/cuda.h"
#include "zof/model.h"
#include "zof/zo.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zo_bench: MeZO step tokens/s of a ~1B model on the GPU (fp32, resident)"};
  std::string config = std::string(ZOF_SOURCE_DIR) + "/bench/gpu/tinyllama_1b.json";
  int64_t batch = 8, seq = 512;
  int steps = 3, queries = 1;
  app.add_option("--model-config", config, "config.json of the model (random weights)");
  app.add_option("--batch", batch, "sequences per step");
  app.add_option("--seq", seq, "tokens per sequence");
  app.add_option("--steps", steps, "timed steps (after one warm-up)");
  app.add_option("--queries", queries, "ZO directions per step");
  CLI11_PARSE(app, argc, argv);
  try {
    ZOF_CHECK(zof::cuda_device_count() > 0, "zo_bench needs a CUDA device; none is visible");
    zof::ModelConfig cfg = zof::ModelConfig::load(config);
    const int layers = (int)cfg.num_layers;
    zof::ModelConfig one = cfg;
    one.num_layers = 1;
    // One layer built on the host, replicated on the device: the full model never exists on the host.
    const zof::Model layout = zof::Model::random(one, 1);
    auto be = zof::make_cuda_backend(0);
    auto dm = zof::gpu::DeviceModel::replicate(*be, layout, layers);
    int64_t params = 0;
    for (const auto& b : dm.blocks)
      for (const auto& t : b.tensors) params += t.numel;

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
    zof::gpu::DeviceZO zo(dm, *be, rows, opt, 1024);
    auto step = [&](uint32_t s, const std::vector<double>& g_prev) {
      if (s > 0) zo.set_pending(zof::ZOEngine::make_update(opt, s - 1, 1e-6f, g_prev));
      const zof::QueryLosses l = zo.perturbed_losses(s, micro);
      std::vector<double> g(l.sum_plus.size());
      for (size_t j = 0; j < g.size(); ++j) g[j] = (l.sum_plus[j] - l.sum_minus[j]) / l.count / (2.0 * opt.eps);
      return std::make_pair(g, l.sum_plus[0] / l.count);
    };
    std::vector<double> g;
    double loss = 0;
    std::tie(g, loss) = step(0, {});
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 1; s <= steps; ++s) std::tie(g, loss) = step(uint32_t(s), g);
    const double step_s = seconds_since(t0) / steps;

    // A plain forward with loss (no perturbation) of the same batch, for the step's overhead.
    auto& fwd = zo.forward();
    const auto in = fwd.upload(lb.batch, &lb.targets);
    zof::gpu::DeviceArray<float> h(*be, rows * cfg.hidden_size), nll(*be, rows);
    auto forward = [&] {
      fwd.embed(dm.embed(), in, h.get());
      for (int i = 0; i < layers; ++i) fwd.layer(dm.layer(i), h.get(), in);
      fwd.head_nll(dm.head(), h.get(), in, nll.get());
      be->synchronize(nullptr);
    };
    forward();
    const auto t1 = std::chrono::steady_clock::now();
    for (int s = 0; s < steps; ++s) forward();
    const double fwd_s = seconds_since(t1) / steps;

    std::printf("{\"impl\": \"zof\", \"dtype\": \"fp32\", \"params\": %lld, \"batch\": %lld, "
                "\"seq\": %lld, \"queries\": %d, \"step_s\": %.4f, \"tokens_per_s\": %.1f, "
                "\"forward_s\": %.4f, \"loss\": %.4f}\n",
                (long long)params, (long long)batch, (long long)seq, queries, step_s,
                double(rows) / step_s, fwd_s, loss);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zo_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
