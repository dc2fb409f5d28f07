// A batch's loss as every walk computes it: the batch with the positions that count
// (LossBatch), its summed loss from per-row NLLs, and the rounding that makes those sums exact
// in any order. Part of the model layer: the data layer builds LossBatches, the ZO walks and the
// evaluation consume them.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "zof/config.h"
#include "zof/forward.h"

namespace zof {

// A batch with what it scores: (row, target) pairs, row = batch.row(b, t) predicting token
// target. The
// loss is the mean NLL over the pairs, or, with choices, MeZO's classification objective
// (--train_as_classification): the batch scores the candidates of its examples, and an example's
// loss is the cross-entropy over its candidates of their scores, each the mean log-likelihood of
// its pairs, with the correct one as the label; the loss is the mean over examples. A row may be
// scored against several targets: candidates that differ only in one last token run as one
// sequence of the shared tokens, each candidate's token scored at its last position.
struct LossBatch {
  struct Choice {
    int32_t first = 0, count = 0;  // the example's candidates: [first, first + count)
    int32_t label = 0;             // the correct one, 0 <= label < count
  };
  Batch batch;
  std::vector<int32_t> score_rows, score_targets;  // the pairs, in order
  // With choices: candidate c's pairs are [c ? cand_end[c - 1] : 0, cand_end[c]).
  std::vector<int32_t> cand_end;
  std::vector<Choice> choices;  // empty: language modelling on the pairs
  int64_t scored() const { return (int64_t)score_rows.size(); }
  // What the loss is a mean over: pairs, or examples with choices.
  double units() const { return choices.empty() ? (double)scored() : (double)choices.size(); }
  // Next-token targets over every real token of the batch (language modelling).
  static LossBatch next_token(Batch b);
  // Language modelling on per-position targets (rows(); -1: not scored).
  static LossBatch from_positions(Batch b, const std::vector<int32_t>& targets);
  // The pairs as per-position targets (rows(); -1: not scored), for a batch that scores no row
  // twice (zof::Error otherwise).
  std::vector<int32_t> position_targets() const;
};

// The batch's summed loss (LossBatch) from the NLL of each of its pairs (pair_nll, in the order
// of score_rows): each unit's loss (a pair's NLL, or an example's cross-entropy) rounded to the
// row quantum (row_quantized, below) and added.
double loss_sum(const LossBatch& lb, const double* pair_nll);

// Checks a batch's layout: B lengths from 1 to T, ids for every row, a packed batch's starts
// consistent with its lengths. zof::Error naming what is wrong.
void check_batch_layout(const Batch& b);

// Checks micro-batches against a walk's capacity (max_rows tokens) and the model: context,
// vocabulary, targets. zof::Error naming what is wrong; `who` names the walk ("the engine").
void check_loss_batches(const std::vector<LossBatch>& micro, const ModelConfig& cfg,
                        int64_t max_rows, const char* who);

// Every per-row loss (and JVP directional derivative) enters a sum rounded to a multiple of
// 2^-24 (about 6e-8; finer than a float's ulp for any loss above 0.5). Sums of such values are
// exact in double while their magnitude stays below 2^29 (5.4e8: a million tokens at a loss of
// 500), so a step's totals are the same bits whatever the order of rows, micro-batches and
// data-parallel ranks: bit identity across layouts by construction, for any mix of confident
// (near-zero loss) and uncertain tokens.
constexpr double kRowQuantum = 0x1p-24;
inline double row_quantized(double v) { return std::nearbyint(v * 0x1p24) * kRowQuantum; }

}  // namespace zof
