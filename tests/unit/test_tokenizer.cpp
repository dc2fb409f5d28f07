// Tokenizer: ids and decoded text equal to Hugging Face tokenizers' on real data, edge cases and
// synthetic variants (expected values from tests/reference/tokenizer_reference.py, read from
// $ZOF_TOKREF_DIR, default <build>/tokref); round trips; bad files; BOS/EOS from the config.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "zof/error.h"
#include "zof/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string tokref_dir() {
  const char* env = std::getenv("ZOF_TOKREF_DIR");
  return env && *env ? std::string(env) : zof::test::binary_dir() + "/tokref";
}
std::string gpt2_dir() { return zof::test::assets_dir() + "/tokenizers/gpt2"; }
std::string stories_dir() { return zof::test::assets_dir() + "/models/stories260K"; }

std::string shorten(const std::string& s, size_t n = 160) {
  return s.size() <= n ? s : s.substr(0, n) + "...(" + std::to_string(s.size()) + " bytes)";
}
std::string show(const std::vector<int32_t>& ids, size_t n = 40) {
  std::string out = "[";
  for (size_t k = 0; k < ids.size() && k < n; ++k) {
    if (k) out += ',';
    out += std::to_string(ids[k]);
  }
  if (ids.size() > n) out += ",...(" + std::to_string(ids.size()) + " ids)";
  return out + "]";
}

// Compares every record of one reference file; reports the first few mismatches of each kind.
void check_reference_file(const zof::Tokenizer& tok, const std::string& path) {
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::string line;
  size_t lineno = 0, bad = 0;
  constexpr size_t kShow = 5;
  auto report = [&](const std::string& what) {
    if (++bad <= kShow) ADD_FAILURE() << path << ":" << lineno << ": " << what;
  };
  while (std::getline(in, line)) {
    ++lineno;
    const json r = json::parse(line);
    if (r.contains("decode_ids")) {
      const auto ids = r["decode_ids"].get<std::vector<int32_t>>();
      const std::string got = tok.decode(ids, true), got_all = tok.decode(ids, false);
      if (got != r["decoded"].get<std::string>())
        report("decode(" + show(ids) + ", skip) = \"" + shorten(got) + "\", tokenizers: \"" +
               shorten(r["decoded"].get<std::string>()) + "\"");
      if (got_all != r["decoded_all"].get<std::string>())
        report("decode(" + show(ids) + ") = \"" + shorten(got_all) + "\", tokenizers: \"" +
               shorten(r["decoded_all"].get<std::string>()) + "\"");
      continue;
    }
    const std::string text = r["text"].get<std::string>();
    const auto want = r["ids"].get<std::vector<int32_t>>();
    const auto want_plain = r["ids_plain"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, true);
    if (got != want) report("encode(\"" + shorten(text) + "\") = " + show(got) + ", tokenizers: " + show(want));
    const auto got_plain = tok.encode(text, false);
    if (got_plain != want_plain)
      report("encode(\"" + shorten(text) + "\", no specials) = " + show(got_plain) + ", tokenizers: " +
             show(want_plain));
    const std::string dec = tok.decode(want, true), dec_all = tok.decode(want, false);
    if (dec != r["decoded"].get<std::string>())
      report("decode(encode(\"" + shorten(text) + "\"), skip) = \"" + shorten(dec) + "\", tokenizers: \"" +
             shorten(r["decoded"].get<std::string>()) + "\"");
    if (dec_all != r["decoded_all"].get<std::string>())
      report("decode(encode(\"" + shorten(text) + "\")) = \"" + shorten(dec_all) + "\", tokenizers: \"" +
             shorten(r["decoded_all"].get<std::string>()) + "\"");
  }
  EXPECT_GT(lineno, 0u) << path << " is empty";
  EXPECT_EQ(bad, 0u) << path << ": " << bad << " mismatches in " << lineno << " records";
}

json read_manifest() {
  std::ifstream in(tokref_dir() + "/manifest.json");
  return json::parse(in);
}

// Runs the reference cases whose name is `only`, or all the others when `only` is empty.
void check_reference_cases(const std::string& only, const std::vector<std::string>& exclude = {}) {
  const json manifest = read_manifest();
  size_t ran = 0;
  for (const json& c : manifest["cases"]) {
    const std::string name = c["name"].get<std::string>();
    if (!only.empty() && name != only) continue;
    if (std::find(exclude.begin(), exclude.end(), name) != exclude.end()) continue;
    SCOPED_TRACE("case " + name);
    std::string dir = c["tokenizer_dir"].get<std::string>();
    dir = dir.rfind("assets/", 0) == 0 ? zof::test::assets_dir() + dir.substr(6) : tokref_dir() + "/" + dir;
    const zof::Tokenizer tok = zof::Tokenizer::load(dir);
    EXPECT_EQ(tok.vocab_size(), c["vocab_size"].get<int64_t>());
    for (const json& f : c["files"]) check_reference_file(tok, tokref_dir() + "/" + name + "/" + f.get<std::string>());
    ++ran;
  }
  EXPECT_GT(ran, 0u) << "no reference case " << only << " in " << tokref_dir() << "/manifest.json";
}

