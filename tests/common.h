// Shared test helpers: where the assets are, the rule that a missing asset fails under CI, the
// backends through the runtime, a scoped environment variable, running the binary, and Tiny
// Shakespeare run directories.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "zof/runtime.h"

namespace zof::test {

inline std::string assets_dir() { return ZOF_ASSETS_DIR; }
inline std::string source_dir() { return ZOF_SOURCE_DIR; }
inline std::string binary_dir() { return ZOF_BINARY_DIR; }
inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

// Backends as the CLI builds them, through the runtime (zof/runtime.h): the CPU backend with
// `threads` (0: all cores), and the scalar reference backend.
inline std::unique_ptr<Backend> cpu_backend(int threads = 0) {
  BackendOptions b;
  b.threads = threads;
  return make_backend(b);
}
inline std::unique_ptr<Backend> reference_backend() {
  BackendOptions b;
  b.device = zof::DeviceChoice::Reference;
  return make_backend(b);
}

// An environment variable set for one scope (ZOF_IO for a tier built in it), restored after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

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

// The last line of a command's output as JSON (a --json run's summary).
inline nlohmann::json last_json(const std::string& out) {
  const size_t end = out.find_last_not_of('\n');
  const size_t start = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
}

inline std::string zof_binary() { return binary_dir() + "/zof"; }

inline std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs of `zof finetune` on stories260K and Tiny Shakespeare: dir_ is a fresh temporary directory
// (removed afterwards) holding text.txt, the text's first 20 KB, which keeps a run to a second or
// two. Fixtures that check more first call make_run_dir() from their own SetUp.
class ShakespeareRunTest : public ::testing::Test {
 protected:
  void SetUp() override { make_run_dir("zof_run"); }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void make_run_dir(const std::string& prefix) {
    ZOF_REQUIRE_PATH(assets_dir() + "/models/stories260K");
    ZOF_REQUIRE_PATH(assets_dir() + "/data/tinyshakespeare/input.txt");
    std::string name = prefix;  // appended piece by piece: GCC 12 warns (-Wrestrict, a false
    name += '_';                 // positive) on one long chain of operator+ from a parameter
    name += std::to_string(::getpid());
    name += '_';
    name += ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    const std::string text = read_file(assets_dir() + "/data/tinyshakespeare/input.txt");
    std::ofstream(dir_ / "text.txt") << text.substr(0, 20000);
  }
  std::filesystem::path dir_;
};

}  // namespace zof::test
