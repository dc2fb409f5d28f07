// Whole-model logits against Hugging Face transformers: the golden files in tests/golden were
// written by tests/reference/make_golden.py (inputs, logits in fp32 and fp64, per-token NLL).
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common.h"
#include "golden_batch.h"
#include "zof/backend.h"
#include "zof/config.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/generate.h"
#include "zof/model.h"
#include "hf/safetensors.h"
#include "zof/zo.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

struct Golden {
  json meta;
  std::string model_dir;
  zof::Batch batch;
  std::vector<float> logits, logits_f64, nll;
};

Golden load_golden(const std::string& name) {
  Golden g;
  const fs::path dir = fs::path(zof::test::source_dir()) / "tests/golden" / name;
  std::ifstream f(dir / "golden.json");
  g.meta = json::parse(f);
  std::string md = g.meta["model_dir"];
  if (md.rfind("assets:", 0) == 0)
    g.model_dir = zof::test::assets_dir() + "/" + md.substr(7);
  else
    g.model_dir = dir.string();
  std::vector<std::vector<int32_t>> seqs;
  auto ids = g.meta["input_ids"];
  auto lengths = g.meta["lengths"];
  for (size_t b = 0; b < ids.size(); ++b) {
    std::vector<int32_t> s;
    for (int t = 0; t < lengths[b].get<int>(); ++t) s.push_back(ids[b][t]);
    seqs.push_back(s);
  }
  g.batch = zof::Batch::from_sequences(seqs);
  auto a = zof::safetensors::Archive::open_file((dir / "golden.safetensors").string());
  auto read = [&](const char* n, std::vector<float>& v) {
    auto* t = a.find(n);
    ZOF_ASSERT(t);
    v.resize(t->numel());
    zof::safetensors::to_f32(*t, v.data());
  };
  read("logits", g.logits);
  read("logits_f64", g.logits_f64);
  read("nll", g.nll);
  return g;
}

class GoldenLogits : public ::testing::TestWithParam<std::string> {};

// fp32 against transformers' fp64 forward: relative to the largest logit magnitude of the row.
TEST_P(GoldenLogits, MatchTransformers) {
  const std::string name = GetParam();
  const fs::path dir = fs::path(zof::test::source_dir()) / "tests/golden" / name;
  ZOF_REQUIRE_PATH(dir / "golden.json");
  Golden g = load_golden(name);
  ZOF_REQUIRE_PATH(g.model_dir);
  zof::Model model = zof::Model::load(g.model_dir);
  const int64_t V = model.config().vocab_size;
  const int64_t T_file = g.meta["input_ids"][0].size();
  for (auto make : {zof::test::reference_backend, +[]() { return zof::test::cpu_backend(0); }}) {
    auto be = make();
    zof::Forward fwd(model, *be, g.batch.B * g.batch.T);
    std::vector<float> logits;
    fwd.logits(g.batch, logits);
    double max_rel = 0, max_rel32 = 0;
    for (int64_t b = 0; b < g.batch.B; ++b)
      for (int64_t t = 0; t < g.batch.lengths[b]; ++t) {
        const float* ours = logits.data() + (b * g.batch.T + t) * V;
        const float* ref = g.logits_f64.data() + (b * T_file + t) * V;
        const float* ref32 = g.logits.data() + (b * T_file + t) * V;
        double scale = 1e-6;
        for (int64_t v = 0; v < V; ++v) scale = std::max(scale, (double)std::fabs(ref[v]));
        for (int64_t v = 0; v < V; ++v) {
          ASSERT_TRUE(std::isfinite(ours[v]));
          max_rel = std::max(max_rel, std::fabs(ours[v] - ref[v]) / scale);
          max_rel32 = std::max(max_rel32, std::fabs(ours[v] - ref32[v]) / scale);
        }
      }
    RecordProperty("max_rel_vs_fp64", std::to_string(max_rel));
    EXPECT_LT(max_rel, 2e-5) << name << " on " << be->name();
    EXPECT_LT(max_rel32, 2e-5) << name << " on " << be->name();

    // Per-token next-token NLL, and its mean, against transformers.
    std::vector<float> nll;
    fwd.next_token_nll(g.batch, nll);
    double sum = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < g.batch.B; ++b)
      for (int64_t t = 0; t + 1 < g.batch.lengths[b]; ++t) {
        const float ref = g.nll[b * (T_file - 1) + t];
        EXPECT_NEAR(nll[b * g.batch.T + t], ref, 1e-4 * std::max(1.f, std::fabs(ref)));
        sum += nll[b * g.batch.T + t];
        ++n;
      }
    EXPECT_NEAR(sum / n, g.meta["nll_mean"].get<double>(), 1e-5);
  }
}

