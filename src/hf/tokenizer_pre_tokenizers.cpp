// Pre-tokenizers of tokenizer.json (the tokenizers library's pre_tokenizers/): Sequence,
// ByteLevel (with GPT-2's byte-to-character table, which its decoder shares), Split, Metaspace,
// Digits and WhitespaceSplit.
#include <memory>

#include "hf/tokenizer_parts.h"
#include "hf/unicode.h"

namespace zof::tok {

const ByteChars& byte_chars() {
  static const ByteChars table;
  return table;
}

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

namespace {

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

struct ByteLevelPreTokenizer : PreTokenizer {
  bool add_prefix_space = true;
  bool use_regex = true;
  Pattern regex;
  ByteLevelPreTokenizer() { regex.kind = Pattern::Kind::Gpt2; }
  void apply(std::vector<Piece>& pieces) const override {
    const ByteChars& bc = byte_chars();
    Ranges matches, ranges;
    split_pieces(pieces, [&](Piece& p, std::vector<Piece>& out) {
      // A char, not the string " ": GCC 12 warns (-Wrestrict, a false positive) on insert(0, " ").
      if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(p.text.begin(), ' ');
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

}  // namespace

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

}  // namespace zof::tok
