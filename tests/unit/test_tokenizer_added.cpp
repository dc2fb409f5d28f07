// Added tokens: how encode splits text on them (leftmost-longest: at each position the longest
// token there wins, and the search resumes after it), by hand and against a plain scan of every
// token at every position (the algorithm the byte trie replaced, kept here as the oracle). The
// tokenizers are made so that the ids show the splits: a BPE with byte fallback, no merges and
// only <0x00>..<0xFF> (ids 0..255) in its vocabulary, so an added token is its id and any other
// byte its own id.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "zof/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Token {
  std::string content;
  int32_t id;
  bool normalized;  // false: matched on the raw text (as special tokens are by default)
};

class TokenizerAddedTokens : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("zof_tokenizer_added_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The byte-fallback tokenizer with these added tokens (ids from 256) and normalizer.
  zof::Tokenizer load(const std::vector<Token>& tokens, const json& normalizer = nullptr) {
    json vocab = json::object();
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      vocab[name] = b;
    }
    json added = json::array();
    for (const Token& t : tokens)
      added.push_back({{"id", t.id}, {"content", t.content}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", t.normalized}, {"special", !t.normalized}});
    const json j = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", normalizer},
                    {"pre_tokenizer", nullptr},
                    {"post_processor", nullptr},
                    {"decoder", nullptr},
                    {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"byte_fallback", true}}}};
    std::ofstream(dir_ / "tokenizer.json") << j.dump();
    return zof::Tokenizer::load(dir_.string());
  }
  fs::path dir_;
};

// The ids of text: each byte's id, with the given added-token ids in between.
std::vector<int32_t> bytes_and(std::initializer_list<std::variant<std::string_view, int32_t>> parts) {
  std::vector<int32_t> ids;
  for (const auto& p : parts) {
    if (const auto* id = std::get_if<int32_t>(&p)) ids.push_back(*id);
    else
      for (char c : std::get<std::string_view>(p)) ids.push_back(static_cast<unsigned char>(c));
  }
  return ids;
}

// The oracle: at each position, every token in order of decreasing length (first added first
// among equal ones), the first that matches wins; the text between matches as bytes. Normalized
// tokens (no normalizer here) are then matched in the text between the raw ones, as encode does.
class ScanEveryToken {
 public:
  explicit ScanEveryToken(const std::vector<Token>& tokens) {
    std::vector<std::string_view> seen;  // a content given twice keeps its first entry, as load does
    for (const Token& t : tokens) {
      if (std::find(seen.begin(), seen.end(), t.content) != seen.end()) continue;
      seen.push_back(t.content);
      (t.normalized ? normalized_ : raw_).push_back(&t);
    }
    for (auto* list : {&raw_, &normalized_})
      std::stable_sort(list->begin(), list->end(),
                       [](const Token* a, const Token* b) { return a->content.size() > b->content.size(); });
  }
  std::vector<int32_t> encode(std::string_view s) const {
    std::vector<int32_t> ids;
    scan(s, raw_, ids);
    return ids;
  }

 private:
  void scan(std::string_view s, const std::vector<const Token*>& tokens, std::vector<int32_t>& ids) const {
    auto text = [&](std::string_view gap) {
      if (&tokens == &raw_) scan(gap, normalized_, ids);
      else
        for (char c : gap) ids.push_back(static_cast<unsigned char>(c));
    };
    size_t done = 0;
    for (size_t pos = 0; pos < s.size();) {
      const Token* found = nullptr;
      for (const Token* t : tokens)
        if (s.compare(pos, t->content.size(), t->content) == 0) {
          found = t;
          break;
        }
      if (!found) {
        ++pos;
        continue;
      }
      text(s.substr(done, pos - done));
      ids.push_back(found->id);
      pos += found->content.size();
      done = pos;
    }
    text(s.substr(done));
  }
  std::vector<const Token*> raw_, normalized_;
};

std::string show(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) out += ',';
    out += std::to_string(ids[k]);
  }
  return out += ']';
}

TEST_F(TokenizerAddedTokens, LongestAtEachPositionThenResumeAfterIt) {
  const std::vector<Token> tokens = {
      {"<u", 300, false},  {"<unused1>", 301, false}, {"<unused12>", 302, false},
      {"ab", 303, false},  {"abc", 304, false},       {"bcd", 305, false},
      {"\xC3\xA9", 306, false},                  // é
      {"\xC3\xA9\xC3\xA9", 307, false},          // éé
      {"\xE6\x97\xA5\xE6\x9C\xAC", 308, false},  // 日本
      {"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", 309, false},  // 日本語
      {"\xF0\x9F\x98\x80", 310, false},                      // an emoji
  };
  const auto tok = load(tokens);
  struct Case {
    std::string text;
    std::vector<int32_t> ids;
  };
  const Case cases[] = {
      {"<unused12>", {302}},
      {"<unused1>>", bytes_and({301, ">"})},
      {"<<unused1>>", bytes_and({"<", 301, ">"})},
      // A prefix of longer tokens at the end of the text: the shorter token that fits.
      {"<unused12", bytes_and({300, "nused12"})},
      {"x<unused1", bytes_and({"x", 300, "nused1"})},
      {"<", bytes_and({"<"})},
      // Overlaps: "abc" wins at 0 and hides "bcd"; "ab" then "bcd" when they do not overlap.
      {"abcd", bytes_and({304, "d"})},
      {"abbcd", bytes_and({303, 305})},
      {"xbcd", bytes_and({"x", 305})},
      {"a", bytes_and({"a"})},
      // Multi-byte UTF-8: tokens sharing lead bytes, a character sharing é's first byte (è).
      {"\xC3\xA9\xC3\xA9\xC3\xA9", bytes_and({307, 306})},
      {"\xC3\xA8\xC3\xA9", bytes_and({"\xC3\xA8", 306})},
      {"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE6\x97\xA5\xE6\x9C\xAC\xE6\x97\xA5",
       bytes_and({309, 308, "\xE6\x97\xA5"})},
      {"\xF0\x9F\x98\x80\xF0\x9F\x98\x80", {310, 310}},
      {"", {}},
  };
  const ScanEveryToken oracle(tokens);
  for (const Case& c : cases) {
    EXPECT_EQ(tok.encode(c.text), c.ids) << c.text;
    EXPECT_EQ(oracle.encode(c.text), c.ids) << c.text;
  }
}

