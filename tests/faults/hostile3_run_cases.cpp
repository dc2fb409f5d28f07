// The third hostile pass, run directories: a run.json edited after the run started (a new --lr
// for the steps after a checkpoint) is refused on --resume and replay, its seal removed or
// recomputed included; a step log with a record made shorter is called changed, not cut; a run
// refused by its own process's lock is told so. Then, apart from the table: replay killed while
// it writes leaves no --out that looks like a model (and the next replay into it succeeds), two
// replays into one --out never mix, and what the seal leaves free (run.json's layout, where the
// model lies) still resumes.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <regex>

#include "common.h"
#include "faults/fault_table.h"
#include "train/run_dir.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::faults::Case;
using zof::faults::Sandbox;
using zof::faults::shell_quoted;
using zof::test::run_command;

const std::string kHash = "fnv1a64:[0-9a-f]{16}";
const std::string kEditedFix =
    R"(so it no longer says how the run was made; restore run\.json as the run wrote it, or start a new run with the new options \(zof finetune --out NEW_DIR\)$)";

// A run of 10 steps with a checkpoint every 5, killed at step 7, at {S}/killed: --resume
// continues it from checkpoint-5 (the hostile report's run).
fs::path killed_run(Sandbox& s) {
  const fs::path r = s.root() / "killed";
  std::string flags = s.run_flags();
  flags.replace(flags.find("--steps 3"), 9, "--steps 10");
  const auto k = run_command("ZOF_FAULT_KILL_AT_STEP=7 " + zof::faults::zof_binary() +
                             " finetune " + flags + " --save-every 5 --out " + shell_quoted(r));
  EXPECT_EQ(k.code, 128 + SIGKILL) << k.err;
  EXPECT_TRUE(fs::exists(r / "checkpoint-5" / "state.json"));
  return r;
}

// The killed run with run.json's "lr" changed (and `also` done to run.json).
std::function<void(Sandbox&)> lr_edited(const std::function<void(json&)>& also = {}) {
  return [also](Sandbox& s) {
    s.edit_json(killed_run(s) / "run.json", [&](json& j) {
      j["options"]["lr"] = 0.01;
      if (also) also(j);
    });
  };
}

// Line `line` (1-based) of RUN/zo_log.jsonl with one digit of its first projected gradient
// dropped: a record edited shorter, still valid JSON, its step kept.
void shorten_record(Sandbox& s, const fs::path& run, int line) {
  const fs::path log = run / "zo_log.jsonl";
  std::string t = s.read(log);
  size_t at = 0;
  for (int i = 1; i < line; ++i) at = t.find('\n', at) + 1;
  at = t.find("\"g\":[", at);
  ASSERT_NE(at, std::string::npos);
  at = t.find('.', at);
  ASSERT_TRUE(std::isdigit((unsigned char)t[at + 1]) && std::isdigit((unsigned char)t[at + 2]));
  t.erase(at + 1, 1);
  s.write(log, t);
}

const std::string kReplay = "replay --model {M} --log {S}/killed --out {S}/rebuilt";

