// Fuzz target: arbitrary text (any bytes, invalid UTF-8 included) through fixed tokenizers:
// encode, decode of the result, and decode of arbitrary ids (unknown and negative ones too).
// The tokenizers are fuzz/tokenizers/* (small ones made to cover byte-level, LLaMA-3-style
// and SentencePiece-style pipelines) and, when present, shared/assets' stories260K. The first
// input byte picks the tokenizer and the flags; the rest is the text.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "zof/tokenizer.h"

namespace {

std::vector<zof::Tokenizer> load_all() {
  std::vector<std::string> dirs;
  for (const auto& e : std::filesystem::directory_iterator(ZOF_FUZZ_TOKENIZERS_DIR))
    if (std::filesystem::exists(e.path() / "tokenizer.json")) dirs.push_back(e.path().string());
  const std::string stories = std::string(ZOF_ASSETS_DIR) + "/models/stories260K";
  if (std::filesystem::exists(stories + "/tokenizer.json")) dirs.push_back(stories);
  std::sort(dirs.begin(), dirs.end());
  std::vector<zof::Tokenizer> all;
  for (const auto& d : dirs) all.push_back(zof::Tokenizer::load(d));  // a zof::Error here is a bug
  if (all.empty()) std::abort();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<zof::Tokenizer> tokenizers = load_all();
  if (size == 0) return 0;
  const zof::Tokenizer& tok = tokenizers[data[0] % tokenizers.size()];
  const bool special = (data[0] / tokenizers.size()) % 2 == 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<int32_t> ids = tok.encode(text, special);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();  // every id must be the tokenizer's
  const std::string back = tok.decode(ids, special);
  (void)tok.encode(back, !special);
  // The bytes as 16-bit ids around the vocabulary (a few negative, a few past the end).
  std::vector<int32_t> any;
  for (size_t i = 1; i + 1 < size; i += 2)
    any.push_back(int32_t((data[i] | (data[i + 1] << 8)) % (tok.vocab_size() + 8)) - 4);
  (void)tok.decode(any, special);
  return 0;
}