// Two tokens that normalize to the same pattern: the first added wins, on either spelling.
// (tokenizers 0.23 is not consistent here: with two such pairs it chose the first of one and the
// second of the other.)
TEST_F(TokenizerAddedTokens, FirstAddedOfEqualPatternsWins) {
  const auto tok = load({{"<X>", 300, true}, {"<x>", 301, true}, {"<x", 302, true}},
                        json::parse(R"({"type": "Lowercase"})"));
  EXPECT_EQ(tok.encode("<x>"), (std::vector<int32_t>{300}));
  EXPECT_EQ(tok.encode("<X>"), (std::vector<int32_t>{300}));
  EXPECT_EQ(tok.encode("<X"), (std::vector<int32_t>{302}));
}

// Random token sets over a small alphabet (ASCII and 2-, 3- and 4-byte characters, so tokens
// share prefixes and lead bytes), raw and normalized mixed, on text made of the tokens' pieces.
TEST_F(TokenizerAddedTokens, SameSplitsAsScanningEveryToken) {
  const char* atoms[] = {"a", "b", "<", ">", "\xC3\xA9", "\xC3\xA8", "\xE6\x97\xA5", "\xE6\x9C\xAC",
                         "\xF0\x9F\x98\x80"};
  constexpr size_t kAtoms = sizeof(atoms) / sizeof(atoms[0]);
  std::mt19937 rng(20261202);
  auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  size_t texts = 0, matched = 0;
  for (int set = 0; set < 60; ++set) {
    // Tokens as lists of atoms, so that their prefixes are valid UTF-8 too.
    std::vector<std::vector<std::string>> parts(1 + below(set < 30 ? 8 : 40));
    std::vector<Token> tokens;
    for (auto& p : parts) {
      p.resize(1 + below(6));
      for (auto& a : p) a = atoms[below(kAtoms)];
      std::string content;
      for (const auto& a : p) content += a;
      tokens.push_back({content, static_cast<int32_t>(256 + tokens.size()), below(3) == 0});
    }
    const auto tok = load(tokens);
    const ScanEveryToken oracle(tokens);
    for (int k = 0; k < 200; ++k, ++texts) {
      std::string text;
      for (size_t n = below(24); n > 0; --n) {
        if (below(3) == 0) {
          text += atoms[below(kAtoms)];
          continue;
        }
        const auto& p = parts[below(parts.size())];  // a token, or a prefix of one
        for (size_t a = 0, len = below(3) == 0 ? p.size() : 1 + below(p.size()); a < len; ++a) text += p[a];
      }
      const auto want = oracle.encode(text), got = tok.encode(text);
      ASSERT_EQ(got, want) << "set " << set << ", text \"" << text << "\": " << show(got) << " vs " << show(want);
      matched += std::count_if(want.begin(), want.end(), [](int32_t id) { return id >= 256; });
    }
  }
  EXPECT_GT(matched, texts);  // on average more than one token a text: the matches were exercised
}

// Thousands of tokens sharing a long prefix, as Gemma 3's "<unusedN>" (about 6,000) and Llama 3's
// "<|reserved_special_token_N|>".
TEST_F(TokenizerAddedTokens, ManyTokensSharingAPrefix) {
  std::vector<Token> tokens = {{"<start_of_turn>", 256, false}, {"<", 257, false}, {"<unused", 258, false}};
  for (int n = 0; n < 6000; ++n) tokens.push_back({"<unused" + std::to_string(n) + ">", 259 + n, false});
  const auto tok = load(tokens);
  const ScanEveryToken oracle(tokens);
  EXPECT_EQ(tok.encode("<unused5999>"), (std::vector<int32_t>{259 + 5999}));
  EXPECT_EQ(tok.encode("<unused6000>"), bytes_and({258, "6000>"}));
  EXPECT_EQ(tok.encode("<<unused12>x<unused"), bytes_and({257, 259 + 12, "x", 258}));
  const char* pieces[] = {"<unused", "<", ">", "1", "2", "9", "0", "x", "<start_of_turn>", "<start_of", "\xC3\xA9"};
  std::mt19937 rng(6000);
  for (int k = 0; k < 300; ++k) {
    std::string text;
    for (size_t n = rng() % 30; n > 0; --n) text += pieces[rng() % (sizeof(pieces) / sizeof(pieces[0]))];
    ASSERT_EQ(tok.encode(text), oracle.encode(text)) << text;
  }
}

}  // namespace
