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

// A batch with the positions that count: targets (B*T), the token to predict at each position
// (-1: not scored). The loss is the mean NLL over scored positions, or, with choices, MeZO's
// classification objective (--train_as_classification): the batch's sequences are the
// candidates of its examples, and an example's loss is the cross-entropy over its candidates of
// their scores, each the mean log-likelihood of its scored tokens, with the correct one as the
// label; the loss is the mean over examples.
struct LossBatch {
  struct Choice {
    int32_t first = 0, count = 0;  // the example's candidates: sequences [first, first + count)
    int32_t label = 0;             // the correct one, 0 <= label < count
  };
  Batch batch;
  std::vector<int32_t> targets;
  std::vector<Choice> choices;  // empty: language modelling on the scored tokens
  int64_t scored() const;
  // What the loss is a mean over: scored tokens, or examples with choices.
  double units() const { return choices.empty() ? (double)scored() : (double)choices.size(); }
  // Next-token targets over every real token of the batch (language modelling).
  static LossBatch next_token(Batch b);
};

// The batch's summed loss (LossBatch) from the NLL of each of its B*T rows (unscored rows are
// not read): each unit's loss (a token's NLL, or an example's cross-entropy) rounded to the row
// quantum (row_quantized, below) and added.
double loss_sum(const LossBatch& lb, const double* row_nll);

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
