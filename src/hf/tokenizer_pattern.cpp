// The patterns of tokenizer.json (String or Regex, for Split and Replace) as the tokenizers
// library's tokenizer/pattern.rs finds them, with the regexes zof implements by hand, and
// splitting and replacing by their matches as its NormalizedString does (tokenizer/normalizer.rs).
#include <algorithm>
#include <optional>

#include "hf/tokenizer_parts.h"
#include "hf/unicode.h"

namespace zof::tok {
namespace {

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

}  // namespace

// ---- patterns: a String or a Regex ------------------------------------------------------------

// Non-overlapping matches, leftmost first, as byte ranges into s.
void Pattern::find(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
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

Behavior parse_behavior(const Source& src, const json& obj, const std::string& field) {
  const std::string b = src.str(obj, field, "behavior");
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  src.fail(field + ".behavior", "unknown split behavior \"" + b + "\"");
}

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

// ---- replacing as NormalizedString::replace does ----------------------------------------------

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

}  // namespace zof::tok
