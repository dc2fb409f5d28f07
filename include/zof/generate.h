// Text generation with a KV cache: greedy (temperature 0) or temperature / top-p sampling.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "zof/forward.h"

namespace zof {

struct SampleOptions {
  int64_t max_new_tokens = 128;
  // The default, not asked for: fewer when the context holds fewer (else more is refused).
  bool max_new_is_default = false;
  float temperature = 0.f;  // 0: greedy
  float top_p = 1.f;        // nucleus sampling mass, (0, 1]
  uint64_t seed = 0;
  int32_t eos_id = -1;      // stop after emitting it; -1: never
};

// Picks the next token from logits (V) as the options say; rng_state advances.
int32_t sample_token(const float* logits, int64_t V, const SampleOptions& opt,
                     uint64_t& rng_state);

// Generates after prompt (non-empty ids). Calls on_token for each new token as it is chosen.
// Returns the new tokens (EOS included when emitted). Stops at the model's context length.
std::vector<int32_t> generate(Forward& fwd, const std::vector<int32_t>& prompt,
                              const SampleOptions& opt,
                              const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace zof
