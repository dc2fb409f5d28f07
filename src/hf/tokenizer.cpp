// Tokenizer: a Hugging Face tokenizer.json with a BPE model, run as the tokenizers library runs
// it: split on added tokens, normalize, pre-tokenize, BPE per word, post-process; decode through
// the decoder chain. Only the components real LLM tokenizers use are implemented; any other one is
// a zof::Error naming the file and the field.
//
// Input that is not valid UTF-8 is not rejected: each maximal invalid byte sequence is replaced
// by U+FFFD first (as Python's bytes.decode("utf-8", "replace") would before calling tokenizers).
// tokenizer.json's "truncation" and "padding" are ignored: zof cuts and pads sequences itself.
#include "zof/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "hf/json_depth.h"
#include "hf/unicode.h"
#include "zof/error.h"
#include "zof/input_file.h"

namespace zof {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

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

// ---- text as code points with their character classes ----------------------------------------

constexpr uint8_t kL = 1, kN = 2, kM = 4, kWS = 8;

struct CodePoints {
  std::vector<char32_t> cp;
  std::vector<uint8_t> cls;
  std::vector<size_t> offset;  // byte offset of cp[k]; offset[size()] is the byte length
  size_t size() const { return cp.size(); }
  void assign(std::string_view s) {
    cp.clear();
    cls.clear();
    offset.clear();
    for (size_t i = 0; i < s.size();) {
      offset.push_back(i);
      const char32_t c = unicode::next_code_point(s, i);
      cp.push_back(c);
      uint8_t f = 0;
      if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') f = kL;
        else if (c >= '0' && c <= '9') f = kN;
        else if (unicode::is_whitespace(c)) f = kWS;
      } else {
        if (unicode::is_letter(c)) f |= kL;
        if (unicode::is_number(c)) f |= kN;
        if (unicode::is_mark(c)) f |= kM;
        if (unicode::is_whitespace(c)) f |= kWS;
      }
      cls.push_back(f);
    }
    offset.push_back(s.size());
  }
};