// Reference files: python3 tests/reference/tokenizer_reference.py --out <build>/tokref
TEST(TokenizerReference, Gpt2) {
  ZOF_REQUIRE_PATH(tokref_dir() + "/manifest.json");
  check_reference_cases("gpt2");
}

TEST(TokenizerReference, Stories260K) {
  ZOF_REQUIRE_PATH(tokref_dir() + "/manifest.json");
  check_reference_cases("stories260K");
}

// Variants of the two tokenizers with the other normalizers, pre-tokenizers, decoders and
// added-token flags zof implements (see the reference script).
TEST(TokenizerReference, SyntheticVariants) {
  ZOF_REQUIRE_PATH(tokref_dir() + "/manifest.json");
  check_reference_cases("", {"gpt2", "stories260K"});
}

// ---- properties that need no reference file ---------------------------------------------------

TEST(TokenizerRoundTrip, Gpt2IsLosslessOnValidUtf8) {
  ZOF_REQUIRE_PATH(gpt2_dir());
  const auto tok = zof::Tokenizer::load(gpt2_dir());
  const std::vector<std::string> texts = {
      "", " ", "   ", "\n", "\t \n  ", "  two  spaces  ", "Hello, World!", "I'm you'll they'd",
      "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80", "a\xCC\x81", "<|endoftext|> x <|endoftext|>",
      std::string(3000, 'a'), std::string(2000, ' ') + "x"};
  for (const auto& t : texts) EXPECT_EQ(tok.decode(tok.encode(t), false), t) << shorten(t);
  // Random valid UTF-8 made of ASCII and multibyte characters.
  std::srand(7);
  const char* pieces[] = {"a", "Z", " ", "  ", "\n", "'s", "9", ".", "\xC3\xA9", "\xE2\x80\x94", "\xF0\x9F\x8E\x89",
                          "\xE4\xB8\xAD", "\t", "<|endoftext|>"};
  for (int k = 0; k < 300; ++k) {
    std::string t;
    for (int n = std::rand() % 40; n > 0; --n) t += pieces[std::rand() % (sizeof(pieces) / sizeof(pieces[0]))];
    EXPECT_EQ(tok.decode(tok.encode(t, false), false), t) << shorten(t);
  }
}

TEST(TokenizerRoundTrip, Stories260KNormalizesSpaces) {
  ZOF_REQUIRE_PATH(stories_dir());
  const auto tok = zof::Tokenizer::load(stories_dir());
  // The normalizer strips the ends and collapses runs of spaces; the rest comes back exactly,
  // characters outside the vocabulary through byte fallback.
  EXPECT_EQ(tok.decode(tok.encode("  Once upon   a time,\tthere was a cat.  ")), "Once upon a time,\tthere was a cat.");
  EXPECT_EQ(tok.decode(tok.encode("caf\xC3\xA9 \xE6\x97\xA5 \xF0\x9F\x98\x80")), "caf\xC3\xA9 \xE6\x97\xA5 \xF0\x9F\x98\x80");
  EXPECT_EQ(tok.decode(tok.encode("line one\nline two")), "line one\nline two");
  EXPECT_EQ(tok.decode(tok.encode("")), "");
}

TEST(TokenizerInvalidUtf8, BadBytesBecomeReplacementCharacters) {
  ZOF_REQUIRE_PATH(gpt2_dir());
  const auto tok = zof::Tokenizer::load(gpt2_dir());
  const std::string fffd = "\xEF\xBF\xBD";
  // One U+FFFD per maximal invalid subsequence, as Python's decode("utf-8", "replace").
  EXPECT_EQ(tok.encode("\xFF\xFE" "abc\xC3"), tok.encode(fffd + fffd + "abc" + fffd));
  EXPECT_EQ(tok.encode("x\xE2\x82y"), tok.encode("x" + fffd + "y"));
  EXPECT_EQ(tok.encode("\xED\xA0\x80"), tok.encode(fffd + fffd + fffd));
  EXPECT_EQ(tok.encode("\xF0\x9F\x98"), tok.encode(fffd));
  EXPECT_EQ(tok.encode(std::string("a\0b", 3)), tok.encode(std::string("a\0b", 3)));
  const auto stories = zof::Tokenizer::load(stories_dir());
  EXPECT_EQ(stories.decode(stories.encode("\xC0\xAF ok")), fffd + fffd + " ok");
}

