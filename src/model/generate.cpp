// Generation: prefill the prompt into the KV cache, then one token per decode step.
#include "zof/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "zof/error.h"

namespace zof {
namespace {
// splitmix64: a small, portable, seedable generator, so that samples do not depend on the
// standard library's distributions.
uint64_t next_u64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double uniform01(uint64_t& s) { return (next_u64(s) >> 11) * (1.0 / 9007199254740992.0); }
}  // namespace

int32_t sample_token(const float* logits, int64_t V, const SampleOptions& opt,
                     uint64_t& rng_state) {
  if (opt.temperature <= 0.f) return (int32_t)(std::max_element(logits, logits + V) - logits);
  const float mx = *std::max_element(logits, logits + V);
  std::vector<double> p(V);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += p[i] = std::exp(double(logits[i] - mx) / opt.temperature);
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = V;
  if (opt.top_p < 1.f) {
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      return p[a] != p[b] ? p[a] > p[b] : a < b;
    });
    double acc = 0;
    for (keep = 0; keep < V;) {
      acc += p[idx[keep]] / sum;
      ++keep;
      if (acc >= opt.top_p) break;
    }
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += p[idx[i]];
  double u = uniform01(rng_state) * total;
  for (int64_t i = 0; i < keep; ++i) {
    u -= p[idx[i]];
    if (u <= 0) return idx[i];
  }
  return idx[keep - 1];
}

std::vector<int32_t> generate(Forward& fwd, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token) {
  ZOF_CHECK(!prompt.empty(), "generation needs at least one prompt token (BOS)");
  const auto& cfg = fwd.model().config();
  ZOF_CHECK((int64_t)prompt.size() < cfg.max_position,
            "prompt of " + std::to_string(prompt.size()) +
                " tokens fills the model's context of " + std::to_string(cfg.max_position));
  const int64_t capacity = std::min<int64_t>(cfg.max_position, prompt.size() + opt.max_new_tokens);
  KVCache cache = fwd.make_cache(1, capacity);
  std::vector<float> logits;
  uint64_t rng = opt.seed;
  std::vector<int32_t> out;
  fwd.decode_step(prompt.data(), 1, (int64_t)prompt.size(), cache, logits);
  while ((int64_t)out.size() < opt.max_new_tokens) {
    const int32_t tok = sample_token(logits.data(), cfg.vocab_size, opt, rng);
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (tok == opt.eos_id || cache.length >= cache.capacity) break;
    fwd.decode_step(&tok, 1, 1, cache, logits);
  }
  return out;
}

}  // namespace zof
