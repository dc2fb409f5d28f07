// finetune's --config file (flags.h): its `key = value` lines as flags before the command line's.
#include "flags.h"

#include <fstream>

#include "zof/error.h"
#include "zof/data.h"

namespace zof::cli {

ExpandedArgs expand_config(int argc, char** argv) {
  ExpandedArgs x;
  std::vector<std::string> in(argv, argv + argc), &out = x.args;
  size_t sub = 1;
  while (sub < in.size() && !in[sub].empty() && in[sub][0] == '-') ++sub;
  if (sub == in.size() || in[sub] != "finetune") {
    out = in;
    return x;
  }
  std::string path;
  bool given = false;
  for (size_t i = sub + 1; i < in.size(); ++i) {
    if (in[i] == "--config" && i + 1 < in.size()) path = in[i + 1], given = true;
    if (in[i].rfind("--config=", 0) == 0) path = in[i].substr(9), given = true;
  }
  out.assign(in.begin(), in.begin() + sub + 1);
  if (given) {
    zof::check_input_file("--config", path, "--config takes a file of `key = value` lines");
    std::ifstream f(path);
    ZOF_CHECK(f.good(), "--config " + path + ": cannot read the file (check its permissions)");
    std::string line;
    int lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      const std::string at = "--config " + path + " line " + std::to_string(lineno);
      // A NUL would end the message (and the flag's value) where it stands.
      ZOF_CHECK(line.find('\0') == std::string::npos,
                at + ": the line holds a NUL byte; --config takes a text file of `key = value` "
                     "lines (is it a binary file?)");
      auto trim = [](std::string x) {
        const size_t a = x.find_first_not_of(" \t\r"), b = x.find_last_not_of(" \t\r");
        return a == std::string::npos ? std::string() : x.substr(a, b - a + 1);
      };
      // '#' starts a comment outside quotes only: `out = "runs/a#1"` keeps its '#'.
      if (const size_t hash = line.find('#'); hash != std::string::npos && hash < line.find('='))
        line = line.substr(0, hash);  // a comment before any '=' (npos: none at all)
      line = trim(line);
      if (line.empty() || line[0] == '[') continue;  // blank, comment, or a TOML section header
      const size_t eq = line.find('=');
      ZOF_CHECK(eq != std::string::npos, at + ": expected `key = value`, found `" + line + "`");
      std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
      for (auto& c : key) c = c == '_' ? '-' : c;
      if (!value.empty() && (value[0] == '"' || value[0] == '\'')) {
        // A quoted value runs to its closing quote; only a comment may follow it.
        const char q = value[0];
        const size_t close = value.find(q, 1);
        ZOF_CHECK(close != std::string::npos,
                  at + ": the value of `" + key + "` opens a quote (" + q + ") that the line "
                  "never closes; close it, or drop the quote");
        const std::string rest = trim(value.substr(close + 1));
        ZOF_CHECK(rest.empty() || rest[0] == '#',
                  at + ": `" + key + "` has text after its closing quote (`" + rest + "`); "
                  "put the whole value inside the quotes");
        value = value.substr(1, close - 1);
      } else if (const size_t c = value.find('#'); c != std::string::npos) {
        value = trim(value.substr(0, c));  // an unquoted value ends at a comment
      }
      ZOF_CHECK(!key.empty() && key != "config" && key[0] != '-',
                at + ": bad key `" + key + "` (keys are flag names without dashes)");
      ZOF_CHECK(!value.empty(), at + ": `" + key + "` has no value (write `" + key +
                                    " = VALUE`, or drop the line for the default)");
      out.push_back("--" + key + "=" + value);
      x.from_config["--" + key] = at;
    }
  }
  for (size_t i = sub + 1; i < in.size(); ++i) {
    out.push_back(in[i]);
    x.from_config.erase(in[i].substr(0, in[i].find('=')));
  }
  return x;
}

}  // namespace zof::cli
