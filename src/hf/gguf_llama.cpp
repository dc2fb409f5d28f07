// llama.cpp's LLaMA conventions in GGUF (gguf_llama.h). Reading follows scripts/gguf_to_hf.py
// key for key, so that a GGUF file and its conversion give one config, one tokenizer and one set
// of weights; writing follows llama.cpp's convert_hf_to_gguf.py (LlamaModel, the "gpt2" vocab).
#include "hf/gguf_llama.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <type_traits>
#include <unordered_map>

#include "hf/config_limits.h"
#include "hf/json_depth.h"
#include "hf/unicode.h"
#include "zof/error.h"
#include "zof/input_file.h"

namespace zof::gguf {

using json = nlohmann::json;

namespace {

namespace fs = std::filesystem;

// GGUF token types (llama_token_type / gguf.TokenType).
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

// GGUF tensor names (llama.cpp's LLM_TENSOR_NAMES for LLM_ARCH_LLAMA) of Hugging Face's.
const std::pair<const char*, const char*> kGlobalTensors[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};
const std::pair<const char*, const char*> kBlockTensors[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
};

// llama.cpp's tokenizer.ggml.pre -> the Hugging Face pre-tokenizer that splits text the same way
// (llama-vocab.cpp's regex_exprs): "smollm" is each digit alone, then GPT-2's regex.
json byte_level_pre() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
          {"use_regex", true}};
}
json pre_tokenizer_of(const std::string& pre) {
  if (pre == "gpt2") return byte_level_pre();
  if (pre == "smollm")
    return {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level_pre()})}};
  return nullptr;
}

// The float32 value v as the shortest decimal that reads back to it (1e-05, not
// 9.999999747378752e-06), as the Hugging Face config had it: gguf_to_hf.py's
// float(str(np.float32(v))).
double shortest_f32(double v) {
  const float x = float(v);
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::strtod(std::string(buf, r.ptr).c_str(), nullptr);
}

// An integer value of any width and sign (File::array checked it is one).
int64_t integer_of(const Value& v) {
  const bool is_signed = v.type == ValueType::I8 || v.type == ValueType::I16 ||
                         v.type == ValueType::I32 || v.type == ValueType::I64;
  return is_signed ? v.i : int64_t(v.u);
}

const char* const kConvert =
    "convert the original Hugging Face model instead, or this file with scripts/gguf_to_hf.py";

}  // namespace