// ---- the regular expressions zof implements by hand -------------------------------------------

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
const char* const kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// LLaMA-3 (digits in runs of up to 3) and Qwen2 (single digits); Qwen3.5-style adds marks to letters.
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwenMarksRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// End (code point index) of the GPT-2 regex match at i; the alternatives cover every character.
size_t match_gpt2(const CodePoints& t, size_t i) {
  const size_t n = t.size();
  const char32_t c0 = t.cp[i];
  if (c0 == '\'' && i + 1 < n) {
    const char32_t c1 = t.cp[i + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if (i + 2 < n) {
      const char32_t c2 = t.cp[i + 2];
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
    }
  }
  // " ?X+" for X = letters, numbers, others: a space joins the run that follows it.
  const size_t j = (c0 == ' ' && i + 1 < n) ? i + 1 : i;
  const uint8_t fj = t.cls[j] & (kL | kN | kWS);
  if (!(fj & kWS)) {
    size_t e = j + 1;
    while (e < n && (t.cls[e] & (kL | kN | kWS)) == fj) ++e;
    return e;
  }
  // \s+(?!\S) leaves the last space of a run for the word after it; \s+ takes a lone one.
  size_t e = i;
  while (e < n && (t.cls[e] & kWS)) ++e;
  if (e == n) return n;
  return e - i >= 2 ? e - 1 : e;
}

size_t match_llama3(const CodePoints& t, size_t i, size_t max_digits, bool marks_are_letters) {
  const size_t n = t.size();
  const char32_t c0 = t.cp[i];
  const uint8_t letter = marks_are_letters ? (kL | kM) : kL;
  const uint8_t not_other = marks_are_letters ? (kL | kM | kN | kWS) : (kL | kN | kWS);
  auto lower = [](char32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; };
  auto is_crlf = [&](size_t k) { return t.cp[k] == '\r' || t.cp[k] == '\n'; };
  if (c0 == '\'' && i + 1 < n) {  // (?i:...) folds ASCII only here, as tokenizers' Oniguruma does
    const char32_t c1 = lower(t.cp[i + 1]);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    if (i + 2 < n) {
      const char32_t c2 = lower(t.cp[i + 2]);
      if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
    }
  }
  const uint8_t f0 = t.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t start = n;
  if (!(f0 & (kL | kN)) && !is_crlf(i) && i + 1 < n && (t.cls[i + 1] & letter)) start = i + 1;
  else if (f0 & letter) start = i;
  if (start < n) {
    size_t e = start + 1;
    while (e < n && (t.cls[e] & letter)) ++e;
    return e;
  }
  // \p{N}{1,max}
  if (f0 & kN) {
    size_t e = i + 1;
    while (e < n && e - i < max_digits && (t.cls[e] & kN)) ++e;
    return e;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t j = (c0 == ' ' && i + 1 < n && !(t.cls[i + 1] & not_other)) ? i + 1 : i;
  if (!(t.cls[j] & not_other)) {
    size_t e = j + 1;
    while (e < n && !(t.cls[e] & not_other)) ++e;
    while (e < n && is_crlf(e)) ++e;
    return e;
  }
  if (!(f0 & kWS)) return i;  // unreachable: every character is a letter, number, other or space
  size_t e = i;
  while (e < n && (t.cls[e] & kWS)) ++e;
  // \s*[\r\n]+ ends at the last line break of the run.
  for (size_t k = e; k > i; --k)
    if (is_crlf(k - 1)) return k;
  if (e == n) return n;
  return e - i >= 2 ? e - 1 : e;
}

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
  void find(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
    out.clear();
    switch (kind) {
      case Kind::Literal: {
        if (literal.empty()) return;
        for (size_t p = s.find(literal); p != std::string_view::npos; p = s.find(literal, p + literal.size()))
          out.emplace_back(p, p + literal.size());
        return;
      }
      case Kind::CharRun: {
        for (size_t i = 0; i < s.size();) {
          size_t k = i, run = 0;
          while (k < s.size()) {
            size_t next = k;
            if (unicode::next_code_point(s, next) != ch) break;
            k = next;
            ++run;
          }
          if (run == 0) {
            i += unicode::utf8_length(static_cast<unsigned char>(s[i]));
            continue;
          }
          if (run < min_run) {  // no match starts anywhere inside a run that is too short
            i = k;
            continue;
          }
          // Greedy chunks of at most max_run; a short tail is left unmatched.
          const size_t width = (k - i) / run;  // bytes per character
          size_t left = run;
          while (left >= min_run) {
            const size_t take = std::min(left, max_run);
            out.emplace_back(i, i + take * width);
            i += take * width;
            left -= take;
          }
          i = k;
        }
        return;
      }
      case Kind::Gpt2:
      case Kind::Llama3: {
        thread_local CodePoints t;
        t.assign(s);
        for (size_t i = 0; i < t.size();) {
          const size_t e = kind == Kind::Gpt2 ? match_gpt2(t, i) : match_llama3(t, i, max_digits, marks_are_letters);
          if (e > i) {
            out.emplace_back(t.offset[i], t.offset[e]);
            i = e;
          } else {
            ++i;
          }
        }
        return;
      }
    }
  }
};

// Parses "c{n,}", "c{n,m}", "c{n}", "c+" for a single literal or escaped character c.
std::optional<Pattern> parse_char_run(const std::string& re) {
  static const std::string meta = "\\^$.|?*+()[]{}";
  size_t i = 0;
  if (re.empty() || unicode::valid_utf8_prefix(re) != re.size()) return std::nullopt;
  char32_t c;
  if (re[0] == '\\') {
    if (re.size() < 2 || meta.find(re[1]) == std::string::npos) return std::nullopt;
    c = static_cast<unsigned char>(re[1]);
    i = 2;
  } else {
    if (meta.find(re[0]) != std::string::npos) return std::nullopt;
    c = unicode::next_code_point(re, i);
  }
  Pattern p;
  p.kind = Pattern::Kind::CharRun;
  p.ch = c;
  const std::string q = re.substr(i);
  if (q == "+") return p;
  if (q.size() < 3 || q.front() != '{' || q.back() != '}') return std::nullopt;
  const std::string body = q.substr(1, q.size() - 2);
  const size_t comma = body.find(',');
  auto number = [](const std::string& s) -> std::optional<size_t> {
    if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), [](char d) { return d >= '0' && d <= '9'; }))
      return std::nullopt;
    return static_cast<size_t>(std::stoul(s));
  };
  const auto lo = number(comma == std::string::npos ? body : body.substr(0, comma));
  if (!lo || *lo == 0) return std::nullopt;
  p.min_run = *lo;
  if (comma == std::string::npos) {
    p.max_run = *lo;
  } else if (comma + 1 < body.size()) {
    const auto hi = number(body.substr(comma + 1));
    if (!hi || *hi < *lo) return std::nullopt;
    p.max_run = *hi;
  }
  return p;
}

Pattern parse_pattern(const Source& src, const json& j, const std::string& field) {
  Pattern p;
  if (j.is_object() && j.contains("String")) {
    p.literal = src.str(j, field, "String");
    return p;
  }
  if (!j.is_object() || !j.contains("Regex")) src.fail(field, "expected {\"String\": ...} or {\"Regex\": ...}");
  const std::string re = src.str(j, field, "Regex");
  if (re == kGpt2Regex) {
    p.kind = Pattern::Kind::Gpt2;
  } else if (re == kLlama3Regex || re == kQwen2Regex || re == kQwenMarksRegex) {
    p.kind = Pattern::Kind::Llama3;
    p.max_digits = re == kLlama3Regex ? 3 : 1;
    p.marks_are_letters = re == kQwenMarksRegex;
  } else if (re.find_first_of("\\^$.|?*+()[]{}") == std::string::npos) {
    p.literal = re;
  } else if (auto run = parse_char_run(re)) {
    p = *run;
  } else {
    src.fail(field, "regex \"" + re +
                        "\" is not one zof implements (it knows the GPT-2, LLaMA-3 and Qwen2 pre-tokenizer "
                        "regexes, literals and single-character runs such as \" {2,}\")");
  }
  return p;
}

// ---- splitting as NormalizedString::split does ------------------------------------------------

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const Source& src, const json& obj, const std::string& field) {
  const std::string b = src.str(obj, field, "behavior");
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  src.fail(field + ".behavior", "unknown split behavior \"" + b + "\"");
}

