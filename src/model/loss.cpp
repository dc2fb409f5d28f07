// A batch's loss (loss.h): the positions scored, the summed loss from per-row NLLs, and the
// checks a walk makes of its micro-batches.
#include "zof/loss.h"

#include <algorithm>
#include <cmath>

#include "zof/error.h"

namespace zof {

double loss_sum(const LossBatch& lb, const double* pair_nll) {
  double sum = 0;
  if (lb.choices.empty()) {
    for (int64_t i = 0; i < lb.scored(); ++i) sum += row_quantized(pair_nll[i]);
    return sum;
  }
  std::vector<double> score;
  for (const LossBatch::Choice& c : lb.choices) {
    score.assign(c.count, 0.0);
    for (int32_t k = 0; k < c.count; ++k) {
      const int32_t cand = c.first + k;
      const int32_t p0 = cand ? lb.cand_end[cand - 1] : 0, p1 = lb.cand_end[cand];
      double s = 0;
      for (int32_t p = p0; p < p1; ++p) s += pair_nll[p];
      score[k] = -s / (double)std::max(p1 - p0, 1);  // mean log-likelihood
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
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t t = 0; t + 1 < b.lengths[i]; ++t) {
      lb.score_rows.push_back((int32_t)b.row(i, t));
      lb.score_targets.push_back(b.ids[b.row(i, t + 1)]);
    }
  lb.batch = std::move(b);
  return lb;
}

LossBatch LossBatch::from_positions(Batch b, const std::vector<int32_t>& targets) {
  ZOF_ASSERT((int64_t)targets.size() == b.rows());
  LossBatch lb;
  for (size_t r = 0; r < targets.size(); ++r)
    if (targets[r] >= 0) {
      lb.score_rows.push_back((int32_t)r);
      lb.score_targets.push_back(targets[r]);
    }
  lb.batch = std::move(b);
  return lb;
}

std::vector<int32_t> LossBatch::position_targets() const {
  std::vector<int32_t> t(batch.rows(), -1);
  for (int64_t i = 0; i < scored(); ++i) {
    ZOF_CHECK(t[score_rows[i]] < 0, "position " + std::to_string(score_rows[i]) +
                                        " is scored twice; per-position targets cannot say so");
    t[score_rows[i]] = score_targets[i];
  }
  return t;
}

void check_batch_layout(const Batch& b) {
  ZOF_CHECK(b.B >= 0 && b.T >= 0 && (int64_t)b.lengths.size() == b.B,
            "batch of " + std::to_string(b.B) + " sequences has " +
                std::to_string(b.lengths.size()) + " lengths");
  for (int64_t i = 0; i < b.B; ++i)
    ZOF_CHECK(b.lengths[size_t(i)] >= 1 && b.lengths[size_t(i)] <= b.T,
              "sequence " + std::to_string(i) + " of the batch has length " +
                  std::to_string(b.lengths[size_t(i)]) + "; lengths run from 1 to T = " +
                  std::to_string(b.T));
  if (b.packed()) {
    ZOF_CHECK((int64_t)b.starts.size() == b.B + 1 && b.starts[0] == 0,
              "a packed batch of " + std::to_string(b.B) + " sequences needs " +
                  std::to_string(b.B + 1) + " starts from 0");
    for (int64_t i = 0; i < b.B; ++i)
      ZOF_CHECK(b.starts[size_t(i + 1)] - b.starts[size_t(i)] == b.lengths[size_t(i)],
                "packed sequence " + std::to_string(i) + " starts at row " +
                    std::to_string(b.starts[size_t(i)]) + " and its successor at " +
                    std::to_string(b.starts[size_t(i + 1)]) + ", not its length " +
                    std::to_string(b.lengths[size_t(i)]) + " later");
  }
  ZOF_CHECK((int64_t)b.ids.size() == b.rows(),
            "batch holds " + std::to_string(b.ids.size()) + " token ids for " +
                std::to_string(b.rows()) + " rows");
}

void check_loss_batches(const std::vector<LossBatch>& micro, const ModelConfig& cfg,
                        int64_t max_rows, const char* who) {
  const int64_t V = cfg.vocab_size;
  for (const LossBatch& lb : micro) {
    check_batch_layout(lb.batch);
    const int64_t rows = lb.batch.rows();
    ZOF_CHECK(rows <= max_rows, "batch of " + std::to_string(rows) + " tokens exceeds " + who +
                                    "'s capacity of " + std::to_string(max_rows));
    ZOF_ASSERT((int64_t)lb.batch.ids.size() == rows);
    const int64_t n = lb.scored();
    ZOF_ASSERT((int64_t)lb.score_targets.size() == n);
    ZOF_CHECK(n <= max_rows, "batch scoring " + std::to_string(n) + " (position, target) pairs "
                             "exceeds " + who + "'s capacity of " + std::to_string(max_rows));
    for (int64_t i = 0; i < n; ++i) {  // a pair scores a real token's position
      const int64_t r = lb.score_rows[i];
      ZOF_CHECK(r >= 0 && r < rows &&
                    (lb.batch.packed() || r % lb.batch.T < lb.batch.lengths[r / lb.batch.T]),
                "pair " + std::to_string(i) + " scores position " + std::to_string(r) +
                    ", which is not a token of the batch");
    }
    int32_t next = 0;  // choices cover consecutive candidates, each with a pair
    for (const LossBatch::Choice& c : lb.choices) {
      ZOF_ASSERT(c.first == next && c.count >= 1 && c.first + c.count <= (int32_t)lb.cand_end.size() &&
                 c.label >= 0 && c.label < c.count);
      next = c.first + c.count;
    }
    ZOF_ASSERT(lb.choices.empty() ||
               (next == (int32_t)lb.cand_end.size() && lb.cand_end.back() == n));
    for (size_t c = 0; c < lb.cand_end.size(); ++c)
      ZOF_ASSERT(lb.cand_end[c] > (c ? lb.cand_end[c - 1] : 0));
    ZOF_CHECK(lb.batch.T <= cfg.max_position,
              "a sequence of " + std::to_string(lb.batch.T) + " tokens is beyond the model's " +
                  "context of " + std::to_string(cfg.max_position) +
                  " tokens (max_position_embeddings)");
    for (int64_t i = 0; i < rows; ++i)
      ZOF_CHECK(lb.batch.ids[i] >= 0 && lb.batch.ids[i] < V,
                "token id " + std::to_string(lb.batch.ids[i]) +
                    " is outside the model's vocabulary of " + std::to_string(V));
    for (int32_t t : lb.score_targets)
      ZOF_CHECK(t >= 0 && t < V, "target token id " + std::to_string(t) +
                                     " is outside the vocabulary of " + std::to_string(V));
  }
}

}  // namespace zof
