// Numbers a user gives zof (number_rule.h): the rules' words and checks, and the readers of a
// number's text into a field's type, refused before anything is narrowed: a float never silently
// becomes inf or 0, a negative seed never wraps round.
#include "zof/number_rule.h"

#include <cerrno>
#include <cfloat>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "zof/error.h"

namespace zof {

namespace {

// A number as a user would write it: 1000, 0.001, 1e-06, nan.
std::string number_text(double v) {
  char b[64];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(b, sizeof b, "%.0f", v);
  else
    std::snprintf(b, sizeof b, "%g", v);
  return b;
}

}  // namespace

std::string NumberRule::words() const {
  const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
  const std::string l = number_text(lo), h = number_text(hi);
  if (whole) {
    // Whole numbers: the bounds are whole and inclusive.
    if (has_lo && has_hi) return "a whole number from " + l + " to " + h;
    if (has_lo) return "a whole number of at least " + l;
    if (has_hi) return "a whole number of at most " + h;
    return "a whole number";
  }
  if (has_lo && has_hi) {
    if (!lo_open && !hi_open) return "a number from " + l + " to " + h;
    return std::string("in ") + (lo_open ? "(" : "[") + l + ", " + h + (hi_open ? ")" : "]");
  }
  if (has_lo) return (lo_open ? "a finite number above " : "a finite number of at least ") + l;
  if (has_hi) return (hi_open ? "a finite number below " : "a finite number of at most ") + h;
  return "a finite number";
}

bool NumberRule::accepts(double v) const {
  if (!std::isfinite(v)) return false;
  if (whole && v != std::floor(v)) return false;
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

std::string NumberRule::refusal(const std::string& flag, const std::string& value) const {
  std::string m = flag + " must be " + words();
  if (*note) m += std::string(" (") + note + ")";
  return m + ", not " + value;
}

void check_real(const std::string& flag, double value, const NumberRule& rule) {
  ZOF_CHECK(rule.accepts(value), rule.refusal(flag, number_text(value)));
}

void check_whole(const std::string& flag, int64_t value, const NumberRule& rule) {
  // Compared as integers: a double would round values near 2^63 onto the bound.
  const bool above_lo = !std::isfinite(rule.lo) || (rule.lo <= -0x1p63) ||
                        (rule.lo < 0x1p63 && value >= (int64_t)rule.lo);
  const bool below_hi = !std::isfinite(rule.hi) || rule.hi >= 0x1p63 ||
                        (rule.hi >= -0x1p63 && value <= (int64_t)rule.hi);
  ZOF_CHECK(above_lo && below_hi, rule.refusal(flag, std::to_string(value)));
}

std::string shown_text(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  (void)std::strtod(text.c_str(), &end);
  const bool number = !text.empty() && end == text.c_str() + text.size() && text[0] != ' ';
  return number ? text : "'" + text + "'";
}

namespace {

// The whole text as a double (strtod: decimal, exponent, nan, inf); false for anything else. A
// value beyond double's range reads as +-HUGE_VAL or as a tiny (or zero) number, as strtod gives.
// underflow: a nonzero text beyond double's range toward zero (1e-400), which reads as 0.
bool read_double_text(const std::string& text, double& v, bool* underflow = nullptr,
                      bool* overflow = nullptr) {
  if (text.empty() || std::isspace((unsigned char)text[0])) return false;
  char* end = nullptr;
  errno = 0;
  v = std::strtod(text.c_str(), &end);
  if (underflow) *underflow = errno == ERANGE && std::fabs(v) < 1;
  if (overflow) *overflow = errno == ERANGE && std::isinf(v);
  return end == text.c_str() + text.size();
}

// A float field's value from the double read (text: as the user wrote it; underflow: the text
// was beyond double's range toward zero).
float narrow_float(const std::string& flag, double d, const NumberRule& rule,
                   const std::string& text, bool underflow) {
  ZOF_CHECK(!std::isnan(d), rule.refusal(flag, text));
  ZOF_CHECK(std::fabs(d) <= FLT_MAX,
            rule.refusal(flag, text) + " (beyond float's range, about 3.4e38)");
  ZOF_CHECK((d == 0 && !underflow) || std::fabs(d) >= FLT_MIN,
            rule.refusal(flag, text) + " (below the smallest positive float, about 1.2e-38" +
                (flag == "--eps" ? ": too small to perturb the weights)" : ")"));
  return (float)d;
}

}  // namespace

int64_t read_whole_text(const std::string& flag, const std::string& text, const NumberRule& rule) {
  const char* b = text.data();
  const char* e = b + text.size();
  if (b != e && *b == '+') ++b;
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(b, e, v);
  if (ec == std::errc() && p == e && b != e) return v;
  // Whole values written as decimals or with an exponent (1e3, 64.0), exactly representable.
  double d = 0;
  if (ec != std::errc::result_out_of_range && read_double_text(text, d) && std::isfinite(d) &&
      d == std::floor(d) && std::fabs(d) <= 0x1p53)
    return (int64_t)d;
  throw Error(rule.refusal(flag, shown_text(text)));
}

int read_int_text(const std::string& flag, const std::string& text, const NumberRule& rule) {
  const int64_t v = read_whole_text(flag, text, rule);
  ZOF_CHECK(v >= INT_MIN && v <= INT_MAX, rule.refusal(flag, text));
  return (int)v;
}

uint64_t read_seed_text(const std::string& flag, const std::string& text) {
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  ZOF_CHECK(ec == std::errc() && p == text.data() + text.size() && !text.empty(),
            flag + " must be a whole number from 0 to 18446744073709551615, not " +
                shown_text(text));
  return v;
}

double read_real_text(const std::string& flag, const std::string& text, const NumberRule& rule) {
  double d = 0;
  bool underflow = false;
  ZOF_CHECK(read_double_text(text, d, &underflow) && std::isfinite(d) && !underflow,
            rule.refusal(flag, shown_text(text)));
  return d;
}

float read_float_text(const std::string& flag, const std::string& text, const NumberRule& rule) {
  double d = 0;
  bool underflow = false, overflow = false;
  const bool read = read_double_text(text, d, &underflow, &overflow);
  ZOF_CHECK(read && !std::isnan(d) && (std::isfinite(d) || overflow),
            rule.refusal(flag, shown_text(text)));
  return narrow_float(flag, d, rule, text, underflow);
}

bool read_switch_text(const std::string& flag, const std::string& text) {
  // The words CLI11 takes for a flag's value (--one-sided=yes), so that Python and --config
  // lines take what the command line does.
  for (const char* t : {"true", "on", "yes", "enable", "1"})
    if (text == t) return true;
  for (const char* f : {"false", "off", "no", "disable", "0"})
    if (text == f) return false;
  throw Error(flag + " is a switch: give it alone (or =true, =false), not with '" + text + "'");
}

}  // namespace zof
