// Decoders of tokenizer.json (the tokenizers library's decoders/): Sequence, ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Metaspace and BPEDecoder.
#include <memory>

#include "hf/tokenizer_parts.h"
#include "hf/unicode.h"

namespace zof::tok {
namespace {

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

}  // namespace

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

}  // namespace zof::tok
