// Shared test helpers: where the assets are, and the rule that a missing asset fails under CI.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace zof::test {

inline std::string assets_dir() { return ZOF_ASSETS_DIR; }
inline std::string source_dir() { return ZOF_SOURCE_DIR; }
inline std::string binary_dir() { return ZOF_BINARY_DIR; }
inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

}  // namespace zof::test

// Skips the test when path is missing locally, fails it under CI=true.
#define ZOF_REQUIRE_PATH(path)                                                       \
  do {                                                                               \
    if (!std::filesystem::exists(path)) {                                            \
      if (::zof::test::in_ci()) FAIL() << "missing required test input: " << (path); \
      GTEST_SKIP() << "missing test input: " << (path);                              \
    }                                                                                \
  } while (0)

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

namespace zof::test {

struct CommandResult {
  int code = -1;  // exit status; 128 + signal when killed
  std::string out, err;
};

// Runs a shell command line, capturing stdout and stderr.
inline CommandResult run_command(const std::string& cmd) {
  const std::string dir = std::filesystem::temp_directory_path() / ("zof_cmd_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string full = cmd + " >" + dir + "/out 2>" + dir + "/err </dev/null";
  const int st = std::system(full.c_str());
  CommandResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  r.out = slurp(dir + "/out");
  r.err = slurp(dir + "/err");
  std::filesystem::remove_all(dir);
  return r;
}

inline std::string zof_binary() { return binary_dir() + "/zof"; }

inline std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace zof::test