TEST(TokenizerSpecial, BosEosFromTokenizerConfig) {
  ZOF_REQUIRE_PATH(stories_dir());
  ZOF_REQUIRE_PATH(gpt2_dir());
  const auto stories = zof::Tokenizer::load(stories_dir());
  EXPECT_EQ(stories.bos_id(), 1);
  EXPECT_EQ(stories.eos_id(), 2);
  EXPECT_EQ(stories.pad_id(), -1);
  EXPECT_EQ(stories.vocab_size(), 512);
  EXPECT_EQ(stories.token_to_id("<s>"), 1);
  EXPECT_EQ(stories.id_to_token(2), "</s>");
  EXPECT_EQ(stories.token_to_id("no such token"), -1);
  EXPECT_EQ(stories.id_to_token(100000), "");
  // The post-processor adds BOS only when asked.
  const auto with = stories.encode("Once upon a time"), without = stories.encode("Once upon a time", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with[0], 1);
  EXPECT_EQ(std::vector<int32_t>(with.begin() + 1, with.end()), without);

  const auto gpt2 = zof::Tokenizer::load(gpt2_dir());
  EXPECT_EQ(gpt2.eos_id(), 50256);
  EXPECT_EQ(gpt2.bos_id(), 50256);
  EXPECT_EQ(gpt2.pad_id(), -1);
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  EXPECT_EQ(gpt2.token_to_id("<|endoftext|>"), 50256);
  EXPECT_EQ(gpt2.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(gpt2.encode("a<|endoftext|>"), (std::vector<int32_t>{64, 50256}));
  EXPECT_EQ(gpt2.decode({64, 50256}), "a");
  EXPECT_EQ(gpt2.decode({64, 50256}, false), "a<|endoftext|>");
}

TEST(TokenizerSpecial, MovedTokenizerStillWorks) {
  ZOF_REQUIRE_PATH(gpt2_dir());
  auto a = zof::Tokenizer::load(gpt2_dir());
  zof::Tokenizer b = std::move(a);
  EXPECT_EQ(b.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
}

// encode is const and shares a word cache between threads.
TEST(TokenizerThreads, ConcurrentEncodeMatchesSerial) {
  ZOF_REQUIRE_PATH(gpt2_dir());
  const auto tok = zof::Tokenizer::load(gpt2_dir());
  std::vector<std::string> lines;
  for (int k = 0; k < 2000; ++k)
    lines.push_back("line " + std::to_string(k) + ": the quick brown fox " + std::string(k % 7, ' ') + "jumps" +
                    std::to_string(k * 7919));
  std::vector<std::vector<int32_t>> serial;
  for (const auto& l : lines) serial.push_back(tok.encode(l));
  const auto fresh = zof::Tokenizer::load(gpt2_dir());
  std::vector<std::vector<std::vector<int32_t>>> got(4, std::vector<std::vector<int32_t>>(lines.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < lines.size(); ++k) got[t][k] = fresh.encode(lines[(k + t * 500) % lines.size()]);
    });
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < got.size(); ++t)
    for (size_t k = 0; k < lines.size(); ++k) ASSERT_EQ(got[t][k], serial[(k + t * 500) % lines.size()]);
}

// ---- bad input files --------------------------------------------------------------------------

class TokenizerBadFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("zof_tokenizer_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  // A minimal BPE tokenizer.json with one part replaced.
  static json minimal() {
    return json::parse(R"({"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null,
      "post_processor": null, "decoder": null,
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
  }
  // The zof::Error message of loading the directory ("" if it loads).
  std::string load_error() {
    try {
      zof::Tokenizer::load(dir_.string());
    } catch (const zof::Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(TokenizerBadFile, MinimalFileLoads) {
  write("tokenizer.json", minimal().dump());
  const auto tok = zof::Tokenizer::load(dir_.string());
  EXPECT_EQ(tok.encode("abba"), (std::vector<int32_t>{2, 1, 0}));  // ab b a
  EXPECT_EQ(tok.decode({2, 1}), "ab b");  // no decoder: tokens joined by spaces
  EXPECT_EQ(tok.bos_id(), -1);
}

TEST_F(TokenizerBadFile, UnsupportedModelTypeNamesFileAndType) {
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    json j = minimal();
    j["model"]["type"] = type;
    write("tokenizer.json", j.dump());
    const std::string msg = load_error();
    EXPECT_NE(msg.find((dir_ / "tokenizer.json").string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(type), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.type"), std::string::npos) << msg;
  }
}

TEST_F(TokenizerBadFile, MalformedJson) {
  write("tokenizer.json", "{\"model\": {\"type\": \"BPE\", ");
  const std::string msg = load_error();
  EXPECT_NE(msg.find((dir_ / "tokenizer.json").string()), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
}

TEST_F(TokenizerBadFile, MalformedTokenizerConfig) {
  write("tokenizer.json", minimal().dump());
  write("tokenizer_config.json", "{\"bos_token\": ");
  const std::string msg = load_error();
  EXPECT_NE(msg.find("tokenizer_config.json"), std::string::npos) << msg;
}

TEST_F(TokenizerBadFile, MissingFile) {
  const std::string msg = load_error();
  EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not found"), std::string::npos) << msg;
  EXPECT_THROW(zof::Tokenizer::load((dir_ / "no_such_dir").string()), zof::Error);
}

TEST_F(TokenizerBadFile, UnsupportedComponentsNameTheField) {
  struct Bad {
    const char* key;
    const char* value;
    const char* field;
  };
  const Bad cases[] = {
      {"normalizer", R"({"type": "Precompiled", "precompiled_charsmap": ""})", "normalizer.type"},
      {"normalizer", R"({"type": "Sequence", "normalizers": [{"type": "BertNormalizer"}]})",
       "normalizer.normalizers[0].type"},
      {"pre_tokenizer", R"({"type": "Split", "pattern": {"Regex": "\\w+|[a-z]"}, "behavior": "Isolated"})",
       "pre_tokenizer.pattern"},
      {"pre_tokenizer", R"({"type": "BertPreTokenizer"})", "pre_tokenizer.type"},
      {"pre_tokenizer", R"({"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways"})",
       "pre_tokenizer.behavior"},
      {"decoder", R"({"type": "WordPiece", "prefix": "##"})", "decoder.type"},
      {"post_processor", R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<x>"}}],
        "special_tokens": {}})", "post_processor.special_tokens"},
  };
  for (const Bad& b : cases) {
    json j = minimal();
    j[b.key] = json::parse(b.value);
    write("tokenizer.json", j.dump());
    const std::string msg = load_error();
    EXPECT_NE(msg.find(b.field), std::string::npos) << b.value << " -> " << msg;
    EXPECT_NE(msg.find("tokenizer.json"), std::string::npos) << msg;
  }
}

TEST_F(TokenizerBadFile, BadModelFields) {
  json j = minimal();
  j["model"]["merges"] = json::array({"a c"});
  write("tokenizer.json", j.dump());
  EXPECT_NE(load_error().find("model.merges[0]"), std::string::npos) << load_error();
  j = minimal();
  j["model"]["merges"] = json::array({"a b c"});
  write("tokenizer.json", j.dump());
  EXPECT_NE(load_error().find("model.merges[0]"), std::string::npos);
  j = minimal();
  j["model"]["vocab"]["c"] = -4;
  write("tokenizer.json", j.dump());
  EXPECT_NE(load_error().find("model.vocab"), std::string::npos);
  j = minimal();
  j["model"]["vocab"]["c"] = 2000000000;
  write("tokenizer.json", j.dump());
  EXPECT_NE(load_error().find("model.vocab"), std::string::npos);
  j = minimal();
  j["model"].erase("vocab");
  write("tokenizer.json", j.dump());
  EXPECT_NE(load_error().find("model.vocab"), std::string::npos);
}

TEST_F(TokenizerBadFile, MergesAsPairsAndByteFallback) {
  json j = minimal();
  j["model"]["merges"] = json::array({json::array({"a", "b"})});
  j["model"]["vocab"]["<0x63>"] = 3;  // 'c'
  j["model"]["vocab"]["<unk>"] = 4;
  j["model"]["byte_fallback"] = true;
  j["model"]["unk_token"] = "<unk>";
  j["model"]["fuse_unk"] = true;
  j["decoder"] = json::parse(R"({"type": "ByteFallback"})");
  write("tokenizer.json", j.dump());
  const auto tok = zof::Tokenizer::load(dir_.string());
  EXPECT_EQ(tok.encode("abcdda"), (std::vector<int32_t>{2, 3, 4, 0}));  // "dd" fused into one <unk>
  EXPECT_EQ(tok.decode({2, 3}), "abc");
}

}  // namespace
