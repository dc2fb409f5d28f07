// Held-out language-modelling metric: mean next-token NLL and perplexity over a token stream
// cut into non-overlapping windows, each starting with BOS.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "zof/forward.h"

namespace zof {

struct PerplexityResult {
  double nll = 0;       // mean next-token negative log-likelihood (nats)
  double ppl = 0;       // exp(nll)
  int64_t tokens = 0;   // tokens scored
  int64_t windows = 0;
};

// Windows of seq_len tokens: BOS (when bos >= 0) then seq_len-1 text tokens; every text token
// is scored. batch: windows per forward. max_windows > 0 limits the windows evaluated.
PerplexityResult perplexity(Forward& fwd, const std::vector<int32_t>& tokens, int32_t bos,
                            int64_t seq_len, int64_t batch, int64_t max_windows = 0);
// The same over several documents: windows never cross a document boundary, so each document
// starts with BOS as the model saw it in training.
PerplexityResult perplexity(Forward& fwd, const std::vector<std::vector<int32_t>>& documents,
                            int32_t bos, int64_t seq_len, int64_t batch, int64_t max_windows = 0);

// The same with the batch's next-token NLL from any walk (a tensor-parallel forward's):
// next_token_nll(batch, nll) fills nll (batch.rows(), a packed batch's) as
// Forward::next_token_nll does.
using NextTokenNll = std::function<void(const Batch&, std::vector<float>&)>;
PerplexityResult perplexity(const NextTokenNll& next_token_nll,
                            const std::vector<std::vector<int32_t>>& documents, int32_t bos,
                            int64_t seq_len, int64_t batch, int64_t max_windows = 0);

}  // namespace zof