using Ranges = std::vector<std::pair<size_t, size_t>>;

// The ranges of a string of length len to keep, given the pattern's matches.
void split_ranges(size_t len, const Ranges& matches, bool invert, Behavior behavior, Ranges& out) {
  struct Part {
    size_t begin, end;
    bool match;
  };
  std::vector<Part> parts;
  if (len == 0) {
    parts.push_back({0, 0, false});
  } else {
    size_t prev = 0;
    for (auto [b, e] : matches) {
      if (prev != b) parts.push_back({prev, b, false});
      parts.push_back({b, e, true});
      prev = e;
    }
    if (prev != len) parts.push_back({prev, len, false});
  }
  if (invert)
    for (Part& p : parts) p.match = !p.match;
  out.clear();
  switch (behavior) {
    case Behavior::Isolated:
      for (const Part& p : parts) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::Removed:
      for (const Part& p : parts)
        if (!p.match) out.emplace_back(p.begin, p.end);
      break;
    case Behavior::Contiguous: {
      bool prev_match = false;
      for (const Part& p : parts) {
        if (p.match == prev_match && !out.empty()) out.back().second = p.end;
        else out.emplace_back(p.begin, p.end);
        prev_match = p.match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool prev_match = false;
      for (const Part& p : parts) {
        if (p.match && !prev_match && !out.empty()) out.back().second = p.end;
        else out.emplace_back(p.begin, p.end);
        prev_match = p.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool prev_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !prev_match && !out.empty()) out.back().first = it->begin;
        else out.emplace_back(it->begin, it->end);
        prev_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
}

// ---- normalizers ------------------------------------------------------------------------------

struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
};

struct SequenceNormalizer : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> steps;
  void apply(std::string& s) const override {
    for (const auto& n : steps) n->apply(s);
  }
};

// Trims White_Space (Rust's char::is_whitespace).
struct StripNormalizer : Normalizer {
  bool left = true, right = true;
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left) {
      while (b < e) {
        size_t k = b;
        if (!unicode::is_whitespace(unicode::next_code_point(s, k))) break;
        b = k;
      }
    }
    if (right) {
      while (e > b) {
        size_t k = e - 1;
        while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t tmp = k;
        if (!unicode::is_whitespace(unicode::next_code_point(s, tmp))) break;
        e = k;
      }
    }
    s = s.substr(b, e - b);
  }
};

std::string replace_all(const std::string& s, const Pattern& pattern, const std::string& content) {
  thread_local Ranges matches;
  pattern.find(s, matches);
  if (matches.empty()) return s;
  std::string out;
  out.reserve(s.size());
  size_t prev = 0;
  for (auto [b, e] : matches) {
    out.append(s, prev, b - prev);
    out += content;
    prev = e;
  }
  out.append(s, prev, std::string::npos);
  return out;
}

struct ReplaceNormalizer : Normalizer {
  Pattern pattern;
  std::string content;
  void apply(std::string& s) const override { s = replace_all(s, pattern, content); }
};

struct PrependNormalizer : Normalizer {
  std::string prefix;
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix);
  }
};

struct UnicodeNormalizer : Normalizer {
  unicode::NormalForm form;
  explicit UnicodeNormalizer(unicode::NormalForm f) : form(f) {}
  void apply(std::string& s) const override { s = unicode::normalize(s, form); }
};

struct LowercaseNormalizer : Normalizer {
  void apply(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) unicode::append_lowercase(out, unicode::next_code_point(s, i));
    s.swap(out);
  }
};

std::unique_ptr<Normalizer> parse_normalizer(const Source& src, const json& j, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = src.str(j, field, "type");
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceNormalizer>();
    const json& list = src.at(j, field, "normalizers");
    if (!list.is_array()) src.fail(field + ".normalizers", "expected a list");
    for (size_t k = 0; k < list.size(); ++k) {
      auto n = parse_normalizer(src, list[k], field + ".normalizers[" + std::to_string(k) + "]");
      if (n) seq->steps.push_back(std::move(n));
    }
    return seq;
  }
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = src.flag(j, field, "strip_left", true);
    n->right = src.flag(j, field, "strip_right", true);
    return n;
  }
  if (type == "Replace") {
    auto n = std::make_unique<ReplaceNormalizer>();
    n->pattern = parse_pattern(src, src.at(j, field, "pattern"), field + ".pattern");
    n->content = src.str(j, field, "content");
    return n;
  }
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prefix = src.str(j, field, "prepend");
    return n;
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(unicode::NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  src.fail(field + ".type", "normalizer \"" + type +
                                "\" is not supported (zof implements Sequence, Strip, Replace, Prepend, NFC, "
                                "NFD, NFKC, NFKD, Lowercase)");
}

// ---- pre-tokenizers ---------------------------------------------------------------------------

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

// Replaces each text piece by the non-empty pieces split(piece, out) makes of it.
template <class Fn>
void split_pieces(std::vector<Piece>& pieces, Fn&& split) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (Piece& p : pieces) {
    if (p.id >= 0) out.push_back(std::move(p));
    else split(p, out);
  }
  pieces.swap(out);
}

