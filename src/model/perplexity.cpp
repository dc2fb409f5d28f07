// Perplexity over non-overlapping BOS-prefixed windows, batched.
#include "zof/perplexity.h"

#include <algorithm>
#include <cmath>

#include "zof/error.h"

namespace zof {

PerplexityResult perplexity(Forward& fwd, const std::vector<int32_t>& tokens, int32_t bos,
                            int64_t seq_len, int64_t batch, int64_t max_windows) {
  return perplexity(fwd, std::vector<std::vector<int32_t>>{tokens}, bos, seq_len, batch,
                    max_windows);
}

PerplexityResult perplexity(Forward& fwd, const std::vector<std::vector<int32_t>>& documents,
                            int32_t bos, int64_t seq_len, int64_t batch, int64_t max_windows) {
  return perplexity([&fwd](const Batch& b, std::vector<float>& nll) { fwd.next_token_nll(b, nll); },
                    documents, bos, seq_len, batch, max_windows);
}

PerplexityResult perplexity(const NextTokenNll& next_token_nll,
                            const std::vector<std::vector<int32_t>>& documents, int32_t bos,
                            int64_t seq_len, int64_t batch, int64_t max_windows) {
  const int64_t prefix = bos >= 0 ? 1 : 0;
  ZOF_CHECK(seq_len >= 2, "--seq-len must be at least 2");
  const int64_t body = seq_len - prefix;
  std::vector<std::vector<int32_t>> windows;
  for (const auto& tokens : documents)
  for (size_t i = 0; i < tokens.size(); i += body) {
    std::vector<int32_t> w;
    if (bos >= 0) w.push_back(bos);
    const size_t end = std::min(tokens.size(), i + body);
    w.insert(w.end(), tokens.begin() + i, tokens.begin() + end);
    if ((int64_t)w.size() < 2) continue;  // nothing to score
    windows.push_back(std::move(w));
    if (max_windows > 0 && (int64_t)windows.size() >= max_windows) break;
  }
  if (max_windows > 0 && (int64_t)windows.size() > max_windows) windows.resize(max_windows);
  ZOF_CHECK(!windows.empty(), "the text has too few tokens to evaluate (need at least 2)");
  PerplexityResult r;
  double sum = 0;
  std::vector<float> nll;
  for (size_t w0 = 0; w0 < windows.size(); w0 += batch) {
    const size_t w1 = std::min(windows.size(), w0 + batch);
    std::vector<std::vector<int32_t>> part(windows.begin() + w0, windows.begin() + w1);
    const Batch b = Batch::from_sequences(part).pack();  // the short last window unpadded
    next_token_nll(b, nll);
    for (int64_t i = 0; i < b.B; ++i)
      for (int64_t t = 0; t + 1 < b.lengths[i]; ++t) {
        sum += nll[b.row(i, t)];
        // With no BOS the first token is never predicted; with BOS every text token is.
        ++r.tokens;
      }
  }
  r.windows = (int64_t)windows.size();
  r.nll = sum / r.tokens;
  r.ppl = std::exp(r.nll);
  return r;
}

}  // namespace zof