// Running the same forward twice gives bit-identical logits.
TEST_P(GoldenLogits, Deterministic) {
  const std::string name = GetParam();
  const fs::path dir = fs::path(zof::test::source_dir()) / "tests/golden" / name;
  ZOF_REQUIRE_PATH(dir / "golden.json");
  Golden g = load_golden(name);
  ZOF_REQUIRE_PATH(g.model_dir);
  zof::Model model = zof::Model::load(g.model_dir);
  auto be = zof::test::cpu_backend(0);
  zof::Forward fwd(model, *be, g.batch.B * g.batch.T);
  std::vector<float> a, b;
  fwd.logits(g.batch, a);
  fwd.logits(g.batch, b);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

using zof::test::golden_models;

INSTANTIATE_TEST_SUITE_P(Models, GoldenLogits, ::testing::ValuesIn(golden_models()),
                         [](const auto& info) { return info.param; });

// The RoPE table zof computes from config.json (rope scaling included, in either spelling)
// against transformers' fp32 inv_freq buffer, and scaled where the config says so. Within 4 ulp:
// transformers rounds the exponent 2i/D to fp32 before an fp32 pow, zof forms theta^(-2i/D) in
// double and rounds once (the bits zof has always used); measured: llama_linear bit-equal,
// llama3_scaled 1 ulp, qwen3 2 ulp (D = 12: 8/12 and 10/12 are not fp32 numbers).
TEST(GoldenRope, TableMatchesTransformers) {
  for (const char* name : {"llama3_scaled", "llama_linear", "qwen3", "phi3", "gemma2", "gemma3"}) {
    const fs::path dir = fs::path(zof::test::source_dir()) / "tests/golden" / name;
    ZOF_REQUIRE_PATH(dir / "golden.json");
    std::ifstream f(dir / "golden.json");
    const json meta = json::parse(f);
    ASSERT_TRUE(meta.contains("rope_inv_freq")) << name;
    const zof::ModelConfig c = zof::ModelConfig::load((dir / "config.json").string());
    const auto& want = meta["rope_inv_freq"];
    ASSERT_EQ(c.rope_inv_freq.size(), want.size()) << name;
    const std::vector<float> plain = zof::rope_default_inv_freq(c.rope_theta, c.rotary_dim);
    int scaled = 0;
    double max_ulp = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const float w = (float)want[i].get<double>();
      const double ulp = std::fabs(c.rope_inv_freq[i] - w) / (std::nextafter(w, INFINITY) - w);
      max_ulp = std::max(max_ulp, ulp);
      EXPECT_LE(ulp, 4) << name << " inv_freq[" << i << "]";
      scaled += std::fabs(c.rope_inv_freq[i] - plain[i]) > 1e-3f * plain[i];
    }
    std::printf("  %-13s RoPE table vs transformers: max %.0f ulp, %d of %zu scaled\n", name,
                max_ulp, scaled, want.size());
    const std::string n = name;
    if (n != "qwen3" && n != "phi3" && n != "gemma2") {
      EXPECT_GT(scaled, 0) << name << ": the scaling matters";
    }
    // Gemma 3's sliding layers have their own table (rope_local_base_freq, unscaled).
    ASSERT_EQ(meta.contains("rope_inv_freq_local"), !c.rope_local_inv_freq.empty()) << name;
    if (meta.contains("rope_inv_freq_local")) {
      const auto& local = meta["rope_inv_freq_local"];
      ASSERT_EQ(c.rope_local_inv_freq.size(), local.size());
      for (size_t i = 0; i < local.size(); ++i) {
        const float w = (float)local[i].get<double>();
        EXPECT_LE(std::fabs(c.rope_local_inv_freq[i] - w) / (std::nextafter(w, INFINITY) - w), 4)
            << name << " local inv_freq[" << i << "]";
      }
      EXPECT_NE(c.rope_local_inv_freq, c.rope_inv_freq);
    }
  }
}