void push_ranges(const Piece& p, const std::string& text, const Ranges& ranges, std::vector<Piece>& out) {
  for (auto [b, e] : ranges) {
    if (b == e) continue;
    out.push_back(Piece{text.substr(b, e - b), -1, p.at_origin && b == 0});
  }
}

struct SequencePreTokenizer : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps) s->apply(pieces);
  }
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
const ByteChars& byte_chars() {
  static const ByteChars table;
  return table;
}

struct ByteLevelPreTokenizer : PreTokenizer {
  bool add_prefix_space = true;
  bool use_regex = true;
  Pattern regex;
  ByteLevelPreTokenizer() { regex.kind = Pattern::Kind::Gpt2; }
  void apply(std::vector<Piece>& pieces) const override {
    const ByteChars& bc = byte_chars();
    Ranges matches, ranges;
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
      if (use_regex) {
        regex.find(p.text, matches);
        split_ranges(p.text.size(), matches, false, Behavior::Isolated, ranges);
      } else {
        ranges.assign(1, {0, p.text.size()});
      }
      for (auto [b, e] : ranges) {
        if (b == e) continue;
        Piece q{std::string(), -1, p.at_origin && b == 0};
        q.text.reserve(2 * (e - b));
        for (size_t k = b; k < e; ++k) q.text += bc.utf8[static_cast<unsigned char>(p.text[k])];
        out.push_back(std::move(q));
      }
    });
  }
};

struct SplitPreTokenizer : PreTokenizer {
  Pattern pattern;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  void apply(std::vector<Piece>& pieces) const override {
    Ranges matches, ranges;
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      pattern.find(p.text, matches);
      split_ranges(p.text.size(), matches, invert, behavior, ranges);
      push_ranges(p, p.text, ranges, out);
    });
  }
};

enum class PrependScheme { Always, First, Never };

PrependScheme parse_prepend_scheme(const Source& src, const json& j, const std::string& field) {
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s = src.str(j, field, "prepend_scheme");
    if (s == "always") return PrependScheme::Always;
    if (s == "first") return PrependScheme::First;
    if (s == "never") return PrependScheme::Never;
    src.fail(field + ".prepend_scheme", "unknown value \"" + s + "\" (expected always, first or never)");
  }
  return src.flag(j, field, "add_prefix_space", true) ? PrependScheme::Always : PrependScheme::Never;
}

struct MetaspacePreTokenizer : PreTokenizer {
  std::string replacement;
  PrependScheme scheme = PrependScheme::Always;
  bool split = true;
  void apply(std::vector<Piece>& pieces) const override {
    Pattern space, marker;
    space.literal = " ";
    marker.literal = replacement;
    Ranges matches, ranges;
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      std::string s = replace_all(p.text, space, replacement);
      const bool starts = s.compare(0, replacement.size(), replacement) == 0;
      if (!starts && (scheme == PrependScheme::Always || (scheme == PrependScheme::First && p.at_origin)))
        s.insert(0, replacement);
      if (split) {
        marker.find(s, matches);
        split_ranges(s.size(), matches, false, Behavior::MergedWithNext, ranges);
      } else {
        ranges.assign(1, {0, s.size()});
      }
      push_ranges(p, s, ranges, out);
    });
  }
};

// Splits on a character class (Rust's char::is_numeric or char::is_whitespace).
struct CharClassPreTokenizer : PreTokenizer {
  bool digits = false;  // else whitespace
  Behavior behavior = Behavior::Removed;
  void apply(std::vector<Piece>& pieces) const override {
    Ranges matches, ranges;
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      matches.clear();
      for (size_t i = 0; i < p.text.size();) {
        const size_t b = i;
        const char32_t c = unicode::next_code_point(p.text, i);
        if (digits ? unicode::is_numeric(c) : unicode::is_whitespace(c)) matches.emplace_back(b, i);
      }
      split_ranges(p.text.size(), matches, false, behavior, ranges);
      push_ranges(p, p.text, ranges, out);
    });
  }
};

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Source& src, const json& j, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = src.str(j, field, "type");
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePreTokenizer>();
    const json& list = src.at(j, field, "pretokenizers");
    if (!list.is_array()) src.fail(field + ".pretokenizers", "expected a list");
    for (size_t k = 0; k < list.size(); ++k) {
      auto p = parse_pre_tokenizer(src, list[k], field + ".pretokenizers[" + std::to_string(k) + "]");
      if (p) seq->steps.push_back(std::move(p));
    }
    return seq;
  }
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = src.flag(j, field, "add_prefix_space", true);
    p->use_regex = src.flag(j, field, "use_regex", true);
    return p;
  }
  if (type == "Split") {
    auto p = std::make_unique<SplitPreTokenizer>();
    p->pattern = parse_pattern(src, src.at(j, field, "pattern"), field + ".pattern");
    p->behavior = parse_behavior(src, j, field);
    p->invert = src.flag(j, field, "invert", false);
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    p->replacement = src.str(j, field, "replacement");
    src.one_char(p->replacement, field + ".replacement");
    p->scheme = parse_prepend_scheme(src, j, field);
    p->split = src.flag(j, field, "split", true);
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<CharClassPreTokenizer>();
    p->digits = true;
    p->behavior = src.flag(j, field, "individual_digits", false) ? Behavior::Isolated : Behavior::Contiguous;
    return p;
  }
  if (type == "WhitespaceSplit") return std::make_unique<CharClassPreTokenizer>();
  src.fail(field + ".type", "pre-tokenizer \"" + type +
                                "\" is not supported (zof implements Sequence, ByteLevel, Split, Metaspace, "
                                "Digits, WhitespaceSplit)");
}

