// Tokenizer: a Hugging Face tokenizer.json with a BPE model, run as the tokenizers library runs
// it: split on added tokens, normalize, pre-tokenize, BPE per word, post-process; decode through
// the decoder chain. Only the components real LLM tokenizers use are implemented; any other one is
// a zof::Error naming the file and the field.
//
// Input that is not valid UTF-8 is not rejected: each maximal invalid byte sequence is replaced
// by U+FFFD first (as Python's bytes.decode("utf-8", "replace") would before calling tokenizers).
// tokenizer.json's "truncation" and "padding" are ignored: zof cuts and pads sequences itself.
//
// This file holds the Tokenizer: loading tokenizer.json and the pipeline's glue (encode, decode).
// The stages are in the files tokenizer_parts.h lists, as the tokenizers library lays them out.
#include "zof/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>

#include "hf/gguf.h"
#include "hf/gguf_llama.h"
#include "hf/json_depth.h"
#include "hf/tokenizer_parts.h"
#include "hf/unicode.h"
#include "zof/error.h"
#include "zof/input_file.h"

namespace zof {

using namespace tok;

namespace {

namespace fs = std::filesystem;

json read_json(const fs::path& path) {
  const std::string name = path.filename().string();
  const std::string text = read_input_file(
      path.string(), path.string(),
      name + " must be a regular file of at most " + size_words(kMaxModelJsonBytes) +
          ": replace it with the model's own " + name + " (re-download it)",
      kMaxModelJsonBytes);
  check_json_depth(text, path.string());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path.string() + ": malformed JSON (" + e.what() + "); the file is damaged or not a tokenizer file");
  }
}

}  // namespace

// ---- Tokenizer --------------------------------------------------------------------------------

struct Tokenizer::Impl {
  Bpe model;
  std::vector<AddedToken> added;
  StringMap<int32_t> added_ids;
  AddedTokenMatcher raw_matcher, normalized_matcher;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::vector<std::string> tokens;   // id -> token
  std::vector<uint8_t> id_flags;     // 1: id exists, 2: special added token, 4: in model.vocab
  int32_t bos = -1, eos = -1, pad = -1;
  std::string path;  // tokenizer.json, for messages

  int32_t find_id(std::string_view token) const {
    if (const auto it = added_ids.find(token); it != added_ids.end()) return it->second;
    if (const auto it = model.vocab.find(token); it != model.vocab.end()) return it->second;
    return -1;
  }
  // The parts of Tokenizer::load after the model and the pipeline stages: added tokens (and
  // their matchers), the id -> token tables, and BOS/EOS/PAD from the tokenizer's configs.
  void load_added_tokens(const Source& src, const json& j);
  void build_id_tables(const Source& src);
  // configs: tokenizer_config.json, then special_tokens_map.json, where present.
  void load_special_ids(const std::vector<std::pair<std::string, json>>& configs);
};

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

// The content of "bos_token" etc. in tokenizer_config.json / special_tokens_map.json: a string,
// an AddedToken object {"content": ...}, or null.
std::optional<std::string> special_token_name(const Source& src, const json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  src.fail(key, "expected a token string or {\"content\": ...}, got " + v.dump());
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& dir) {
  if (gguf::is_file_path(dir)) {
    // A GGUF file: the tokenizer.json and tokenizer_config.json its vocabulary makes.
    const gguf::File f = gguf::File::open(dir);
    const gguf::TokenizerFiles files = gguf::llama_tokenizer(f, gguf::llama_config(f));
    return from_json(files.tokenizer, dir + " (tokenizer.ggml.*)",
                     {{dir + " (tokenizer.ggml.*)", files.tokenizer_config}});
  }
  const fs::path path = fs::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec)
    throw Error(path.string() + ": not found; zof needs a Hugging Face tokenizer.json (a tokenizer.model or "
                                "vocab.json alone is not enough: convert it with transformers' "
                                "AutoTokenizer.from_pretrained(...).save_pretrained(dir))");
  const json j = read_json(path);
  std::vector<std::pair<std::string, json>> configs;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::exists(p, ec) || ec) configs.emplace_back(p.string(), read_json(p));
  }
  return from_json(j, path.string(), configs);
}