std::vector<Case> hostile3_run_cases() {
  return {
      // ---- run.json edited after the run started (sealed) -------------------------------------
      {"ResumeWithAnEditedLr", lr_edited(), "finetune --resume {S}/killed", 1,
       R"(^.*/killed/run\.json was edited after the run started: its fields hash to )" + kHash +
           R"(, not to its "seal" )" + kHash + ", " + kEditedFix},
      {"ReplayWithAnEditedLr", lr_edited(), kReplay, 1,
       R"(^.*/killed/run\.json was edited after the run started: its fields hash to )" + kHash +
           R"(, not to its "seal" )" + kHash + ", " + kEditedFix},
      {"ResumeWithAnEditedLrAndTheSealRemoved", lr_edited([](json& j) {
         j.erase("seal");
         j.erase("format");
       }),
       "finetune --resume {S}/killed", 1,
       R"(^.*/killed/run\.json was edited after the run started: its fields hash to )" + kHash +
           ", not to the " + kHash +
           R"( that .*/killed/checkpoint-5/state\.json records of it \(run_seal\), )" + kEditedFix},
      // Restating the run's real lr with the edited run.json: the edit is named, not the lr.
      {"ResumeRestatingTheLrOfAnEditedRunJson", lr_edited([](json& j) {
         j.erase("seal");
         j.erase("format");
       }),
       "finetune --resume {S}/killed --lr 1e-06", 1,
       R"(^.*/killed/run\.json was edited after the run started: its fields hash to )" + kHash +
           ", not to the " + kHash +
           R"( that .*/killed/checkpoint-5/state\.json records of it \(run_seal\), )" + kEditedFix},
      {"ReplayWithAnEditedLrAndTheSealRecomputed",
       lr_edited([](json& j) { j["seal"] = zof::train::run_json_seal(j); }), kReplay, 1,
       R"(^.*/killed/run\.json was edited after the run started: .* that .*/killed/checkpoint-5/state\.json records of it \(run_seal\), )" +
           kEditedFix},
      {"ReplayWithAnEditedLrAndOnlyTheSealRemoved", lr_edited([](json& j) { j.erase("seal"); }),
       kReplay, 1,
       R"(^.*/killed/run\.json was edited after the run started: its "seal" was removed \(a run\.json of "format" 2 is sealed\), )" +
           kEditedFix},
      // A finished run whose checkpoints were removed: summary.json records the seal.
      {"ReplayWithoutCheckpointsOfAnEditedRunJson",
       [](Sandbox& s) {
         const fs::path r = s.run();
         fs::remove_all(r / "checkpoint-3");
         fs::remove(r / "latest");
         s.edit_json(r / "run.json", [](json& j) {
           j["options"]["lr"] = 0.01;
           j.erase("seal");
           j.erase("format");
         });
       },
       "replay --model {M} --log {R} --out {S}/rebuilt", 1,
       R"(^.*/run/run\.json was edited after the run started: .* that .*/run/summary\.json records of it \(run_seal\), )" +
           kEditedFix},
      {"ResumeOfANewerFormat",
       [](Sandbox& s) { s.edit_json(killed_run(s) / "run.json", [](json& j) { j["format"] = 4; }); },
       "finetune --resume {S}/killed", 1,
       R"(^.*/killed/run\.json is "format" 4, newer than this zof reads \(3\): the run was written by a newer zof; resume or replay it with that zof$)"},
      // ---- a step record made shorter is a changed log, not a cut one -------------------------
      {"ReplayOfALogWithARecordMadeShorter",
       [](Sandbox& s) { shorten_record(s, s.run(), 2); },
       "replay --model {M} --log {R} --out {S}/rebuilt", 1,
       R"(^--log .*/run: zo_log\.jsonl holds [0-9]+ bytes, fewer than the [0-9]+ bytes of 3 steps that .*/run/checkpoint-3/state\.json records \(log_bytes\), yet all 3 step records: a record was changed; restore zo_log\.jsonl from a copy$)"},
      {"ResumeOfALogWithARecordMadeShorter",
       [](Sandbox& s) {
         const fs::path r = s.run();
         s.edit_json(r / "run.json", [](json& j) { j["options"]["steps"] = 5; });
         zof::faults::reseal_run(r);
         shorten_record(s, r, 2);
       },
       "finetune --resume {R}", 1,
       R"(^.*/run/zo_log\.jsonl holds [0-9]+ bytes, fewer than the [0-9]+ that .*/run/checkpoint-3/state\.json records \(log_bytes\), yet all 3 step records: a record was changed; zof does not append to a damaged log: restore zo_log\.jsonl from a copy, or start a new run$)"},
      {"ReplayWithLogBytesRaised",
       [](Sandbox& s) {
         s.edit_json(s.run() / "checkpoint-3" / "state.json",
                     [](json& j) { j["log_bytes"] = j["log_bytes"].get<int64_t>() + 7; });
       },
       "replay --model {M} --log {R} --out {S}/rebuilt", 1,
       R"(^--log .*/run: zo_log\.jsonl holds [0-9]+ bytes, fewer than the [0-9]+ bytes of 3 steps that .*state\.json records \(log_bytes\), yet its first 3 records hash to the )" +
           kHash +
           R"( that it records \(log_hash\): .*/checkpoint-3/state\.json's log_bytes was changed; the run directory is damaged)"},
  };
}

ZOF_FAULT_TABLE(Hostile3Run, hostile3_run_cases());

// ---- a run refused by its own process's lock ---------------------------------------------------

