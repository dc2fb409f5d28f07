// Normalizers of tokenizer.json (the tokenizers library's normalizers/): Sequence, Strip,
// Replace, Prepend, NFC/NFD/NFKC/NFKD and Lowercase.
#include <memory>

#include "hf/tokenizer_parts.h"
#include "hf/unicode.h"

namespace zof::tok {
namespace {

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

}  // namespace

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

}  // namespace zof::tok