// ---- BPE model --------------------------------------------------------------------------------

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

void Bpe::load(const Source& src, const json& model) {
  file = src.file;
  const json& v = src.at(model, "model", "vocab");
  if (!v.is_object()) src.fail("model.vocab", "expected an object of token: id");
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it)
    vocab[it.key()] = src.token_id(it.value(), "model.vocab[\"" + it.key() + "\"]");
  auto optional_string = [&](const char* key) -> std::optional<std::string> {
    if (!model.contains(key) || model[key].is_null()) return std::nullopt;
    return src.str(model, "model", key);
  };
  unk_token = optional_string("unk_token");
  prefix = optional_string("continuing_subword_prefix").value_or("");
  suffix = optional_string("end_of_word_suffix").value_or("");
  fuse_unk = src.flag(model, "model", "fuse_unk", false);
  byte_fallback = src.flag(model, "model", "byte_fallback", false);
  ignore_merges = src.flag(model, "model", "ignore_merges", false);
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    if (!model["dropout"].is_number()) src.fail("model.dropout", "expected a number or null");
    if (model["dropout"].get<double>() > 0.0)
      src.fail("model.dropout", "BPE dropout is for training; set it to null to tokenize deterministically");
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto it = vocab.find(std::string_view(name));
    byte_ids_[b] = it == vocab.end() ? -1 : it->second;
  }

  const json& m = model.contains("merges") ? model["merges"] : json::array();
  if (!m.is_array()) src.fail("model.merges", "expected a list");
  merges_.reserve(m.size());
  auto id_of = [&](const std::string& tok, size_t rank) {
    const auto it = vocab.find(tok);
    if (it == vocab.end())
      src.fail("model.merges[" + std::to_string(rank) + "]", "token \"" + tok + "\" is not in model.vocab");
    return it->second;
  };
  for (size_t rank = 0; rank < m.size(); ++rank) {
    const json& e = m[rank];
    std::string a, b;
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        src.fail("model.merges[" + std::to_string(rank) + "]", "expected two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      src.fail("model.merges[" + std::to_string(rank) + "]", "expected \"a b\" or [\"a\", \"b\"]");
    }
    const std::string merged = a + b.substr(std::min(prefix.size(), b.size()));
    merges_[pair_key(id_of(a, rank), id_of(b, rank))] = {static_cast<int32_t>(rank), id_of(merged, rank)};
  }
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    const auto it = vocab.find(word);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (word.size() > kMaxCachedWord) return;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  if (cache_.size() >= kCacheCapacity) cache_.clear();
  cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<long>(first), out.end()));
}

// Word::merge_all of tokenizers: apply the lowest-ranked merge present, leftmost first, until none
// applies; a heap of candidate merges over a linked list of symbols, stale entries skipped.
void Bpe::initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
  thread_local std::string key;
  symbols.clear();
  auto add = [&](int32_t id, size_t len) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  int32_t unk_id = -1;  // pending unknown token, if >= 0, and its byte length
  size_t unk_len = 0;
  for (size_t i = 0; i < word.size();) {
    const size_t len = unicode::utf8_length(static_cast<unsigned char>(word[i]));
    const bool is_first = i == 0, is_last = i + len >= word.size();
    std::string_view s = word.substr(i, len);
    if ((!is_first && !prefix.empty()) || (is_last && !suffix.empty())) {
      key.assign(is_first ? "" : prefix);
      key.append(s);
      if (is_last) key.append(suffix);
      s = key;
    }
    i += len;
    if (const auto it = vocab.find(s); it != vocab.end()) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(it->second, len);
      continue;
    }
    if (byte_fallback &&
        std::all_of(s.begin(), s.end(), [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; })) {
      for (char c : s) add(byte_ids_[static_cast<unsigned char>(c)], 1);
      continue;
    }
    if (unk_token) {
      const auto it = vocab.find(*unk_token);
      if (it == vocab.end()) throw Error(file + ": model.unk_token \"" + *unk_token + "\" is not in model.vocab");
      if (unk_id >= 0 && fuse_unk) {
        unk_len += len;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = it->second;
        unk_len = len;
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  heap.clear();
  initial_symbols(word, symbols);

  auto lookup = [&](int32_t a, int32_t b) -> const MergeInfo* {
    const auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  auto push = [&](int32_t pos, const MergeInfo& m) {
    heap.push_back({m.rank, pos, m.new_id});
    std::push_heap(heap.begin(), heap.end(), std::greater<Candidate>());
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k)
    if (const MergeInfo* m = lookup(symbols[k].id, symbols[k + 1].id)) push(static_cast<int32_t>(k), *m);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Candidate>());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    const Symbol right = symbols[static_cast<size_t>(cur.next)];
    const MergeInfo* m = lookup(cur.id, right.id);
    if (!m || m->new_id != top.new_id) continue;  // stale: a neighbour changed since it was queued
    symbols[static_cast<size_t>(cur.next)].len = 0;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0)
      if (const MergeInfo* pm = lookup(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) push(cur.prev, *pm);
    if (cur.next >= 0)
      if (const MergeInfo* nm = lookup(cur.id, symbols[static_cast<size_t>(cur.next)].id)) push(top.pos, *nm);
  }
  for (const Symbol& s : symbols)
    if (s.len != 0) out.push_back(s.id);
}

