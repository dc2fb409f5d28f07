// The fault table: bad inputs and faults as a user meets them at the command line. Each case
// builds its inputs in a fresh sandbox directory (a copy of stories260K, a small text file, run
// directories made by zof itself), runs one zof command there, and asserts
//   - the exit status,
//   - stderr is exactly one line, "zof: error: ...", matching the case's regex (ECMAScript,
//     searched), and, with --json, stdout's last line is {"error": "<the same text>"},
//   - nothing in the sandbox was created, removed or changed (every file's size and bytes, every
//     directory), except the paths the case names as its own output and then checks itself.
// Files of cases: tests/faults/*_cases.cpp, each a ZOF_FAULT_TABLE of its own.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace zof::faults {

namespace fs = std::filesystem;

// A fresh directory per case, removed afterwards.
class Sandbox {
 public:
  explicit Sandbox(const std::string& name);
  ~Sandbox();
  const fs::path& root() const { return root_; }
  // A writable copy of stories260K (config, weights, tokenizer files) at root/model.
  fs::path model();
  // root/text.txt: the first 20 KB of Tiny Shakespeare.
  fs::path text();
  // A finished run of `zof finetune` (text task, 3 steps, a checkpoint each step) at root/NAME,
  // copied from one made once per test process (extra flags make a different cached run).
  fs::path run(const std::string& name = "run", const std::string& extra_flags = "");
  // Files.
  std::string read(const fs::path& p) const;
  void write(const fs::path& p, const std::string& bytes) const;
  // Edits a JSON file in place.
  void edit_json(const fs::path& p, const std::function<void(nlohmann::json&)>& edit) const;
  // The flags of a short text run over text(): "--model M --task text --data T" and the sizes.
  std::string run_flags();

 private:
  fs::path root_;
};

struct Case {
  std::string name;                          // the test's name: [A-Za-z0-9_]
  std::function<void(Sandbox&)> setup;       // may be empty
  // The command line after the binary: {M} model(), {T} text(), {S} the sandbox root, {F}
  // run_flags(), {R} run() (a finished run), {A} the assets directory.
  std::string command;
  int code = 1;                              // expected exit status
  std::string message;                       // regex searched in the line after "zof: error: "
  std::vector<std::string> may_change = {};  // sandbox-relative paths the command may write
  std::function<void(Sandbox&)> check = {};  // further assertions after the command
  int timeout_s = 120;                       // a hang fails the case
};

// Runs one case (the body of every fault test).
void run_case(const Case& c);

// Where the binary under test and the assets are.
std::string zof_binary();
std::string assets_dir();

// p in single quotes, for a shell command line (the sandboxes' paths hold no quote).
std::string shell_quoted(const std::filesystem::path& p);
// Starts a process that holds an exclusive flock on `lock` (util-linux flock(1), the same
// flock(2) lock zof takes) in its own process group, its pid in {S}/holder.pid; returns once the
// lock is held. release_lock ends it (a case's check, so that it also runs when the case fails).
void hold_lock(Sandbox& s, const std::filesystem::path& lock);
void release_lock(Sandbox& s);
// After a test's own edit of a run's run.json (a finished run's --steps raised, so that --resume
// continues it): run.json's seal and each checkpoint's state.json run_seal recomputed, as a run
// started with those options would have written them. A run.json without a seal (an older
// zof's) gets none, and a state.json without run_seal none.
void reseal_run(const std::filesystem::path& run);

}  // namespace zof::faults

// One table of cases: TEST_P over a vector<Case>, one ctest test per case named Suite.Name.
#define ZOF_FAULT_TABLE(Suite, cases)                                                          \
  class Suite : public ::testing::TestWithParam<::zof::faults::Case> {};                       \
  TEST_P(Suite, Refused) { ::zof::faults::run_case(GetParam()); }                              \
  INSTANTIATE_TEST_SUITE_P(Cases, Suite, ::testing::ValuesIn(cases),                           \
                           [](const ::testing::TestParamInfo<::zof::faults::Case>& i) {        \
                             return i.param.name;                                              \
                           })
