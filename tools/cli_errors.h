// The CLI's error reporting: every user-caused problem in zof's words, on one line (tools/zof.cpp
// prints it as "zof: error: ..." and, where json_error_line says, as {"error": "..."} on stdout).
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace zof::cli {

// One line for a flag the parser refused, in zof's words: the flag, what is wrong, the fix.
std::string parse_error_message(const CLI::ParseError& e, const std::string& cmd,
                                const std::map<std::string, std::string>& from_config);
// Arguments no flag took: an unknown flag, or a word where none is expected.
std::string extras_message(const std::vector<std::string>& extras, const std::string& cmd,
                           const std::map<std::string, std::string>& from_config);
// The command (the first word that is not a flag), and whether a failure ends with a JSON line
// too: finetune always ends with one, generate, eval and replay with --json; under mpirun only
// rank 0 prints it.
bool json_error_line(int argc, char** argv, std::string& cmd);
// One line whatever a message quotes (a file's contents, a path, a config string): line breaks
// and other control characters are shown escaped.
std::string one_line(const std::string& raw);
// A filesystem error that reached the CLI, in zof's words: the path with the flag that named it
// (when a flag's value is the path or a directory above it), the operation and the reason.
std::string filesystem_message(const std::filesystem::filesystem_error& e, const std::vector<std::string>& args);

}  // namespace zof::cli
