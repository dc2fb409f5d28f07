// The pieces of the tokenizer (tokenizer.cpp) that its component files share, inside zof::tok:
// reading tokenizer.json's fields (Source), patterns and splitting, and each stage of the
// pipeline as the Tokenizer holds it. The stages live where Hugging Face's tokenizers library
// keeps them:
//   tokenizer_pattern.cpp          patterns (tokenizer/pattern.rs) and NormalizedString's split
//                                  and replace (tokenizer/normalizer.rs)
//   tokenizer_normalizers.cpp      normalizers/
//   tokenizer_pre_tokenizers.cpp   pre_tokenizers/
//   tokenizer_models.cpp           models/bpe/
//   tokenizer_added_tokens.cpp     tokenizer/added_vocabulary.rs
//   tokenizer_post_processors.cpp  processors/
//   tokenizer_decoders.cpp         decoders/
// Private to src/hf.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hf/unicode.h"
#include "zof/error.h"

namespace zof::tok {

using json = nlohmann::json;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// ---- reading JSON with errors that name the file and the field -------------------------------

struct Source {
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw Error(file + ": " + field + ": " + what);
  }
  const json& at(const json& obj, const std::string& field, const char* key) const {
    if (!obj.is_object() || !obj.contains(key)) fail(field + "." + key, "missing");
    return obj[key];
  }
  std::string str(const json& obj, const std::string& field, const char* key) const {
    const json& v = at(obj, field, key);
    if (!v.is_string()) fail(field + "." + key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& field, const char* key, bool fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_boolean()) fail(field + "." + key, "expected true or false, got " + obj[key].dump());
    return obj[key].get<bool>();
  }
  int64_t integer(const json& v, const std::string& field) const {
    if (!v.is_number_integer()) fail(field, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  int32_t token_id(const json& v, const std::string& field) const {
    const int64_t id = integer(v, field);
    if (id < 0 || id > INT32_MAX - 1) fail(field, "token id " + std::to_string(id) + " is out of range");
    return static_cast<int32_t>(id);
  }
  char32_t one_char(const std::string& s, const std::string& field) const {
    size_t i = 0;
    if (s.empty() || unicode::valid_utf8_prefix(s) != s.size()) fail(field, "expected one character");
    const char32_t c = unicode::next_code_point(s, i);
    if (i != s.size()) fail(field, "expected one character, got \"" + s + "\"");
    return c;
  }
};

// ---- patterns and splitting (tokenizer_pattern.cpp) -------------------------------------------

// A String or Regex pattern from tokenizer.json (Split, Replace). Regexes are recognized, not
// compiled: the known pre-tokenizer regexes, and runs of one character such as " {2,}".
struct Pattern {
  enum class Kind { Literal, CharRun, Gpt2, Llama3 } kind = Kind::Literal;
  std::string literal;
  char32_t ch = 0;
  size_t min_run = 1, max_run = SIZE_MAX;
  size_t max_digits = 3;
  bool marks_are_letters = false;

  // Non-overlapping matches, leftmost first, as byte ranges into s.
  void find(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
};

Pattern parse_pattern(const Source& src, const json& j, const std::string& field);

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const Source& src, const json& obj, const std::string& field);

using Ranges = std::vector<std::pair<size_t, size_t>>;

// The ranges of a string of length len to keep, given the pattern's matches.
void split_ranges(size_t len, const Ranges& matches, bool invert, Behavior behavior, Ranges& out);

// Every match of pattern in s replaced by content.
std::string replace_all(const std::string& s, const Pattern& pattern, const std::string& content);

// ---- normalizers (tokenizer_normalizers.cpp) --------------------------------------------------

struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

std::unique_ptr<Normalizer> parse_normalizer(const Source& src, const json& j, const std::string& field);

// ---- pre-tokenizers (tokenizer_pre_tokenizers.cpp) --------------------------------------------

// A piece of the input on its way to the model: an added token (id >= 0) or text to tokenize.
struct Piece {
  std::string text;
  int32_t id = -1;
  bool at_origin = false;  // starts at offset 0 of the original input (Metaspace "first")
};

struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

// GPT-2's byte-to-character table: printable bytes stand for themselves, the others for U+0100...
struct ByteChars {
  std::array<std::string, 256> utf8;  // byte -> its character in UTF-8
  std::array<int16_t, 324> byte_of;   // character -> byte, -1 if none
  ByteChars() {
    byte_of.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t c = printable ? static_cast<char32_t>(b) : next++;
      unicode::append_utf8(utf8[b], c);
      byte_of[c] = static_cast<int16_t>(b);
    }
  }
};
const ByteChars& byte_chars();

enum class PrependScheme { Always, First, Never };

// Metaspace's prepend_scheme (or the older add_prefix_space), for its pre-tokenizer and decoder.
PrependScheme parse_prepend_scheme(const Source& src, const json& j, const std::string& field);

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Source& src, const json& j, const std::string& field);

