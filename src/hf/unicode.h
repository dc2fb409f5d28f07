// Unicode support for the tokenizer: UTF-8 decoding with replacement of invalid bytes, the
// character classes the pre-tokenizer regexes use, lowercase, and NFC/NFD/NFKC/NFKD.
// Data comes from src/hf/unicode_tables.inc (scripts/gen_unicode_tables.py).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zof::unicode {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point at s[i] and advances i past it. s must be valid UTF-8 (see to_valid_utf8).
inline char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  auto cont = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F); };
  char32_t cp;
  if (b0 < 0xE0) {
    cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | cont(1);
    i += 2;
  } else if (b0 < 0xF0) {
    cp = (static_cast<char32_t>(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    i += 3;
  } else {
    cp = (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
    i += 4;
  }
  return cp;
}

// Byte length of the UTF-8 sequence that starts with lead byte b (valid UTF-8 assumed).
inline size_t utf8_length(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

void append_utf8(std::string& out, char32_t cp);

// Length of the longest valid UTF-8 prefix of s.
size_t valid_utf8_prefix(std::string_view s);
// s with each maximal invalid subsequence replaced by U+FFFD, as Rust's String::from_utf8_lossy
// and Python's bytes.decode("utf-8", "replace") do.
std::string to_valid_utf8(std::string_view s);

// General categories L*, N*, M*; White_Space (what \s means in Oniguruma and Rust's
// char::is_whitespace); \w of Rust's regex crate (Alphabetic, M*, Pc, Nd, Join_Control).
bool is_letter(char32_t c);
bool is_number(char32_t c);
bool is_mark(char32_t c);
bool is_word_char(char32_t c);
// Rust's char::is_numeric (N*), which may know characters newer than is_number's.
bool is_numeric(char32_t c);
inline bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Appends the lowercase of c (one or more code points, as Rust's char::to_lowercase).
void append_lowercase(std::string& out, char32_t c);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view s, NormalForm form);

// The Unicode version the tables were generated from.
const char* tables_version();

}  // namespace zof::unicode