json llama_config(const File& f) {
  const std::string arch = f.str("general.architecture");
  if (arch != "llama")
    f.fail("general.architecture",
           "is '" + shown(arch) + "'; zof reads GGUF files of llama.cpp's llama architecture only (LLaMA "
           "and the models converted as it, e.g. SmolLM2): another architecture names and lays "
           "out its tensors and hyperparameters in GGUF its own way, which zof does not map. "
           "Give zof the model's Hugging Face directory instead");
  // Each size within config.json's bounds (ModelConfig::from_json), refused here by its GGUF key:
  // a "fix config.json" would name a file and field that a GGUF model does not have.
  const auto size = [&](const std::string& key, const char* hf_key, uint64_t v) {
    const uint64_t limit = uint64_t(config_size_limit(hf_key));
    if (v == 0 || v > limit)
      f.fail(key, "is " + std::to_string(v) + (v ? ", more than zof accepts (at most " +
                                                       std::to_string(limit) + ")"
                                                 : ", not a positive size") +
                      "; the file is damaged or not a model zof can run: re-download it, or give "
                      "zof the model's Hugging Face directory");
    return v;
  };
  const auto real_size = [&](const char* key, double v) {
    if (!(v > 0) || !std::isfinite(v))
      f.fail(key, "is " + std::to_string(v) + ", not a positive number; the file is damaged: "
                  "re-download it");
    return v;
  };
  const uint64_t hidden = size("llama.embedding_length", "hidden_size",
                               f.whole("llama.embedding_length"));
  const uint64_t heads = size("llama.attention.head_count", "num_attention_heads",
                              f.whole("llama.attention.head_count"));
  const uint64_t kv_heads = size("llama.attention.head_count_kv", "num_key_value_heads",
                                 f.whole_or("llama.attention.head_count_kv", heads));
  if (!heads || !hidden || hidden % heads || !kv_heads || heads % kv_heads)
    f.fail("llama.attention.head_count",
           std::to_string(heads) + " heads / " + std::to_string(kv_heads) +
               " KV heads do not divide the width " + std::to_string(hidden) +
               "; the file is damaged: re-download it");
  const uint64_t head_dim = size("llama.attention.key_length", "head_dim",
                                 f.whole_or("llama.attention.key_length", hidden / heads));
  if (head_dim != f.whole_or("llama.attention.value_length", head_dim))
    f.fail("llama.attention.value_length", "differs from llama.attention.key_length; zof reads "
                                           "models whose key and value heads are one size");
  if (f.whole_or("llama.rope.dimension_count", head_dim) != head_dim)
    f.fail("llama.rope.dimension_count",
           "is " + std::to_string(f.whole("llama.rope.dimension_count")) + ", not the head size " +
               std::to_string(head_dim) + ": partial rotary is not read from GGUF; " + kConvert);
  if (f.find("llama.rope.scaling.type") && f.str("llama.rope.scaling.type") != "none")
    f.fail("llama.rope.scaling.type", "is '" + shown(f.str("llama.rope.scaling.type")) +
                                          "'; RoPE scaling is not read from GGUF: " + kConvert);
  if (f.whole_or("llama.expert_count", 0) != 0)
    f.fail("llama.expert_count", "is " + std::to_string(f.whole("llama.expert_count")) +
                                     ": zof runs dense models, not mixtures of experts");
  const auto& tokens = f.array("tokenizer.ggml.tokens", ValueType::String);
  const uint64_t vocab =
      size(f.find("llama.vocab_size") ? "llama.vocab_size" : "tokenizer.ggml.tokens", "vocab_size",
           f.whole_or("llama.vocab_size", tokens.size()));
  if (vocab != tokens.size())
    f.fail("llama.vocab_size", "is " + std::to_string(vocab) + ", but tokenizer.ggml.tokens has " +
                                   std::to_string(tokens.size()) + "; the file is damaged");
  const bool tied = f.tensor("output.weight") == nullptr;
  json cfg = {
      {"architectures", json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"vocab_size", vocab},
      {"hidden_size", hidden},
      {"intermediate_size", size("llama.feed_forward_length", "intermediate_size",
                                 f.whole("llama.feed_forward_length"))},
      {"num_hidden_layers", size("llama.block_count", "num_hidden_layers", f.whole("llama.block_count"))},
      {"num_attention_heads", heads},
      {"num_key_value_heads", kv_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", size("llama.context_length", "max_position_embeddings",
                                       f.whole("llama.context_length"))},
      {"rms_norm_eps", shortest_f32(real_size("llama.attention.layer_norm_rms_epsilon",
                                              f.real("llama.attention.layer_norm_rms_epsilon")))},
      {"rope_theta", shortest_f32(real_size("llama.rope.freq_base",
                                            f.real_or("llama.rope.freq_base", 10000.0)))},
      {"rope_scaling", nullptr},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"tie_word_embeddings", tied},
      {"torch_dtype", "float32"},
  };
  for (const auto& [key, gguf_key] : {std::pair{"bos", "bos_token_id"}, std::pair{"eos", "eos_token_id"},
                                      std::pair{"pad", "padding_token_id"}}) {
    const std::string k = std::string("tokenizer.ggml.") + gguf_key;
    if (!f.find(k)) continue;
    const uint64_t id = f.whole(k);
    if (id >= vocab)
      f.fail(k, std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab) +
                    "; the file is damaged");
    cfg[std::string(key) + "_token_id"] = id;
  }
  return cfg;
}

