// Numbers a user gives zof (flags, Python keywords, config lines): what each accepts, said in
// words and checked in one place, and the reading of their text into a field's type.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

namespace zof {

// What a numeric option accepts, said in words and checked in one place: validate_options and
// the CLI's generate/eval/replay checks test values against it, and the CLI reads each number's
// text with it, so that every bad value, from a typo to a float that overflows, gets one message
// naming the flag and the accepted values.
struct NumberRule {
  bool whole = false;  // a whole number (an integer field)
  double lo = -HUGE_VAL, hi = HUGE_VAL;
  bool lo_open = false, hi_open = false;  // the bound itself excluded
  const char* note = "";                  // after the range, in parentheses: what a value means
  // "a whole number of at least 1", "a whole number from 1 to 1024", "a finite number of at
  // least 0", "a number from 0 to 100", "in [0, 1)".
  std::string words() const;
  bool accepts(double v) const;  // finite and within the bounds
  // "FLAG must be WORDS (NOTE), not VALUE" (VALUE as the user wrote it): the refusal's text.
  std::string refusal(const std::string& flag, const std::string& value) const;
};
// zof::Error with the rule's refusal unless it accepts the value.
void check_real(const std::string& flag, double value, const NumberRule& rule);
void check_whole(const std::string& flag, int64_t value, const NumberRule& rule);

// Options as text, read as the CLI reads its flags' values and Python its keywords: a number only
// if its text is one and it fits the field's type, then within the field's rule. Each throws
// zof::Error with the rule's refusal ("--steps must be a whole number of at least 1, not 'x'").
std::string shown_text(const std::string& text);  // as the user wrote it, quoted unless a number
int64_t read_whole_text(const std::string& flag, const std::string& text, const NumberRule& rule);
int read_int_text(const std::string& flag, const std::string& text, const NumberRule& rule);
// Seeds are the full 64-bit range; a negative one is refused (it would wrap round).
uint64_t read_seed_text(const std::string& flag, const std::string& text);
double read_real_text(const std::string& flag, const std::string& text, const NumberRule& rule);
// A float field's value, read as a double and refused before narrowing: 1e39 would become inf
// and 1e-50 zero, and the validation would then see values the user never wrote.
float read_float_text(const std::string& flag, const std::string& text, const NumberRule& rule);
// A switch: "true" or "false".
bool read_switch_text(const std::string& flag, const std::string& text);

}  // namespace zof
