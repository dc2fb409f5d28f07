// The command line's own readers (tools/zof.cpp parses with them): NumberFlags, the numeric flags
// of every command bound as text and read once CLI11 has parsed; and finetune's --config file,
// expanded into flags before parsing (expand_config).
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#include "zof/number_rule.h"

namespace zof::cli {

// ---- numbers (and words) ----------------------------------------------------------------------
// Numeric flags (and a choice's words) are bound as text and read here once CLI11 has parsed: its own conversions and
// range checks answer in their words (exit 105, "Value 0 not in range 0.000000 to 1797...") and
// wrap a negative --seed round to 2^64 - 1. A text is read into the flag's type only if it fits;
// the ranges are then the validation's (validate_options, validate_generate, ...).

// The numeric flags of every command, as text until read().
class NumberFlags {
 public:
  // rule: what the value may be (for the message when its text is not one); null for --seed.
  template <class T>
  CLI::Option* add(CLI::App* app, const std::string& name, T& target, const std::string& help,
                   const NumberRule* rule, bool show_default = true) {
    Flag& f = flags_.emplace_back();
    f.app = app;
    f.name = name;
    const NumberRule r = rule ? *rule : NumberRule{};
    std::string def, type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      std::ostringstream os;
      os << target;
      def = os.str();
      type = "FLOAT";
      f.read = [&target, name, r](const std::string& t) {
        if constexpr (std::is_same_v<T, float>)
          target = zof::read_float_text(name, t, r);
        else
          target = zof::read_real_text(name, t, r);
      };
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      def = std::to_string(target);
      type = "UINT";
      f.read = [&target, name](const std::string& t) { target = zof::read_seed_text(name, t); };
    } else if constexpr (std::is_same_v<T, int>) {
      def = std::to_string(target);
      type = "INT";
      f.read = [&target, name, r](const std::string& t) { target = zof::read_int_text(name, t, r); };
    } else {
      static_assert(std::is_same_v<T, int64_t>);
      def = std::to_string(target);
      type = "INT";
      f.read = [&target, name, r](const std::string& t) { target = zof::read_whole_text(name, t, r); };
    }
    f.opt = app->add_option(name, f.text, help)->type_name(type);
    if (show_default) f.opt->default_str(def);
    return f.opt;
  }
  // A flag of words (a choice, choices.h), read by `read` once parsed, as the numbers are: a
  // word it refuses gets the option table's message.
  CLI::Option* add_words(CLI::App* app, const std::string& name,
                         std::function<void(const std::string&)> read, const std::string& help,
                         const std::string& def) {
    Flag& f = flags_.emplace_back();
    f.app = app;
    f.name = name;
    f.read = std::move(read);
    f.opt = app->add_option(name, f.text, help)->type_name("WORD");
    f.opt->default_str(def);
    return f.opt;
  }
  // Reads the flags given to app, in the order they were declared.
  void read(const CLI::App* app) const {
    for (const Flag& f : flags_)
      if (f.app == app && f.opt->count() > 0) f.read(f.text);
  }
  // The text given for a flag (empty: not given).
  std::string text(const CLI::Option* opt) const {
    for (const Flag& f : flags_)
      if (f.opt == opt) return f.text;
    return "";
  }

 private:
  struct Flag {
    const CLI::App* app = nullptr;
    CLI::Option* opt = nullptr;
    std::string name, text;
    std::function<void(const std::string&)> read;
  };
  std::deque<Flag> flags_;  // stable addresses: CLI11 holds references to the texts
};

// ---- --config ---------------------------------------------------------------------------------

struct ExpandedArgs {
  std::vector<std::string> args;
  // Flags set by the --config file (and not again on the command line): "--config F line N".
  std::map<std::string, std::string> from_config;
};

// `zof finetune --config FILE ...`: the file's `key = value` lines become `--key=value` flags
// placed before the command line's, so that flags given on the command line win (options take
// the last value). Boolean flags take true or false (`one_sided = true`).
ExpandedArgs expand_config(int argc, char** argv);

}  // namespace zof::cli
