// A limit on how deeply the JSON a user hands zof may nest, checked on the text before parsing.
// nlohmann parses iteratively but copies and dumps recursively: a file of 200,000 nested
// brackets overflows the stack (a crash, not an error) in the first copy or error message.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "zof/error.h"

namespace zof {

// Real files nest a few levels (tokenizer.json about 8); 256 leaves room for anything sane.
inline constexpr size_t kMaxJsonDepth = 256;

// zof::Error naming `what` (the file, and the line for JSONL) when text nests arrays and objects
// deeper than kMaxJsonDepth. Brackets inside strings do not count; malformed text is left to the
// parser to report.
inline void check_json_depth(std::string_view text, const std::string& what) {
  size_t depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        throw Error(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                    " levels; the file is damaged or not what zof expects there");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace zof