// ---- added tokens -----------------------------------------------------------------------------

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

void AddedTokenMatcher::build() {
  // In byte order (std::string compares as unsigned char) the patterns below one trie node are
  // a contiguous range, the one ending at the node first. Stable: of equal patterns (two tokens
  // that normalize alike) the first added comes first and wins.
  std::vector<uint32_t> order(entries_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return entries_[a].pattern < entries_[b].pattern; });
  auto pattern = [&](size_t k) -> const std::string& { return entries_[order[k]].pattern; };
  nodes_.assign(1, Node{});
  edge_byte_.clear();
  edge_child_.clear();
  // The nodes still to fill, on a stack rather than by recursion (a pattern may be megabytes
  // long): the patterns under a node at depth d are order[lo, hi), sharing their first d bytes.
  // A node's edges are made at once, so they are contiguous.
  struct Range {
    uint32_t node;
    size_t lo, hi, depth;
  };
  std::vector<Range> todo{{0, 0, order.size(), 0}};
  while (!todo.empty()) {
    auto [node, lo, hi, depth] = todo.back();
    todo.pop_back();
    if (lo < hi && pattern(lo).size() == depth) nodes_[node].entry = static_cast<int32_t>(order[lo]);
    while (lo < hi && pattern(lo).size() == depth) ++lo;
    nodes_[node].first_edge = static_cast<uint32_t>(edge_byte_.size());
    while (lo < hi) {
      const char byte = pattern(lo)[depth];
      size_t end = lo + 1;
      while (end < hi && pattern(end)[depth] == byte) ++end;
      const auto next = static_cast<uint32_t>(nodes_.size());
      edge_byte_.push_back(static_cast<uint8_t>(byte));
      edge_child_.push_back(next);
      nodes_.emplace_back();
      todo.push_back({next, lo, end, depth + 1});
      lo = end;
    }
    nodes_[node].end_edge = static_cast<uint32_t>(edge_byte_.size());
  }
  root_child_.fill(0);
  for (uint32_t e = nodes_[0].first_edge; e < nodes_[0].end_edge; ++e) root_child_[edge_byte_[e]] = edge_child_[e];
}

uint32_t AddedTokenMatcher::child(uint32_t node, unsigned char byte) const {
  const auto first = edge_byte_.begin() + nodes_[node].first_edge, last = edge_byte_.begin() + nodes_[node].end_edge;
  const auto it = std::lower_bound(first, last, byte);
  return it != last && *it == byte ? edge_child_[static_cast<size_t>(it - edge_byte_.begin())] : 0;
}

// The longest pattern that s has at pos (nullptr: none): down the trie along s, keeping the
// last node a pattern ends at.
const AddedTokenMatcher::Entry* AddedTokenMatcher::longest_match(std::string_view s, size_t pos) const {
  const Entry* found = nullptr;
  for (uint32_t node = root_child_[static_cast<unsigned char>(s[pos])]; node != 0;) {
    if (nodes_[node].entry >= 0) found = &entries_[static_cast<size_t>(nodes_[node].entry)];
    if (++pos == s.size()) break;
    node = child(node, static_cast<unsigned char>(s[pos]));
  }
  return found;
}

char32_t last_char(std::string_view s) {
  size_t k = s.size() - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  return unicode::next_code_point(s, k);
}

void AddedTokenMatcher::split(std::string_view s, std::vector<Split>& out) const {
  out.clear();
  if (s.empty() || entries_.empty()) {
    out.push_back({0, s.size(), -1});
    return;
  }
  size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    const Entry* found = nullptr;
    size_t mstart = pos;
    for (; mstart < s.size(); ++mstart)
      if ((found = longest_match(s, mstart))) break;
    if (!found) break;
    size_t start = mstart, stop = mstart + found->pattern.size();
    pos = stop;  // the search resumes after the match itself, whatever lstrip/rstrip take
    const AddedToken& tok = *found->token;
    if (tok.single_word) {  // no \w character (Rust regex) right before or after
      const bool start_space = start == 0 || !unicode::is_word_char(last_char(s.substr(0, start)));
      size_t k = stop;
      const bool stop_space = stop == s.size() || !unicode::is_word_char(unicode::next_code_point(s, k));
      if (!start_space || !stop_space) continue;
    }
    if (tok.lstrip) {
      size_t b = start;
      while (b > 0) {
        size_t k = b - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t tmp = k;
        if (!unicode::is_whitespace(unicode::next_code_point(s, tmp))) break;
        b = k;
      }
      start = std::max(b, start_offset);
    }
    if (tok.rstrip) {
      while (stop < s.size()) {
        size_t k = stop;
        if (!unicode::is_whitespace(unicode::next_code_point(s, k))) break;
        stop = k;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset != s.size()) out.push_back({start_offset, s.size(), -1});
}

// ---- post-processors --------------------------------------------------------------------------

struct PostProcessor {
  virtual ~PostProcessor() = default;
  virtual void apply(std::vector<int32_t>& ids) const = 0;
  // The largest id apply() may add (-1: none).
  virtual int32_t max_id() const = 0;
};

// TemplateProcessing's single template, and Bert/RobertaProcessing ([cls] A [sep]).
struct TemplatePostProcessor : PostProcessor {
  std::vector<std::optional<std::vector<int32_t>>> items;  // nullopt: the sequence itself
  void apply(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& item : items) {
      if (item) out.insert(out.end(), item->begin(), item->end());
      else out.insert(out.end(), ids.begin(), ids.end());
    }
    ids.swap(out);
  }
  int32_t max_id() const override {
    int32_t m = -1;
    for (const auto& item : items)
      if (item)
        for (const int32_t id : *item) m = std::max(m, id);
    return m;
  }
};