Tokenizer Tokenizer::from_json(const json& j, const std::string& path,
                               const std::vector<std::pair<std::string, json>>& configs) {
  const Source src{path};
  if (!j.is_object()) src.fail("(top level)", "expected a JSON object");
  Tokenizer tok;
  Impl& im = *tok.impl_;
  im.path = path;

  const json& model = src.at(j, "(top level)", "model");
  if (!model.is_object()) src.fail("model", "expected an object");
  const std::string type = model.contains("type") ? src.str(model, "model", "type")
                           : model.contains("merges") ? "BPE"
                                                      : "(none)";
  if (type != "BPE")
    src.fail("model.type", "\"" + type + "\" is not supported; zof reads BPE tokenizers only (GPT-2, LLaMA, "
                                         "Mistral, Qwen, ...)");
  im.model.load(src, model);

  im.normalizer = parse_normalizer(src, j.value("normalizer", json()), "normalizer");
  im.pre_tokenizer = parse_pre_tokenizer(src, j.value("pre_tokenizer", json()), "pre_tokenizer");
  im.post_processor = parse_post_processor(src, j.value("post_processor", json()), "post_processor");
  im.decoder = parse_decoder(src, j.value("decoder", json()), "decoder");

  im.load_added_tokens(src, j);
  im.build_id_tables(src);
  im.load_special_ids(configs);
  return tok;
}

// Added tokens keep the model's id when the model has the token, as tokenizers does.
void Tokenizer::Impl::load_added_tokens(const Source& src, const json& j) {
  const json& list = j.contains("added_tokens") ? j["added_tokens"] : json::array();
  if (!list.is_array()) src.fail("added_tokens", "expected a list");
  for (size_t k = 0; k < list.size(); ++k) {
    const std::string f = "added_tokens[" + std::to_string(k) + "]";
    const json& a = list[k];
    AddedToken t;
    t.content = src.str(a, f, "content");
    t.special = src.flag(a, f, "special", false);
    t.single_word = src.flag(a, f, "single_word", false);
    t.lstrip = src.flag(a, f, "lstrip", false);
    t.rstrip = src.flag(a, f, "rstrip", false);
    t.normalized = src.flag(a, f, "normalized", !t.special);
    const auto in_model = model.vocab.find(t.content);
    t.id = in_model != model.vocab.end() ? in_model->second : src.token_id(src.at(a, f, "id"), f + ".id");
    if (t.content.empty() || added_ids.count(t.content)) continue;
    added_ids[t.content] = t.id;
    added.push_back(std::move(t));
  }
  for (const AddedToken& t : added) {
    if (!t.normalized) {
      raw_matcher.add(t.content, &t);
    } else {
      std::string pattern = t.content;
      if (normalizer) normalizer->apply(pattern);
      normalized_matcher.add(std::move(pattern), &t);
    }
  }
  raw_matcher.build();
  normalized_matcher.build();
}

// id -> token and the id flags (exists, special) over the model's vocabulary and added tokens.
void Tokenizer::Impl::build_id_tables(const Source& src) {
  int32_t max_id = -1;
  for (const auto& [token, id] : model.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : added) max_id = std::max(max_id, t.id);
  // Ids index tables; the largest real vocabularies have a few hundred thousand tokens.
  constexpr int32_t kMaxTokenId = (1 << 24) - 1;
  if (max_id > kMaxTokenId)
    src.fail("model.vocab", "token id " + std::to_string(max_id) + " is larger than zof accepts (" +
                                std::to_string(kMaxTokenId) + "); the file is damaged");
  tokens.assign(static_cast<size_t>(max_id + 1), std::string());
  id_flags.assign(static_cast<size_t>(max_id + 1), 0);
  for (const auto& [token, id] : model.vocab) {
    // Two tokens on one id would decode as whichever came last: the vocabulary is damaged.
    if (id_flags[static_cast<size_t>(id)]) {
      const std::string& a = std::min(token, tokens[static_cast<size_t>(id)]);
      const std::string& b = std::max(token, tokens[static_cast<size_t>(id)]);
      src.fail("model.vocab", "tokens " + json(a).dump(-1, ' ', false, json::error_handler_t::replace) + " and " +
                                  json(b).dump(-1, ' ', false, json::error_handler_t::replace) +
                                  " both have id " + std::to_string(id) +
                                  "; each id names one token: the file is damaged, re-download it");
    }
    tokens[static_cast<size_t>(id)] = token;
    id_flags[static_cast<size_t>(id)] = 1 | 4;
  }
  std::unordered_set<std::string> special;
  for (const AddedToken& t : added) {
    tokens[static_cast<size_t>(t.id)] = t.content;
    id_flags[static_cast<size_t>(t.id)] |= 1;
    if (t.special) special.insert(t.content);
  }
  // decode's skip_special_tokens goes by the token's text, as tokenizers' is_special_token does.
  for (size_t id = 0; id < tokens.size(); ++id)
    if (id_flags[id] && special.count(tokens[id])) id_flags[id] |= 2;
}

