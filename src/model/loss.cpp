// A batch's loss (loss.h): the positions scored, the summed loss from per-row NLLs, and the
// checks a walk makes of its micro-batches.
#include "zof/loss.h"

#include <algorithm>
#include <cmath>

#include "zof/error.h"

namespace zof {

int64_t LossBatch::scored() const {
  int64_t n = 0;
  for (auto t : targets) n += t >= 0;
  return n;
}

double loss_sum(const LossBatch& lb, const double* row_nll) {
  const int64_t T = lb.batch.T;
  double sum = 0;
  if (lb.choices.empty()) {
    for (size_t i = 0; i < lb.targets.size(); ++i)
      if (lb.targets[i] >= 0) sum += row_quantized(row_nll[i]);
    return sum;
  }
  std::vector<double> score;
  for (const LossBatch::Choice& c : lb.choices) {
    score.assign(c.count, 0.0);
    for (int32_t k = 0; k < c.count; ++k) {
      const int64_t b = c.first + k;
      double s = 0;
      int64_t n = 0;
      for (int64_t t = 0; t < T; ++t)
        if (lb.targets[b * T + t] >= 0) s += row_nll[b * T + t], ++n;
      score[k] = -s / (double)std::max<int64_t>(n, 1);  // mean log-likelihood
    }
    const double top = *std::max_element(score.begin(), score.end());
    double z = 0;
    for (double x : score) z += std::exp(x - top);
    sum += row_quantized(top + std::log(z) - score[c.label]);
  }
  return sum;
}

LossBatch LossBatch::next_token(Batch b) {
  LossBatch lb;
  lb.targets.assign(b.B * b.T, -1);
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t t = 0; t + 1 < b.lengths[i]; ++t) lb.targets[i * b.T + t] = b.ids[i * b.T + t + 1];
  lb.batch = std::move(b);
  return lb;
}

void check_loss_batches(const std::vector<LossBatch>& micro, const ModelConfig& cfg,
                        int64_t max_rows, const char* who) {
  const int64_t V = cfg.vocab_size;
  for (const LossBatch& lb : micro) {
    const int64_t rows = lb.batch.B * lb.batch.T;
    ZOF_CHECK(rows <= max_rows, "batch of " + std::to_string(rows) + " tokens exceeds " + who +
                                    "'s capacity of " + std::to_string(max_rows));
    ZOF_ASSERT((int64_t)lb.targets.size() == rows && (int64_t)lb.batch.ids.size() == rows);
    int64_t next = 0;  // choices cover consecutive sequences, each with a scored token
    for (const LossBatch::Choice& c : lb.choices) {
      ZOF_ASSERT(c.first == next && c.count >= 1 && c.first + c.count <= lb.batch.B &&
                 c.label >= 0 && c.label < c.count);
      next = c.first + c.count;
      for (int32_t k = 0; k < c.count; ++k) {
        const int32_t* t = lb.targets.data() + (int64_t)(c.first + k) * lb.batch.T;
        ZOF_ASSERT(std::any_of(t, t + lb.batch.T, [](int32_t x) { return x >= 0; }));
      }
    }
    ZOF_ASSERT(lb.choices.empty() || next == lb.batch.B);
    ZOF_CHECK(lb.batch.T <= cfg.max_position,
              "a sequence of " + std::to_string(lb.batch.T) + " tokens is beyond the model's " +
                  "context of " + std::to_string(cfg.max_position) +
                  " tokens (max_position_embeddings)");
    for (int64_t i = 0; i < rows; ++i) {
      ZOF_CHECK(lb.batch.ids[i] >= 0 && lb.batch.ids[i] < V,
                "token id " + std::to_string(lb.batch.ids[i]) +
                    " is outside the model's vocabulary of " + std::to_string(V));
      ZOF_CHECK(lb.targets[i] < V, "target token id " + std::to_string(lb.targets[i]) +
                                       " is outside the vocabulary of " + std::to_string(V));
    }
  }
}

}  // namespace zof