struct SequencePostProcessor : PostProcessor {
  std::vector<std::unique_ptr<PostProcessor>> steps;
  void apply(std::vector<int32_t>& ids) const override {
    for (const auto& s : steps) s->apply(ids);
  }
  int32_t max_id() const override {
    int32_t m = -1;
    for (const auto& s : steps) m = std::max(m, s->max_id());
    return m;
  }
};

std::unique_ptr<PostProcessor> parse_post_processor(const Source& src, const json& j, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = src.str(j, field, "type");
  if (type == "ByteLevel") return nullptr;  // only adjusts offsets
  if (type == "Sequence") {
    auto seq = std::make_unique<SequencePostProcessor>();
    const json& list = src.at(j, field, "processors");
    if (!list.is_array()) src.fail(field + ".processors", "expected a list");
    for (size_t k = 0; k < list.size(); ++k) {
      auto p = parse_post_processor(src, list[k], field + ".processors[" + std::to_string(k) + "]");
      if (p) seq->steps.push_back(std::move(p));
    }
    return seq;
  }
  if (type == "TemplateProcessing") {
    auto t = std::make_unique<TemplatePostProcessor>();
    const json& single = src.at(j, field, "single");
    const json& specials = j.contains("special_tokens") ? j["special_tokens"] : json::object();
    if (!single.is_array()) src.fail(field + ".single", "expected a list");
    for (size_t k = 0; k < single.size(); ++k) {
      const std::string f = field + ".single[" + std::to_string(k) + "]";
      const json& item = single[k];
      if (item.is_object() && item.contains("Sequence")) {
        const std::string seq = src.str(item["Sequence"], f + ".Sequence", "id");
        if (seq != "A") src.fail(f, "the single-sequence template refers to sequence " + seq);
        t->items.emplace_back(std::nullopt);
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name = src.str(item["SpecialToken"], f + ".SpecialToken", "id");
        if (!specials.contains(name)) src.fail(field + ".special_tokens", "no entry for \"" + name + "\"");
        const json& ids = src.at(specials[name], field + ".special_tokens[\"" + name + "\"]", "ids");
        if (!ids.is_array()) src.fail(field + ".special_tokens[\"" + name + "\"].ids", "expected a list");
        std::vector<int32_t> v;
        for (const json& id : ids) v.push_back(src.token_id(id, field + ".special_tokens[\"" + name + "\"].ids"));
        t->items.emplace_back(std::move(v));
      } else {
        src.fail(f, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    return t;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto t = std::make_unique<TemplatePostProcessor>();
    auto token = [&](const char* key) {
      const json& v = src.at(j, field, key);
      if (!v.is_array() || v.size() != 2) src.fail(field + "." + key, "expected [token, id]");
      return std::vector<int32_t>{src.token_id(v[1], field + "." + key + "[1]")};
    };
    t->items.emplace_back(token("cls"));
    t->items.emplace_back(std::nullopt);
    t->items.emplace_back(token("sep"));
    return t;
  }
  src.fail(field + ".type", "post-processor \"" + type +
                                "\" is not supported (zof implements TemplateProcessing, ByteLevel, Sequence, "
                                "BertProcessing, RobertaProcessing)");
}

// ---- decoders ---------------------------------------------------------------------------------

struct Decoder {
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};

struct SequenceDecoder : Decoder {
  std::vector<std::unique_ptr<Decoder>> steps;
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& s : steps) s->apply(tokens);
  }
};

// Maps each token's characters back to bytes (a token with a character outside the table keeps
// its own UTF-8), then reads all bytes as UTF-8 with U+FFFD for invalid sequences.
struct ByteLevelDecoder : Decoder {
  void apply(std::vector<std::string>& tokens) const override {
    const ByteChars& bc = byte_chars();
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < t.size();) {
        const char32_t c = unicode::next_code_point(t, i);
        if (c >= bc.byte_of.size() || bc.byte_of[c] < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(bc.byte_of[c]));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, unicode::to_valid_utf8(bytes));
  }
};

struct ReplaceDecoder : Decoder {
  Pattern pattern;
  std::string content;
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) t = replace_all(t, pattern, content);
  }
};