// A process that holds a run's lock and starts a run there (Python's zof.finetune called from
// the on_step callback of a run in that directory): it is named as this process, not another.
// The child takes the lock and writes its pid as a run does, then execs zof: the same pid.
TEST(Hostile3RunLock, ARunRefusedByItsOwnProcesssLockIsToldSo) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("Hostile3RunOwnLock");
  const fs::path run = s.run();
  const std::string bin = zof::faults::zof_binary(), lock = (run / ".lock").string(),
                    err = (s.root() / "err.txt").string(), dir = run.string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int nul = ::open("/dev/null", O_RDWR);
    if (fd < 0 || e < 0 || nul < 0 || ::flock(fd, LOCK_EX) != 0 || ::ftruncate(fd, 0) != 0)
      ::_exit(126);
    const std::string me = std::to_string(::getpid()) + "\n";
    if (::write(fd, me.data(), me.size()) != (ssize_t)me.size()) ::_exit(126);
    ::dup2(nul, 0);
    ::dup2(nul, 1);
    ::dup2(e, 2);
    ::execl(bin.c_str(), bin.c_str(), "finetune", "--resume", dir.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  const std::string se = s.read(err);
  SCOPED_TRACE("stderr: " + se);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  EXPECT_TRUE(std::regex_match(
      se, std::regex("zof: error: --resume .*/run is in use by this process \\(pid " +
                     std::to_string(pid) +
                     "\\), which already holds .*/run/\\.lock for a run or replay it has not "
                     "finished \\(zof\\.finetune called from an on_step callback, say\\); start "
                     "this one after that one returns, or use another directory\n")));
}

// ---- replay's output: complete or absent ---------------------------------------------------------

// The entries of dir whose name starts with prefix.
std::vector<std::string> named(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> n;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.rfind(prefix, 0) == 0) n.push_back(f);
  }
  return n;
}

std::string replay_into(Sandbox& s, const fs::path& run, const fs::path& out) {
  return zof::faults::zof_binary() + " replay --model " + shell_quoted(s.model()) + " --log " +
         shell_quoted(run) + " --out " + shell_quoted(out);
}

// A replay killed while it writes (ZOF_FAULT_KILL_IN_REPLAY: once the weights are written, and
// once every file is, before the rename) leaves --out as it was, absent or empty, and only its
// temporary beside it; `zof generate --model OUT` is refused; the next replay into --out
// removes the dead process's temporary (not one of a live process) and writes exactly the
// files of a replay that was never stopped.
TEST(Hostile3RunKill, AReplayKilledWhileItWritesLeavesNoModel) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("Hostile3RunKillReplay");
  const fs::path run = s.run(), clean = s.root() / "clean";
  const auto c = run_command(replay_into(s, run, clean));
  ASSERT_EQ(c.code, 0) << c.err;
  for (const char* point : {"weights", "files"}) {
    for (const bool precreated : {false, true}) {
      const std::string name = std::string(point) + (precreated ? "_empty" : "_absent");
      SCOPED_TRACE(name);
      const fs::path out = s.root() / name;
      if (precreated) fs::create_directories(out);
      // A temporary of a live process (pid 1) into the same --out is not the replay's to remove.
      const fs::path live = s.root() / ("." + name + ".zof-replay-1");
      fs::create_directories(live);
      const auto k =
          run_command("ZOF_FAULT_KILL_IN_REPLAY=" + std::string(point) + " " + replay_into(s, run, out));
      ASSERT_EQ(k.code, 128 + SIGKILL) << k.err;
      if (precreated) {
        EXPECT_TRUE(fs::is_directory(out) && fs::is_empty(out));
      } else {
        EXPECT_FALSE(fs::exists(out));
      }
      EXPECT_EQ(named(s.root(), "." + name + ".zof-replay-").size(), 2u);
      const auto g = run_command(zof::faults::zof_binary() + " generate --model " +
                                 shell_quoted(out) + " --max-new-tokens 2");
      EXPECT_EQ(g.code, 1) << g.out;
      EXPECT_EQ(g.err.rfind("zof: error: ", 0), 0u) << g.err;
      const auto r = run_command(replay_into(s, run, out));
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_EQ(named(s.root(), "." + name + ".zof-replay-"),
                std::vector<std::string>{live.filename().string()});
      std::vector<std::string> want, got;
      for (const auto& e : fs::directory_iterator(clean)) want.push_back(e.path().filename());
      for (const auto& e : fs::directory_iterator(out)) got.push_back(e.path().filename());
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
      EXPECT_EQ(got, want);
      for (const std::string& f : want)
        EXPECT_TRUE(s.read(out / f) == s.read(clean / f)) << f << " differs from a clean replay's";
    }
  }
}

