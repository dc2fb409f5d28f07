// The rows per-position targets score: the positions with a target (>= 0), in order, and their
// targets, as (row, target) pairs for the heads that take per-position targets (Forward::nll,
// head_nll). A LossBatch holds its pairs already (score_rows, score_targets); every head forms
// logits for the pairs' rows only, gathered from the hidden states.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "zof/error.h"

namespace zof {

// Rows of logits a head forms at once (the M of the LM-head GEMM), for evaluation and the JVP walk.
inline constexpr int64_t kHeadChunk = 256;

struct ScoredRows {
  std::vector<int32_t> rows, targets;
  // targets (n); zof::Error for a target outside a vocabulary of V.
  ScoredRows(const int32_t* t, int64_t n, int64_t V) {
    for (int64_t r = 0; r < n; ++r) {
      if (t[r] < 0) continue;
      ZOF_CHECK(t[r] < V, "target token id " + std::to_string(t[r]) +
                              " is outside the vocabulary of " + std::to_string(V));
      rows.push_back((int32_t)r);
      targets.push_back(t[r]);
    }
  }
  int64_t size() const { return (int64_t)rows.size(); }
};

}  // namespace zof