TokenizerFiles llama_tokenizer(const File& f, const json& cfg) {
  const std::string model = f.str("tokenizer.ggml.model");
  if (model != "gpt2")
    f.fail("tokenizer.ggml.model",
           "is '" + shown(model) + "'" + (model == "llama" ? " (SentencePiece)" : "") +
               "; zof builds byte-level BPE tokenizers (\"gpt2\", as GPT-2, LLaMA 3, Qwen and "
               "SmolLM use) from GGUF, no other: give zof the model's Hugging Face directory");
  const std::string pre = f.str_or("tokenizer.ggml.pre", "gpt2");
  const json pre_tok = pre_tokenizer_of(pre);
  if (pre_tok.is_null())
    f.fail("tokenizer.ggml.pre", "is '" + shown(pre) + "'; zof knows the pre-tokenizers gpt2 and smollm "
                                 "(how llama.cpp splits text before BPE): give zof the model's "
                                 "Hugging Face directory");
  const auto& tokens = f.array("tokenizer.ggml.tokens", ValueType::String);
  const auto& merges = f.array("tokenizer.ggml.merges", ValueType::String);
  const std::vector<Value>* types =
      f.find("tokenizer.ggml.token_type") ? &f.array("tokenizer.ggml.token_type", ValueType::I32)
                                          : nullptr;
  if (types && types->size() != tokens.size())
    f.fail("tokenizer.ggml.token_type", "has " + std::to_string(types->size()) +
                                            " entries for " + std::to_string(tokens.size()) +
                                            " tokens; the file is damaged");
  std::unordered_map<std::string, int64_t> ids;
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i].s;
    const std::string field = "tokenizer.ggml.tokens[" + std::to_string(i) + "]";
    if (unicode::valid_utf8_prefix(t) != t.size())
      f.fail(field, "is not valid UTF-8; the file is damaged");
    if (!ids.emplace(t, int64_t(i)).second)
      f.fail(field, "repeats token " + std::to_string(ids[t]) + "; the file is damaged");
    vocab[t] = i;
  }
  json pairs = json::array();
  for (size_t k = 0; k < merges.size(); ++k) {
    const std::string& m = merges[k].s;
    const size_t sp = m.find(' ');
    const bool ok = sp != std::string::npos && m.find(' ', sp + 1) == std::string::npos &&
                    ids.count(m.substr(0, sp)) && ids.count(m.substr(sp + 1)) &&
                    ids.count(m.substr(0, sp) + m.substr(sp + 1));
    if (!ok)
      f.fail("tokenizer.ggml.merges[" + std::to_string(k) + "]",
             "is not two tokens whose join is a token; the file is damaged");
    pairs.push_back(json::array({m.substr(0, sp), m.substr(sp + 1)}));
  }
  json added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t ty = types ? integer_of((*types)[i]) : kNormal;
    if (ty != kControl && ty != kUserDefined) continue;
    const bool special = ty == kControl;
    added.push_back({{"id", i}, {"content", tokens[i].s}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", !special}, {"special", special}});
  }
  TokenizerFiles out;
  out.tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tok},
      {"post_processor",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      // unk_token null: a character whose bytes are not all in the vocabulary is dropped, as
      // Hugging Face's byte-level BPE tokenizers do.
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
        {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", std::move(vocab)}, {"merges", std::move(pairs)}}},
  };
  auto name = [&](const char* key) -> json {
    const std::string k = std::string(key) + "_token_id";
    return cfg.contains(k) ? json(tokens[cfg[k].get<size_t>()].s) : json(nullptr);
  };
  const uint64_t unk = f.whole_or("tokenizer.ggml.unknown_token_id", UINT64_MAX);
  json specials = json::array(), decoder = json::object();
  for (const json& a : added) {
    if (a["special"].get<bool>()) specials.push_back(a["content"]);
    json e = a;
    e.erase("id");
    decoder[std::to_string(a["id"].get<size_t>())] = e;
  }
  out.tokenizer_config = {
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"add_bos_token", f.flag_or("tokenizer.ggml.add_bos_token", false)},
      {"add_eos_token", f.flag_or("tokenizer.ggml.add_eos_token", false)},
      {"bos_token", name("bos")},
      {"eos_token", name("eos")},
      {"pad_token", name("pad")},
      {"unk_token", unk < tokens.size() ? json(tokens[unk].s) : json(nullptr)},
      {"model_max_length", cfg["max_position_embeddings"]},
      {"clean_up_tokenization_spaces", false},
      {"additional_special_tokens", specials},
      {"added_tokens_decoder", decoder},
  };
  if (f.find("tokenizer.chat_template"))
    out.tokenizer_config["chat_template"] = f.str("tokenizer.chat_template");
  out.generation_config = json::object();
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (cfg.contains(k)) out.generation_config[k] = cfg[k];
  return out;
}

