// The CLI's error messages (cli_errors.h): a refused flag, an unknown argument, a filesystem
// error, in zof's words and on one line; and whether a failure ends with a JSON line too.
#include "cli_errors.h"

#include <cstdlib>

namespace fs = std::filesystem;

namespace zof::cli {

namespace {

const char* const kCommands = "generate, eval, finetune, replay, report";

// The rank of this process under mpirun (0 alone): only rank 0 prints the JSON result.
int launched_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

}  // namespace

std::string parse_error_message(const CLI::ParseError& e, const std::string& cmd,
                                const std::map<std::string, std::string>& from_config) {
  std::string what = e.what();
  for (auto& c : what) c = c == '\n' ? ' ' : c;
  const std::string help = cmd.empty() ? "zof --help" : "zof " + cmd + " --help";
  if (what == "A subcommand is required")
    return std::string("no command given; zof takes one of ") + kCommands + " (see zof --help)";
  const std::string required = " is required";
  if (what.size() > required.size() && what.compare(what.size() - required.size(),
                                                    required.size(), required) == 0) {
    const std::string flag = what.substr(0, what.size() - required.size());
    if (flag.rfind("--", 0) != 0)  // a positional: report's run directories
      return "zof " + cmd + " needs a run directory: zof report RUN_DIR [RUN_DIR ...]";
    return "zof " + cmd + " needs " + flag + " (see " + help + ")";
  }
  // "--model: 1 required TEXT missing": a flag at the end of the line without its value.
  const size_t colon = what.find(": ");
  if (colon != std::string::npos && what.rfind("--", 0) == 0 &&
      what.find("missing", colon) != std::string::npos)
    return what.substr(0, colon) + " needs a value (see " + help + ")";
  // "Could not convert: --one-sided = maybe": only the switches are typed (numbers are text).
  const std::string convert = "Could not convert: ";
  if (what.rfind(convert, 0) == 0 && what.find(" = ") != std::string::npos) {
    const size_t eq = what.find(" = ");
    const std::string flag = what.substr(convert.size(), eq - convert.size());
    std::string where;
    if (auto it = from_config.find(flag); it != from_config.end()) where = " (" + it->second + ")";
    return flag + where + " is a switch: give it alone (or =true, =false), not with '" +
           what.substr(eq + 3) + "'";
  }
  return what + " (see " + help + ")";
}

std::string extras_message(const std::vector<std::string>& extras, const std::string& cmd,
                           const std::map<std::string, std::string>& from_config) {
  if (cmd.empty() && extras[0].rfind('-', 0) != 0)
    return "unknown command '" + extras[0] + "'; zof takes one of " + kCommands +
           " (see zof --help)";
  for (const auto& x : extras) {
    if (x.size() < 2 || x[0] != '-') continue;
    const std::string flag = x.substr(0, x.find('='));
    std::string where;
    if (auto it = from_config.find(flag); it != from_config.end()) where = " (" + it->second + ")";
    if (cmd.empty())
      return flag + where + " is not a flag of zof; flags follow the command (see zof --help)";
    return flag + where + " is not a flag of zof " + cmd + " (see zof " + cmd + " --help)";
  }
  return "unexpected argument '" + extras[0] + "': zof " + cmd +
         " takes flags only; a value with spaces needs quotes (see zof " + cmd + " --help)";
}

bool json_error_line(int argc, char** argv, std::string& cmd) {
  bool json_flag = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (cmd.empty() && !a.empty() && a[0] != '-') cmd = a;
    if (a == "--json" || (a.rfind("--json=", 0) == 0 && a != "--json=false")) json_flag = true;
  }
  if (launched_rank() != 0) return false;
  if (cmd == "finetune") return true;
  return json_flag && (cmd == "generate" || cmd == "eval" || cmd == "replay");
}

std::string one_line(const std::string& raw) {
  std::string what;
  for (const char c : raw) {
    if (c == '\n') what += "\\n";
    else if (c == '\r') what += "\\r";
    else if (c == '\t') what += "\\t";
    else if ((unsigned char)c < 0x20 || c == 0x7f) what += '?';
    else what += c;
  }
  return what;
}

std::string filesystem_message(const fs::filesystem_error& e, const std::vector<std::string>& args) {
  const std::string path = e.path1().string();
  std::string op = e.what();  // "filesystem error: OP: REASON [PATH]"
  const std::string head = "filesystem error: ";
  if (op.rfind(head, 0) == 0) op = op.substr(head.size());
  if (const size_t at = op.find(": "); at != std::string::npos) op = op.substr(0, at);
  std::string named = path;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    const std::string value = eq != std::string::npos ? a.substr(eq + 1)
                              : i + 1 < args.size()   ? args[i + 1]
                                                      : "";
    if (value.empty() || path.empty()) continue;
    if (path == value) {
      named = flag + " " + path;
      break;
    }
    const std::string dir = value.back() == '/' ? value : value + "/";
    if (path.rfind(dir, 0) == 0) {
      named = path + " (in " + flag + " " + value + ")";
      break;
    }
  }
  if (named.empty()) named = "a path";
  // "status" and its kin look a path up: the path cannot be reached.
  const std::string did = op.find("status") != std::string::npos ? " cannot be reached"
                          : op.rfind("cannot ", 0) == 0           ? ": " + op
                                                                  : ": " + op + " failed";
  return named + did + " (" + e.code().message() + "); check the path and its permissions";
}

}  // namespace zof::cli