// Two replays into one --out at once: one writes the model, the other is refused as --out not
// empty; what --out holds is one replay's files, whole, and no temporary is left.
TEST(Hostile3RunKill, TwoReplaysIntoOneOutNeverMix) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("Hostile3RunTwoReplays");
  const fs::path run = s.run(), out = s.root() / "out";
  const fs::path e1 = s.root() / "e1", e2 = s.root() / "e2";
  // Built piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "(" + s + ...
  std::string both = "(";
  both += replay_into(s, run, out) + " >/dev/null 2>" + shell_quoted(e1) + " & p1=$!; ";
  both += replay_into(s, run, out) + " >/dev/null 2>" + shell_quoted(e2) + " & p2=$!; ";
  both += "wait $p1; a=$?; wait $p2; b=$?; echo $a $b)";
  const auto r = run_command(both);
  ASSERT_EQ(r.code, 0) << r.err;
  const bool first = r.out == "0 1\n", second = r.out == "1 0\n";
  ASSERT_TRUE(first || second) << r.out << s.read(e1) << s.read(e2);
  const std::string err = s.read(first ? e2 : e1);
  EXPECT_TRUE(std::regex_match(
      err, std::regex("zof: error: --out .*/out is not empty \\(it holds config\\.json, .*\\); "
                      "replay writes the rebuilt model into a new or empty directory, so that "
                      "nothing there is overwritten: choose another --out\n")))
      << err;
  EXPECT_TRUE(s.read(out / "model.safetensors") == s.read(run / "model.safetensors"));
  EXPECT_TRUE(named(s.root(), ".out.zof-replay-").empty());
  EXPECT_FALSE(fs::exists(out / ".lock"));
}

// ---- what the seal leaves free ------------------------------------------------------------------

// run.json rewritten in another layout (indent, key order) and its model moved, options.model
// edited to follow it (what the model holds is base_fingerprint's to check): the run resumes,
// its checkpoints record the seal run.json holds, and run.json stays as it was.
TEST(Hostile3RunSeal, LayoutAndTheModelsPlaceAreNotSealed) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("Hostile3RunSealFree");
  const fs::path r = killed_run(s), moved = s.root() / "moved_model";
  fs::rename(s.model(), moved);
  json j = json::parse(s.read(r / "run.json"));
  ASSERT_EQ(j["format"], 2);
  ASSERT_EQ(j["seal"], zof::train::run_json_seal(j));
  j["options"]["model"] = moved.string();
  s.write(r / "run.json", j.dump(4));
  const std::string before = s.read(r / "run.json");
  const auto res = run_command(zof::faults::zof_binary() + " finetune --resume " + shell_quoted(r));
  ASSERT_EQ(res.code, 0) << res.err;
  EXPECT_NE(res.err.find("resuming at step 5"), std::string::npos) << res.err;
  EXPECT_EQ(s.read(r / "run.json"), before);
  EXPECT_EQ(json::parse(s.read(r / "checkpoint-10" / "state.json"))["run_seal"], j["seal"]);
}

// --out . from an empty directory: the rename would swap the directory the caller stands in for
// the rebuilt model's, leaving the caller in a deleted directory. Refused, nothing created.
TEST(Hostile3RunReplay, TheCurrentDirectoryIsNoOut) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("Hostile3ReplayIntoCwd");
  const fs::path run = s.run(), here = s.root() / "empty";
  fs::create_directories(here);
  const auto r = run_command("cd " + shell_quoted(here) + " && " + zof::faults::zof_binary() +
                             " replay --model " + shell_quoted(s.model()) + " --log " +
                             shell_quoted(run) + " --out .");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("zof: error: --out . is the current directory, which replay would replace"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::is_empty(here));
  EXPECT_TRUE(fs::is_empty(s.root() / "empty"));
}

}  // namespace