// BOS/EOS/PAD: tokenizer_config.json, else special_tokens_map.json.
void Tokenizer::Impl::load_special_ids(const std::vector<std::pair<std::string, json>>& configs) {
  auto resolve = [&](const char* key) -> int32_t {
    for (const auto& [file, cfg] : configs) {
      const Source csrc{file};
      if (!cfg.is_object() || !cfg.contains(key)) continue;
      const auto name = special_token_name(csrc, cfg, key);
      return name ? find_id(*name) : -1;
    }
    return -1;
  };
  bos = resolve("bos_token");
  eos = resolve("eos_token");
  pad = resolve("pad_token");
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  std::string repaired;
  if (unicode::valid_utf8_prefix(text) != text.size()) {
    repaired = unicode::to_valid_utf8(text);
    text = repaired;
  }

  // 1. Added tokens matched on the raw text, 2. the rest normalized, then tokens matched on that.
  std::vector<Piece> pieces;
  std::vector<AddedTokenMatcher::Split> splits, inner;
  im.raw_matcher.split(text, splits);
  for (const auto& sp : splits) {
    if (sp.begin == sp.end) continue;
    if (sp.id >= 0) {
      pieces.push_back({std::string(), sp.id, sp.begin == 0});
      continue;
    }
    std::string s(text.substr(sp.begin, sp.end - sp.begin));
    if (im.normalizer) im.normalizer->apply(s);
    im.normalized_matcher.split(s, inner);
    for (const auto& in : inner) {
      if (in.begin == in.end) continue;
      const bool at_origin = sp.begin == 0 && in.begin == 0;
      if (in.id >= 0) pieces.push_back({std::string(), in.id, at_origin});
      else pieces.push_back({s.substr(in.begin, in.end - in.begin), -1, at_origin});
    }
  }
  if (im.pre_tokenizer) im.pre_tokenizer->apply(pieces);

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const Piece& p : pieces) {
    if (p.id >= 0) ids.push_back(p.id);
    else im.model.tokenize(p.text, ids);
  }
  if (add_special_tokens && im.post_processor) im.post_processor->apply(ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    // Ids the tokenizer does not know are dropped, as tokenizers does.
    if (id < 0 || static_cast<size_t>(id) >= im.tokens.size() || !(im.id_flags[static_cast<size_t>(id)] & 1))
      continue;
    if (skip_special_tokens && (im.id_flags[static_cast<size_t>(id)] & 2)) continue;
    tokens.push_back(im.tokens[static_cast<size_t>(id)]);
  }
  if (!im.decoder) {
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k) out += ' ';
      out += tokens[k];
    }
    return out;
  }
  im.decoder->apply(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->tokens.size()) return std::string();
  return impl_->tokens[static_cast<size_t>(id)];
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_->find_id(token); }

void Tokenizer::check_ids_below(int64_t vocab_size) const {
  const Impl& im = *impl_;
  const std::string fix = " is beyond the model's vocabulary of " + std::to_string(vocab_size) +
                          " ids (config.json vocab_size, ids 0 to " +
                          std::to_string(vocab_size - 1) +
                          "); this tokenizer is not the model's: use the tokenizer.json that "
                          "came with the model";
  // tokens holds one entry per id up to the largest of the vocabulary and the added tokens.
  // Added tokens past the vocabulary are allowed, as transformers allows them (Gemma 3's
  // <image_soft_token> is id 262144 of gemma-3-1b's 262144): plain text never produces them, and
  // the forward refuses a batch that holds one.
  for (size_t id = static_cast<size_t>(std::max<int64_t>(vocab_size, 0)); id < im.tokens.size(); ++id)
    if (im.id_flags[id] & 4)
      throw Error(im.path + ": token " + json(im.tokens[id]).dump(-1, ' ', false, json::error_handler_t::replace) +
                  " has id " + std::to_string(id) + ", which" + fix);
  const int32_t post = im.post_processor ? im.post_processor->max_id() : -1;
  if (post >= vocab_size)
    throw Error(im.path + ": post_processor adds special token id " + std::to_string(post) +
                ", which" + fix);
}

}  // namespace zof