// A fine-tuned model of each new family (ten ZO-SGD steps on the golden batch), written by
// Model::save, reloads with bit-equal logits, and its config.json keeps the input's RoPE
// spelling (rope_scaling or rope_parameters) and fields. With ZOF_RELOAD_OUT=DIR the outputs stay
// in DIR/<name> with zof's logits of the golden rows (zof_logits.safetensors) for
// `tests/reference/make_golden.py --check-reload DIR/*`, which loads them with transformers.
TEST(GoldenSave, FineTunedOutputReloads) {
  const char* keep = std::getenv("ZOF_RELOAD_OUT");
  const fs::path root = keep ? fs::path(keep)
                             : fs::temp_directory_path() / ("zof_reload_" + std::to_string(::getpid()));
  for (const char* name : {"llama3_scaled", "llama_linear", "qwen3", "phi3", "gemma2", "gemma3",
                           "llama_gqa"}) {
    const fs::path dir = fs::path(zof::test::source_dir()) / "tests/golden" / name;
    ZOF_REQUIRE_PATH(dir / "model.safetensors");
    Golden g = load_golden(name);
    zof::Model m = zof::Model::load(g.model_dir);
    auto be = zof::test::cpu_backend(0);
    const zof::LossBatch lb = zof::LossBatch::next_token(g.batch);
    zof::ZOEngine eng(m, *be, g.batch.B * g.batch.T, zof::ZOStepOptions{1e-3f, 0.f, 1, 7});
    for (uint32_t step = 0; step < 10; ++step)
      eng.schedule_update(step, 1e-2f, eng.projected_gradients(eng.perturbed_losses(step, {lb})));
    eng.flush();
    zof::Model orig = zof::Model::load(g.model_dir);
    ASSERT_NE(0, std::memcmp(m.storage(), orig.storage(), m.storage_size() * sizeof(float)));
    const fs::path out = root / name;
    fs::remove_all(out);
    // Every other model in shards of at most 64 KiB (as save_pretrained writes a model past its
    // max_shard_size): the index maps each tensor to its shard, and it reloads the same.
    const bool sharded = std::string(name) != "llama3_scaled" && std::string(name).size() % 2 == 0;
    m.save(out.string(), zof::DType::F32, nullptr, sharded ? 64 << 10 : zof::Model::kMaxShardBytes);
    EXPECT_EQ(fs::exists(out / "model.safetensors"), !sharded) << name;
    EXPECT_EQ(fs::exists(out / "model.safetensors.index.json"), sharded) << name;
    if (sharded) {
      const json index = json::parse(std::ifstream(out / "model.safetensors.index.json"));
      std::set<std::string> files;
      uint64_t tensors = 0;
      for (const auto& [tensor, file] : index["weight_map"].items()) {
        files.insert(file.get<std::string>());
        EXPECT_TRUE(fs::exists(out / file.get<std::string>())) << name << " " << file;
        ++tensors;
      }
      EXPECT_GT(files.size(), 1u) << name;
      EXPECT_EQ(*files.begin(), "model-00001-of-" + std::string(5 - std::to_string(files.size()).size(), '0') +
                                    std::to_string(files.size()) + ".safetensors");
      uint64_t bytes = 0, largest = 0;
      for (const auto& p : m.params()) largest = std::max<uint64_t>(largest, p.numel * 4);
      for (const std::string& f : files) {
        // At most the shard size, or one larger tensor alone; and the header.
        EXPECT_LE(fs::file_size(out / f), std::max<uint64_t>(64u << 10, largest) + 8192u) << f;
        bytes += fs::file_size(out / f);
      }
      EXPECT_GE(bytes, index["metadata"]["total_size"].get<uint64_t>()) << name;
      EXPECT_GT(tensors, files.size()) << name;
    }
    zof::Model back = zof::Model::load(out.string());
    std::vector<float> want, got;
    zof::Forward(m, *be, g.batch.B * g.batch.T).logits(g.batch, want);
    zof::Forward(back, *be, g.batch.B * g.batch.T).logits(g.batch, got);
    ASSERT_EQ(want.size(), got.size());
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << name;
    // config.json: the input's, but the dtype.
    std::ifstream in_cfg(dir / "config.json"), out_cfg(out / "config.json");
    json a = json::parse(in_cfg), b = json::parse(out_cfg);
    for (const char* k : {"dtype", "torch_dtype"}) a.erase(k), b.erase(k);
    EXPECT_EQ(a, b) << name;
    EXPECT_EQ(back.config().rope_inv_freq, m.config().rope_inv_freq) << name;
    if (keep) {
      const int64_t V = m.config().vocab_size;
      const std::vector<int64_t> shape{g.batch.B, g.batch.T, V};
      zof::safetensors::write((out / "zof_logits.safetensors").string(),
                              {zof::safetensors::TensorOut{"logits", zof::DType::F32, shape, want.data()}},
                              {{"format", "pt"}});
      fs::copy_file(dir / "golden.json", out / "golden.json", fs::copy_options::overwrite_existing);
    }
  }
  if (!keep) fs::remove_all(root);
}

// Greedy decoding with the KV cache reproduces transformers' generate().
TEST(GoldenGenerate, GreedyMatchesTransformers) {
  for (const char* name : {"stories260K", "llama_gqa", "llama3_scaled", "llama_linear", "qwen3",
                           "phi3", "gemma2", "gemma3", "mistral_window", "qwen2_window"}) {
    const fs::path dir = fs::path(zof::test::source_dir()) / "tests/golden" / name;
    ZOF_REQUIRE_PATH(dir / "golden.json");
    Golden g = load_golden(name);
    ZOF_REQUIRE_PATH(g.model_dir);
    std::vector<int32_t> prompt, expect;
    if (g.meta.contains("greedy_from_bos")) {
      prompt = {g.meta["input_ids"][0][0].get<int32_t>()};
      for (auto& x : g.meta["greedy_from_bos"]) expect.push_back(x);
    } else if (g.meta.contains("greedy_prefix")) {
      for (auto& x : g.meta["greedy_prefix"]) prompt.push_back(x);
      for (auto& x : g.meta["greedy_from_prefix"]) expect.push_back(x);
    } else {
      FAIL() << name << " golden has no greedy generation record";
    }
    zof::Model model = zof::Model::load(g.model_dir);
    auto be = zof::test::cpu_backend(0);
    zof::Forward fwd(model, *be, (int64_t)prompt.size());
    zof::SampleOptions opt;
    opt.max_new_tokens = (int64_t)expect.size();
    auto got = zof::generate(fwd, prompt, opt);
    EXPECT_EQ(got, expect) << name;
  }
}

}  // namespace