std::string llama_tensor_name(const std::string& hf) {
  for (const auto& [h, g] : kGlobalTensors)
    if (hf == h) return g;
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) != 0) return "";
  size_t at = prefix.size();
  while (at < hf.size() && std::isdigit((unsigned char)hf[at])) ++at;
  if (at == prefix.size() || at >= hf.size() || hf[at] != '.') return "";
  const std::string layer = hf.substr(prefix.size(), at - prefix.size());
  const std::string suffix = hf.substr(at + 1);
  for (const auto& [h, g] : kBlockTensors)
    if (suffix == h) return "blk." + layer + "." + g;
  return "";
}

int64_t llama_permuted_heads(const std::string& hf, const ModelConfig& c) {
  const auto ends = [&](const char* s) {
    const std::string x = s;
    return hf.size() > x.size() && hf.compare(hf.size() - x.size(), x.size(), x) == 0;
  };
  if (ends(".self_attn.q_proj.weight")) return c.num_heads;
  if (ends(".self_attn.k_proj.weight")) return c.num_kv_heads;
  return 0;
}

int64_t gguf_row_of(int64_t hf_row, int64_t rows, int64_t heads) {
  const int64_t d = rows / heads, half = d / 2;
  const int64_t h = hf_row / d, w = hf_row % d;
  return h * d + 2 * (w % half) + w / half;
}

int64_t hf_row_of(int64_t gguf_row, int64_t rows, int64_t heads) {
  const int64_t d = rows / heads, half = d / 2;
  const int64_t h = gguf_row / d, w = gguf_row % d;
  return h * d + (w % 2) * half + w / 2;
}

void check_llama_writable(const ModelConfig& c, const std::string& flag) {
  const std::string fix = ": save it with --save-format safetensors and convert that with "
                          "llama.cpp's convert_hf_to_gguf.py";
  if (c.arch != Arch::Llama || c.model_type != "llama")
    throw Error(flag + " writes llama.cpp's llama architecture; this model is " + c.model_type +
                ", which llama.cpp names and lays out its own way" + fix);
  const char* why = c.qkv_bias || c.o_bias    ? "attention_bias (biases on q, k, v and o)"
                    : c.mlp_bias              ? "mlp_bias"
                    : c.act != Activation::SiLU ? "hidden_act other than silu"
                    : c.rotary_dim != c.head_dim ? "partial rotary embeddings"
                    : c.rope_inv_freq != rope_default_inv_freq(c.rope_theta, c.rotary_dim)
                        ? "rope_scaling"
                    : c.sliding_window || !c.layer_sliding.empty() ? "a sliding window"
                    : c.qk_norm || c.fused_proj || c.sandwich_norm || c.norm_offset != 0 ||
                            c.embed_scale != 0 || c.attn_scale != 0 || c.attn_softcap != 0 ||
                            c.final_softcap != 0
                        ? "fields plain LLaMA lacks"
                        : nullptr;
  if (why)
    throw Error(flag + " writes a plain LLaMA; this model's config has " + why +
                ", which zof does not write into GGUF" + fix);
}

uint32_t file_type_of(TensorType matrices) {
  switch (matrices) {
    case TensorType::F16: return 1;   // LLAMA_FTYPE_MOSTLY_F16
    case TensorType::BF16: return 32;  // LLAMA_FTYPE_MOSTLY_BF16
    default: return 0;                 // LLAMA_FTYPE_ALL_F32
  }
}

