// Hugging Face tokenizer.json: BPE as the tokenizers library runs it, byte-level (GPT-2, LLaMA-3,
// Qwen) and SentencePiece-style with byte fallback (LLaMA-2, stories260K), with added/special
// tokens and BOS/EOS as tokenizer_config.json says.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace zof {

class Tokenizer {
 public:
  // Reads dir/tokenizer.json and, when present, dir/tokenizer_config.json and
  // dir/special_tokens_map.json; or, when dir is a GGUF file, the byte-level BPE its
  // tokenizer.ggml.* keys describe (gguf_llama.h). zof::Error names the file and the field it
  // cannot handle.
  static Tokenizer load(const std::string& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special_tokens: what the post-processor adds (e.g. BOS for LLaMA), as
  // tokenizers' encode(text, add_special_tokens=True) does.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // As tokenizers' decode(ids, skip_special_tokens).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;

  int32_t bos_id() const;  // -1 when the model has none
  int32_t eos_id() const;
  int32_t pad_id() const;
  int64_t vocab_size() const;  // including added tokens
  std::string id_to_token(int32_t id) const;
  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  // zof::Error naming tokenizer.json, the token and its id unless every id of the vocabulary and
  // the post-processor's special tokens is below the model's vocab_size: a larger one would index
  // past the embedding table. Added tokens past it are allowed (as transformers allows them).
  void check_ids_below(int64_t vocab_size) const;

 private:
  Tokenizer();
  // The tokenizer of a parsed tokenizer.json (path names it in messages) and of its configs
  // (tokenizer_config.json, then special_tokens_map.json: each one's name and JSON).
  static Tokenizer from_json(const nlohmann::json& tokenizer, const std::string& path,
                             const std::vector<std::pair<std::string, nlohmann::json>>& configs);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zof
