// The golden tiny models of tests/golden as ZO test inputs: each model's golden batch with
// next-token targets, PyTorch's gradient dotted with z, and the mean loss of a batch through a
// backend.
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common.h"
#include "zof/backend.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "util/philox.h"
#include "hf/safetensors.h"
#include "zof/zo.h"

namespace zof::test {

// Every element of a model's storage as fp32, padding included (a bf16-held master widened):
// for comparing weights whatever the storage holds them in.
inline std::vector<float> storage_values(const zof::Model& m) {
  std::vector<float> v(m.storage_size());
  if (m.storage_dtype() == zof::DType::F32)
    std::copy(m.storage(), m.storage() + m.storage_size(), v.begin());
  else
    for (size_t i = 0; i < v.size(); ++i) v[i] = zof::bf16_to_f32(m.storage_bf16()[i]);
  return v;
}

inline std::string golden_dir(const std::string& name) {
  return zof::test::source_dir() + "/tests/golden/" + name;
}

// Where a golden's model lives: beside golden.json, or among the assets ("model_dir":
// "assets:models/stories260K").
inline std::string golden_model_dir(const std::string& name) {
  std::ifstream f(golden_dir(name) + "/golden.json");
  const nlohmann::json g = nlohmann::json::parse(f);
  const std::string md = g.value("model_dir", "");
  if (md.rfind("assets:", 0) == 0) return zof::test::assets_dir() + "/" + md.substr(7);
  return golden_dir(name);
}

// The golden models of tests/golden (each a directory with golden.json), sorted; "missing"
// when there are none, which fails through ZOF_REQUIRE_PATH under CI.
inline std::vector<std::string> golden_models() {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  const fs::path root = fs::path(zof::test::source_dir()) / "tests/golden";
  if (fs::exists(root))
    for (auto& e : fs::directory_iterator(root))
      if (fs::exists(e.path() / "golden.json")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  if (out.empty()) out.push_back("missing");
  return out;
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

// grad . z(key) in float64 from PyTorch's gradient of the mean NLL (Hugging Face layout).
inline double autograd_dot_z(const zof::Model& m, const std::string& name, const zof::ZKey& key) {
  auto grads = zof::safetensors::Archive::open_file(golden_dir(name) + "/grad.safetensors");
  double dd = 0;
  const auto& params = m.params();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    const auto& p = params[pi];
    const auto* t = grads.find(p.name);
    EXPECT_TRUE(t) << p.name;
    if (!t) continue;
    std::vector<float> gr(t->numel());
    zof::safetensors::to_f32(*t, gr.data());
    for (int64_t e = 0; e < p.numel; ++e) {
      // zof holds GPT-2 Conv1D weights transposed: element (o, i) is file element (i, o).
      int64_t fe = e;
      if (p.transposed) fe = (e % p.shape[1]) * p.shape[0] + e / p.shape[1];
      dd += (double)gr[fe] * zof::z_element(key, (uint32_t)pi, (uint64_t)e);
    }
  }
  return dd;
}

inline double mean_loss(zof::Model& m, zof::Backend& be, const zof::LossBatch& lb) {
  zof::Forward fwd(m, be, lb.batch.B * lb.batch.T);
  std::vector<float> nll(lb.batch.B * lb.batch.T);
  fwd.nll(lb.batch, lb.position_targets().data(), nll.data());
  double s = 0;
  for (float x : nll) s += x;
  return s / (double)lb.scored();
}

}  // namespace zof::test