// Runs of <0xAB> tokens become their bytes when those are valid UTF-8, else one U+FFFD per byte.
struct ByteFallbackDecoder : Decoder {
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // u8::from_str_radix(&token[3..5], 16), which also accepts a leading '+'.
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    if (t[3] == '+') return hex(t[4]);
    const int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (unicode::valid_utf8_prefix(pending) == pending.size()) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      const int b = byte_of(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

struct FuseDecoder : Decoder {
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character from each token.
struct StripDecoder : Decoder {
  char32_t content = ' ';
  size_t start = 0, stop = 0;
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      std::vector<size_t> offs;  // character starts, then the end
      std::vector<char32_t> cps;
      for (size_t i = 0; i < t.size();) {
        offs.push_back(i);
        cps.push_back(unicode::next_code_point(t, i));
      }
      offs.push_back(t.size());
      size_t b = 0, e = cps.size();
      while (b < start && b < cps.size() && cps[b] == content) ++b;
      for (size_t k = 0; k < stop && e > 0 && cps[e - 1] == content; ++k) --e;
      t = e > b ? t.substr(offs[b], offs[e] - offs[b]) : std::string();
    }
  }
};

struct MetaspaceDecoder : Decoder {
  std::string replacement;
  PrependScheme scheme = PrependScheme::Always;
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const bool drop = i == 0 && scheme != PrependScheme::Never;  // every marker of the first token
      std::string out;
      const std::string& t = tokens[i];
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, replacement.size(), replacement) == 0) {
          if (!drop) out.push_back(' ');
          k += replacement.size();
        } else {
          const size_t len = unicode::utf8_length(static_cast<unsigned char>(t[k]));
          out.append(t, k, len);
          k += len;
        }
      }
      tokens[i] = std::move(out);
    }
  }
};

// BPEDecoder: the end-of-word suffix becomes a space, except in the last token.
struct SuffixDecoder : Decoder {
  std::string suffix;
  void apply(std::vector<std::string>& tokens) const override {
    Pattern p;
    p.literal = suffix;
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = replace_all(tokens[i], p, i + 1 == tokens.size() ? "" : " ");
  }
};

std::unique_ptr<Decoder> parse_decoder(const Source& src, const json& j, const std::string& field) {
  if (j.is_null()) return nullptr;
  const std::string type = src.str(j, field, "type");
  if (type == "Sequence") {
    auto seq = std::make_unique<SequenceDecoder>();
    const json& list = src.at(j, field, "decoders");
    if (!list.is_array()) src.fail(field + ".decoders", "expected a list");
    for (size_t k = 0; k < list.size(); ++k) {
      auto d = parse_decoder(src, list[k], field + ".decoders[" + std::to_string(k) + "]");
      if (d) seq->steps.push_back(std::move(d));
    }
    return seq;
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Replace") {
    auto d = std::make_unique<ReplaceDecoder>();
    d->pattern = parse_pattern(src, src.at(j, field, "pattern"), field + ".pattern");
    d->content = src.str(j, field, "content");
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    d->content = src.one_char(src.str(j, field, "content"), field + ".content");
    const int64_t start = src.integer(src.at(j, field, "start"), field + ".start");
    const int64_t stop = src.integer(src.at(j, field, "stop"), field + ".stop");
    if (start < 0 || stop < 0) src.fail(field, "start and stop must be >= 0");
    d->start = static_cast<size_t>(start);
    d->stop = static_cast<size_t>(stop);
    return d;
  }
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = src.str(j, field, "replacement");
    src.one_char(d->replacement, field + ".replacement");
    d->scheme = parse_prepend_scheme(src, j, field);
    return d;
  }
  if (type == "BPEDecoder") {
    auto d = std::make_unique<SuffixDecoder>();
    d->suffix = j.contains("suffix") ? src.str(j, field, "suffix") : "</w>";
    return d;
  }
  src.fail(field + ".type", "decoder \"" + type +
                                "\" is not supported (zof implements Sequence, ByteLevel, Replace, ByteFallback, "
                                "Fuse, Strip, Metaspace, BPEDecoder)");
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
  void load_special_ids(const std::string& dir);
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
  const fs::path path = fs::path(dir) / "tokenizer.json";
  std::error_code ec;
  if (!fs::exists(path, ec) && !ec)
    throw Error(path.string() + ": not found; zof needs a Hugging Face tokenizer.json (a tokenizer.model or "
                                "vocab.json alone is not enough: convert it with transformers' "
                                "AutoTokenizer.from_pretrained(...).save_pretrained(dir))");
  const Source src{path.string()};
  const json j = read_json(path);
  if (!j.is_object()) src.fail("(top level)", "expected a JSON object");
  Tokenizer tok;
  Impl& im = *tok.impl_;
  im.path = path.string();

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
  im.load_special_ids(dir);
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
void Tokenizer::Impl::load_special_ids(const std::string& dir) {
  std::vector<std::pair<Source, json>> configs;
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path p = fs::path(dir) / name;
    std::error_code ec;
    if (fs::exists(p, ec) || ec) configs.emplace_back(Source{p.string()}, read_json(p));
  }
  auto resolve = [&](const char* key) -> int32_t {
    for (const auto& [csrc, cfg] : configs) {
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