Metadata metadata_from_gguf(const File& src, uint32_t file_type) {
  Metadata out;
  bool typed = false;
  for (const auto& [key, v] : src.metadata()) {
    if (key.rfind("quantize.", 0) == 0) continue;
    if (key == "general.file_type") {
      out.emplace_back(key, Value::of_u32(file_type));
      typed = true;
      continue;
    }
    out.emplace_back(key, v);
  }
  if (!typed) out.emplace_back("general.file_type", Value::of_u32(file_type));
  return out;
}

namespace {

json read_tokenizer_json(const fs::path& p) {
  const std::string name = p.filename().string();
  const std::string text = read_input_file(
      p.string(), p.string(),
      name + " must be a regular file of at most " + size_words(kMaxModelJsonBytes) +
          ": replace it with the model's own " + name + " (re-download it)",
      kMaxModelJsonBytes);
  check_json_depth(text, p.string());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(p.string() + ": malformed JSON (" + e.what() + "); re-download it");
  }
}

// Field `key` of JSON object o, at `where` ("pre_tokenizer.") in file `file`: def when absent or
// null, else of def's type; another type (tokenizer.json is the user's file) is a zof::Error that
// names the file and the field, never nlohmann's bare type_error.
template <class T>
T field_or(const json& o, const char* key, T def, const std::string& file, const std::string& where) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return def;
  if constexpr (std::is_same_v<T, bool>) {
    if (it->is_boolean()) return it->get<bool>();
  } else {
    if (it->is_string()) return it->get<std::string>();
  }
  throw Error(file + ": " + where + key + " is " + shown(it->dump()) + ", not a " +
              (std::is_same_v<T, bool> ? "boolean" : "string") +
              "; the file is damaged: replace it with the model's own tokenizer.json (re-download it)");
}

// tokenizer.ggml.pre for a Hugging Face pre_tokenizer; empty: none llama.cpp names.
std::string pre_name(const json& pre, const std::string& file) {
  const auto byte_level = [&](const json& p, const std::string& where) {
    return p.is_object() && field_or<std::string>(p, "type", "", file, where) == "ByteLevel" &&
           field_or(p, "use_regex", true, file, where) &&
           !field_or(p, "add_prefix_space", false, file, where);
  };
  if (byte_level(pre, "pre_tokenizer.")) return "gpt2";
  if (pre.is_object() && field_or<std::string>(pre, "type", "", file, "pre_tokenizer.") == "Sequence" &&
      pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
      pre["pretokenizers"].size() == 2) {
    const json& d = pre["pretokenizers"][0];
    const std::string w = "pre_tokenizer.pretokenizers[0].";
    if (d.is_object() && field_or<std::string>(d, "type", "", file, w) == "Digits" &&
        field_or(d, "individual_digits", false, file, w) &&
        byte_level(pre["pretokenizers"][1], "pre_tokenizer.pretokenizers[1]."))
      return "smollm";
  }
  return "";
}

}  // namespace

