// Unicode lookups for the tokenizer over the generated tables in unicode_tables.inc.
#include "hf/unicode.h"

#include <algorithm>
#include <vector>

namespace zof::unicode {
namespace tables {

struct Range {
  char32_t first, last;
  uint8_t value;
};
struct Mapping {
  char32_t cp;
  uint32_t offset;
  uint32_t length;
};
struct Composition {
  char32_t first, second, composite;
};

#include "hf/unicode_tables.inc"

}  // namespace tables
namespace {

constexpr uint8_t kLetter = 1, kNumber = 2, kWord = 4, kMark = 8, kNumeric = 16;

template <size_t N>
uint8_t range_lookup(const tables::Range (&ranges)[N], char32_t c) {
  const tables::Range* end = ranges + N;
  const tables::Range* it =
      std::upper_bound(ranges, end, c, [](char32_t v, const tables::Range& r) { return v < r.first; });
  if (it == ranges) return 0;
  --it;
  return c <= it->last ? it->value : 0;
}

uint8_t ascii_flags(char32_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return kLetter | kWord;
  if (c >= '0' && c <= '9') return kNumber | kWord | kNumeric;
  return c == '_' ? kWord : 0;
}

uint8_t category_flags(char32_t c) {
  if (c < 0x80) return ascii_flags(c);
  return range_lookup(tables::kCategories, c);
}

template <size_t N, size_t M>
bool mapping_lookup(const tables::Mapping (&map)[N], const char32_t (&data)[M], char32_t c,
                    const char32_t** out, size_t* len) {
  const tables::Mapping* end = map + N;
  const tables::Mapping* it =
      std::lower_bound(map, end, c, [](const tables::Mapping& m, char32_t v) { return m.cp < v; });
  if (it == end || it->cp != c) return false;
  *out = data + it->offset;
  *len = it->length;
  return true;
}

// Hangul syllables decompose and compose by formula (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t c) { return c < 0x300 ? 0 : range_lookup(tables::kCombiningClass, c); }

void decompose(char32_t c, bool compat, std::u32string& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const char32_t* seq = nullptr;
  size_t len = 0;
  const bool found = c >= 0xA0 && (compat ? mapping_lookup(tables::kCompatDecomposition,
                                                           tables::kCompatDecompositionData, c, &seq, &len)
                                          : mapping_lookup(tables::kCanonicalDecomposition,
                                                           tables::kCanonicalDecompositionData, c, &seq, &len));
  if (found)
    out.append(seq, len);
  else
    out.push_back(c);
}

char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* begin = std::begin(tables::kCompositions);
  const auto* end = std::end(tables::kCompositions);
  const auto* it = std::lower_bound(begin, end, std::pair{a, b}, [](const tables::Composition& x, auto key) {
    return x.first != key.first ? x.first < key.first : x.second < key.second;
  });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

}  // namespace

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Number of bytes of the well-formed sequence at s[i], or -k where k >= 1 is the length of the
// maximal invalid subpart to replace with one U+FFFD (Unicode 15 section 3.9, "U+FFFD
// substitution of maximal subparts").
long sequence_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char b0 = b(0);
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return -static_cast<long>(k);
    const unsigned char c = b(k);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return -static_cast<long>(k);
  }
  return static_cast<long>(need + 1);
}

}  // namespace

size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const long n = sequence_at(s, i);
    if (n < 0) return i;
    i += static_cast<size_t>(n);
  }
  return i;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t i = 0;
  while (i < s.size()) {
    const long n = sequence_at(s, i);
    if (n > 0) {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      append_utf8(out, kReplacementChar);
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

bool is_letter(char32_t c) { return category_flags(c) & kLetter; }
bool is_number(char32_t c) { return category_flags(c) & kNumber; }
bool is_mark(char32_t c) { return category_flags(c) & kMark; }
bool is_word_char(char32_t c) { return category_flags(c) & kWord; }
bool is_numeric(char32_t c) { return category_flags(c) & kNumeric; }

void append_lowercase(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
    return;
  }
  const char32_t* seq = nullptr;
  size_t len = 0;
  if (mapping_lookup(tables::kLowercase, tables::kLowercaseData, c, &seq, &len)) {
    for (size_t k = 0; k < len; ++k) append_utf8(out, seq[k]);
  } else {
    append_utf8(out, c);
  }
}

std::string normalize(std::string_view s, NormalForm form) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(s);
  const bool compat = form == NormalForm::NFKC || form == NormalForm::NFKD;
  const bool compose = form == NormalForm::NFC || form == NormalForm::NFKC;
  std::u32string cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) decompose(next_code_point(s, i), compat, cps);
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<long>(i), cps.begin() + static_cast<long>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  if (compose && !cps.empty()) {
    std::u32string out;
    out.reserve(cps.size());
    long starter = -1;  // index in out of the last starter, if nothing blocks it
    int last_class = -1;
    for (char32_t c : cps) {
      const int cc = combining_class(c);
      // Not blocked: nothing between the starter and c has a class >= c's (last_class == 0 means
      // c directly follows the starter).
      if (starter >= 0 && (last_class < cc || last_class == 0)) {
        if (const char32_t comp = compose_pair(out[static_cast<size_t>(starter)], c)) {
          out[static_cast<size_t>(starter)] = comp;
          continue;
        }
      }
      if (cc == 0) starter = static_cast<long>(out.size());
      last_class = cc;
      out.push_back(c);
    }
    cps.swap(out);
  }
  std::string result;
  result.reserve(s.size());
  for (char32_t c : cps) append_utf8(result, c);
  return result;
}

const char* tables_version() { return tables::kUnicodeVersion; }

}  // namespace zof::unicode
