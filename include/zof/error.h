// Errors in two tiers: zof::Error for what a user can cause (bad file, bad flag), with a message
// that names the file, the field and the fix; ZOF_ASSERT for broken invariants inside zof.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace zof {

// A problem the user can fix. The CLI prints what() on one line and exits non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

[[noreturn]] inline void abort_at(const char* file, int line, const char* what) {
  std::fprintf(stderr, "zof: internal error at %s:%d: %s\n", file, line, what);
  std::abort();
}

}  // namespace zof

#define ZOF_ASSERT(cond)                                              \
  do {                                                                \
    if (!(cond)) ::zof::abort_at(__FILE__, __LINE__, "assert " #cond); \
  } while (0)
#define ZOF_ABORT(msg) ::zof::abort_at(__FILE__, __LINE__, msg)

// Throws zof::Error(msg) when cond is false; msg is any expression yielding std::string.
#define ZOF_CHECK(cond, msg)                     \
  do {                                           \
    if (!(cond)) throw ::zof::Error(msg);        \
  } while (0)