// ---- BPE model (tokenizer_models.cpp) ---------------------------------------------------------

class Bpe {
 public:
  StringMap<int32_t> vocab;
  std::optional<std::string> unk_token;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string file;  // for messages

  void load(const Source& src, const json& model);
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct MergeInfo {
    int32_t rank, new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  // A word's symbols, linked left to right as merges join them.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    size_t len;  // bytes; 0 once merged into its left neighbour
  };
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  // The word's characters as vocabulary symbols (with the subword prefix/suffix, byte fallback
  // and unknown-token fusing), before any merge.
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const;

  std::unordered_map<uint64_t, MergeInfo> merges_;
  std::array<int32_t, 256> byte_ids_{};  // id of "<0xAB>", -1 if absent
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedWord = 256;  // bytes; longer words are rare and costly to keep
  mutable std::mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;
};

// ---- added tokens (tokenizer_added_tokens.cpp) ------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = true;
};

// AddedVocabulary::find_matches: leftmost-longest matches of the tokens' patterns, with
// single_word, lstrip and rstrip applied, as splits that cover the whole string. The patterns
// sit in a byte trie, so the longest one starting at a position is found in one walk no longer
// than it, whatever the number of tokens (Gemma 3 has about 6,000, mostly "<unusedN>").
class AddedTokenMatcher {
 public:
  struct Split {
    size_t begin, end;
    int32_t id;  // -1: text between tokens
  };
  void add(std::string pattern, const AddedToken* token) {
    if (pattern.empty()) return;
    entries_.push_back({std::move(pattern), token});
  }
  void build();
  bool empty() const { return entries_.empty(); }
  void split(std::string_view s, std::vector<Split>& out) const;

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  // A trie node: its children are the edges [first_edge, end_edge) of edge_byte_/edge_child_,
  // in byte order; entry: the pattern that ends here (-1: none).
  struct Node {
    uint32_t first_edge = 0, end_edge = 0;
    int32_t entry = -1;
  };
  uint32_t child(uint32_t node, unsigned char byte) const;  // 0: none (the root is no child)
  const Entry* longest_match(std::string_view s, size_t pos) const;

  std::vector<Entry> entries_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<uint8_t> edge_byte_;
  std::vector<uint32_t> edge_child_;
  std::array<uint32_t, 256> root_child_{};  // the root's edges by byte: the lookup made at every byte
};

// ---- post-processors (tokenizer_post_processors.cpp) ------------------------------------------

struct PostProcessor {
  virtual ~PostProcessor() = default;
  virtual void apply(std::vector<int32_t>& ids) const = 0;
  // The largest id apply() may add (-1: none).
  virtual int32_t max_id() const = 0;
};

std::unique_ptr<PostProcessor> parse_post_processor(const Source& src, const json& j, const std::string& field);

// ---- decoders (tokenizer_decoders.cpp) --------------------------------------------------------

struct Decoder {
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Decoder> parse_decoder(const Source& src, const json& j, const std::string& field);

}  // namespace zof::tok
