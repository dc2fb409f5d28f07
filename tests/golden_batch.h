// The golden tiny models of tests/golden as ZO test inputs: each model's golden batch with
// next-token targets, and the mean loss of a batch through a backend.
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common.h"
#include "zof/backend.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/zo.h"

namespace zof::test {

inline std::string golden_dir(const std::string& name) {
  return zof::test::source_dir() + "/tests/golden/" + name;
}

// The golden batch of a model (right-padded rows), with next-token targets.
inline zof::LossBatch golden_batch(const std::string& name) {
  std::ifstream f(golden_dir(name) + "/golden.json");
  nlohmann::json g = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> seqs;
  for (size_t b = 0; b < g["input_ids"].size(); ++b) {
    std::vector<int32_t> s;
    for (int t = 0; t < g["lengths"][b].get<int>(); ++t) s.push_back(g["input_ids"][b][t]);
    seqs.push_back(s);
  }
  return zof::LossBatch::next_token(zof::Batch::from_sequences(seqs));
}

inline double mean_loss(zof::Model& m, zof::Backend& be, const zof::LossBatch& lb) {
  zof::Forward fwd(m, be, lb.batch.B * lb.batch.T);
  std::vector<float> nll(lb.batch.B * lb.batch.T);
  fwd.nll(lb.batch, lb.targets.data(), nll.data());
  double s = 0;
  for (float x : nll) s += x;
  return s / (double)lb.scored();
}

}  // namespace zof::test