Metadata metadata_from_hf(const ModelConfig& c, const std::string& dir, uint32_t file_type,
                          const std::string& flag) {
  check_llama_writable(c, flag);
  const fs::path tp = fs::path(dir) / "tokenizer.json";
  const std::string tf = tp.string();
  const std::string fix = "; " + flag + " writes byte-level BPE tokenizers (GPT-2's and SmolLM's "
                          "kind) only: save with --save-format safetensors and convert that with "
                          "llama.cpp's convert_hf_to_gguf.py";
  std::error_code ec;
  ZOF_CHECK(fs::exists(tp, ec) || ec, tf + ": not found; " + flag + " needs the model's "
                                          "tokenizer.json to write the vocabulary llama.cpp reads");
  const json j = read_tokenizer_json(tp);
  auto refuse = [&](const std::string& field, const std::string& what) {
    throw Error(tf + ": " + field + " " + what + fix);
  };
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    refuse("model", "is missing");
  const json& m = j["model"];
  if (field_or<std::string>(m, "type", "BPE", tf, "model.") != "BPE")
    refuse("model.type", "is " + shown(m["type"].dump()));
  if (m.contains("byte_fallback") && m["byte_fallback"] == true)
    refuse("model.byte_fallback", "is true (a SentencePiece-style BPE)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && m[k] != "") refuse(std::string("model.") + k, "is set");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) refuse("normalizer", "is set");
  const std::string pre = pre_name(j.value("pre_tokenizer", json()), tf);
  if (pre.empty()) refuse("pre_tokenizer", "is not GPT-2's byte-level split (nor SmolLM's digits then it)");
  const json dec = j.value("decoder", json());
  if (!dec.is_object() || field_or<std::string>(dec, "type", "", tf, "decoder.") != "ByteLevel")
    refuse("decoder", "is not ByteLevel");
  const json post = j.value("post_processor", json());
  if (!post.is_null() &&
      (!post.is_object() || field_or<std::string>(post, "type", "", tf, "post_processor.") != "ByteLevel"))
    refuse("post_processor",
           "adds tokens (" + shown(field_or<std::string>(post, "type", "?", tf, "post_processor.")) + ")");
  if (!m.contains("vocab") || !m["vocab"].is_object()) refuse("model.vocab", "is missing");
  if (!m.contains("merges") || !m["merges"].is_array()) refuse("model.merges", "is missing");

  const int64_t V = c.vocab_size;
  std::vector<std::string> tokens(static_cast<size_t>(V));
  std::vector<int32_t> types(static_cast<size_t>(V), 0);
  std::unordered_map<std::string, int64_t> ids;
  auto place = [&](const std::string& t, const json& id, int32_t type, const std::string& field) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= V)
      throw Error(tf + ": " + field + " has id " + shown(id.dump()) + ", outside the model's vocabulary "
                  "of " + std::to_string(V) + " (config.json vocab_size); " + flag +
                  " writes one token per row of the embedding");
    const int64_t i = id.get<int64_t>();
    tokens[size_t(i)] = t;
    types[size_t(i)] = type;
    ids[t] = i;
  };
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it)
    place(it.key(), it.value(), kNormal, "model.vocab " + shown(json(it.key()).dump()));
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id"))
        refuse("added_tokens", "holds an entry without content and id");
      place(a["content"].get<std::string>(), a["id"],
            field_or(a, "special", false, tf, "added_tokens[].") ? kControl : kUserDefined,
            "added token " + shown(a["content"].dump()));
    }
  for (int64_t i = 0; i < V; ++i)
    if (!types[size_t(i)]) {  // a row no token names: as convert_hf_to_gguf.py pads
      tokens[size_t(i)] = "[PAD" + std::to_string(i) + "]";
      types[size_t(i)] = kUnused;
    }
  std::vector<Value> merges;
  merges.reserve(m["merges"].size());
  for (size_t k = 0; k < m["merges"].size(); ++k) {
    const json& x = m["merges"][k];
    std::string a, b;
    if (x.is_string()) {
      const std::string s = x.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp != std::string::npos) a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (x.is_array() && x.size() == 2 && x[0].is_string() && x[1].is_string()) {
      a = x[0].get<std::string>(), b = x[1].get<std::string>();
    }
    if (a.empty() || b.empty() || a.find(' ') != std::string::npos || b.find(' ') != std::string::npos)
      refuse("model.merges[" + std::to_string(k) + "]", "is not a pair of tokens without spaces");
    merges.push_back(Value::of_string(a + " " + b));
  }

  // tokenizer_config.json: the special tokens by name, BOS/EOS addition, the chat template.
  json tc = json::object();
  const fs::path tcp = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(tcp, ec)) tc = read_tokenizer_json(tcp);
  if (!tc.is_object()) tc = json::object();
  auto id_of = [&](int32_t from_config, const char* key) -> int64_t {
    if (from_config >= 0 && from_config < V) return from_config;
    if (!tc.contains(key)) return -1;
    const json& v = tc[key];
    const json name = v.is_object() ? v.value("content", json()) : v;
    if (!name.is_string()) return -1;
    const auto it = ids.find(name.get<std::string>());
    return it == ids.end() ? -1 : it->second;
  };

  Metadata md;
  auto u32 = [&](const char* k, uint64_t v) { md.emplace_back(k, Value::of_u32(uint32_t(v))); };
  md.emplace_back("general.architecture", Value::of_string("llama"));
  md.emplace_back("general.type", Value::of_string("model"));
  // general.name from the model's own config ("_name_or_path": "HuggingFaceTB/SmolLM2-135M":
  // SmolLM2-135M), never from where the directory lies: a replay from a copy of the base
  // elsewhere writes the run's very bytes. None when the config names none (it is optional).
  if (const auto it = c.raw.find("_name_or_path"); it != c.raw.end() && it->is_string()) {
    std::string named = it->get<std::string>();
    while (!named.empty() && named.back() == '/') named.pop_back();
    named = named.substr(named.find_last_of('/') == std::string::npos ? 0 : named.find_last_of('/') + 1);
    if (!named.empty()) md.emplace_back("general.name", Value::of_string(named));
  }
  u32("general.file_type", file_type);
  u32("general.quantization_version", 2);  // GGML_QNT_VERSION, as llama.cpp's converter writes
  u32("llama.vocab_size", uint64_t(V));
  u32("llama.context_length", uint64_t(c.max_position));
  u32("llama.embedding_length", uint64_t(c.hidden_size));
  u32("llama.feed_forward_length", uint64_t(c.intermediate_size));
  u32("llama.block_count", uint64_t(c.num_layers));
  u32("llama.attention.head_count", uint64_t(c.num_heads));
  u32("llama.attention.head_count_kv", uint64_t(c.num_kv_heads));
  u32("llama.attention.key_length", uint64_t(c.head_dim));
  u32("llama.attention.value_length", uint64_t(c.head_dim));
  u32("llama.rope.dimension_count", uint64_t(c.rotary_dim));
  md.emplace_back("llama.rope.freq_base", Value::of_f32(c.rope_theta));
  md.emplace_back("llama.attention.layer_norm_rms_epsilon", Value::of_f32(c.norm_eps));
  md.emplace_back("tokenizer.ggml.model", Value::of_string("gpt2"));
  md.emplace_back("tokenizer.ggml.pre", Value::of_string(pre));
  std::vector<Value> tv, ty;
  tv.reserve(tokens.size());
  ty.reserve(types.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tv.push_back(Value::of_string(tokens[i]));
    ty.push_back(Value::of_i32(types[i]));
  }
  md.emplace_back("tokenizer.ggml.tokens", Value::of_array(ValueType::String, std::move(tv)));
  md.emplace_back("tokenizer.ggml.token_type", Value::of_array(ValueType::I32, std::move(ty)));
  md.emplace_back("tokenizer.ggml.merges", Value::of_array(ValueType::String, std::move(merges)));
  const std::pair<const char*, int64_t> special[] = {
      {"tokenizer.ggml.bos_token_id", id_of(c.bos_token_id, "bos_token")},
      {"tokenizer.ggml.eos_token_id", id_of(c.eos_token_id, "eos_token")},
      {"tokenizer.ggml.unknown_token_id", id_of(-1, "unk_token")},
      {"tokenizer.ggml.padding_token_id", id_of(c.pad_token_id, "pad_token")},
  };
  for (const auto& [k, id] : special)
    if (id >= 0) u32(k, uint64_t(id));
  for (const char* k : {"add_bos_token", "add_eos_token"})
    md.emplace_back(std::string("tokenizer.ggml.") + k,
                    Value::of_bool(tc.contains(k) && tc[k].is_boolean() && tc[k].get<bool>()));
  if (tc.contains("chat_template") && tc["chat_template"].is_string())
    md.emplace_back("tokenizer.chat_template",
                    Value::of_string(tc["chat_template"].get<std::string>()));
  return md;
}

}  // namespace zof::gguf
