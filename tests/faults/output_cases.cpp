// Outputs that must not destroy what is already there: `zof report --out` replaces only an
// earlier zof report (never a model, a run's own files, a data file, a link or a device);
// finetune and replay write into a new or empty --out (never another model's directory or a
// finished run), replay takes the run lock as finetune does; a run stopped before it wrote
// run.json, and a finished run, are refused on --resume with what to do instead. The plain tests
// at the end check the other side: what is allowed still works and cleans zof's own leftovers.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "faults/fault_table.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::faults::Case;
using zof::faults::hold_lock;
using zof::faults::release_lock;
using zof::faults::Sandbox;
using zof::faults::shell_quoted;

// A pid that no process has now: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// What a run stopped between creating --out and writing run.json left behind (zof before the
// signal handler came first): the lock file and run.json's temporary file of a dead process.
void never_started(Sandbox& s, const fs::path& dir) {
  fs::create_directories(dir);
  s.write(dir / ".lock", "");
  s.write(dir / ("run.json.tmp." + std::to_string(dead_pid())), "{\"options\": ");
}

// A copy of the model at root/NAME: another model's directory.
fs::path other_model(Sandbox& s, const std::string& name = "other") {
  const fs::path to = s.root() / name;
  fs::copy(s.model(), to, fs::copy_options::recursive);
  return to;
}

const std::string kNotAReport =
    R"(exists and is not a zof report: a report replaces only an earlier page written by zof report, so that no other file is lost; choose a new file name for --out$)";
const std::string kNewRun =
    R"(a new run writes into a new or empty directory, so that nothing there is overwritten: choose another --out$)";
const std::string kNewReplay =
    R"(replay writes the rebuilt model into a new or empty directory, so that nothing there is overwritten: choose another --out$)";

std::vector<Case> output_cases() {
  return {
      // ---- zof report --out -----------------------------------------------------------------
      {"OutReportOverModelWeights", {}, "report {R} --out {M}/model.safetensors", 1,
       R"(^--out .*/model/model\.safetensors )" + kNotAReport},
      {"OutReportOverTheDataFile", {}, "report {R} --out {T}", 1,
       R"(^--out .*/text\.txt )" + kNotAReport},
      {"OutReportOverTheRunsRunJson", {}, "report {R} --out {R}/run.json", 1,
       R"(^--out .*/run/run\.json lies inside the run directory .*/run, where a report may only be .*/run/report\.html \(the other files are the run's\); choose that or a file outside the run$)"},
      {"OutReportOverTheRunsLog", {}, "report {R} --out {R}/zo_log.jsonl", 1,
       R"(^--out .*/run/zo_log\.jsonl lies inside the run directory)"},
      {"OutReportNewFileInsideTheRun", {}, "report {R} --out {R}/checkpoint-3/page.html", 1,
       R"(^--out .*/run/checkpoint-3/page\.html lies inside the run directory)"},
      {"OutReportInsideTheSecondRun", [](Sandbox& s) { s.run("run2"); },
       "report {R} {S}/run2 --out {S}/run2/latest", 1,
       R"(^--out .*/run2/latest lies inside the run directory .*/run2,)"},
      {"OutReportIntoAFifo",
       [](Sandbox& s) { ASSERT_EQ(::mkfifo((s.root() / "pipe.html").c_str(), 0600), 0); },
       "report {R} --out {S}/pipe.html", 1,
       R"(^--out .*/pipe\.html exists and is not a regular file \(a device, FIFO or socket\): a report is never written there; choose a new file name for --out$)"},
      {"OutReportThroughASymlink",
       [](Sandbox& s) { fs::create_symlink(s.model() / "config.json", s.root() / "link.html"); },
       "report {R} --out {S}/link.html", 1,
       R"(^--out .*/link\.html is a symbolic link: a report replaces only an earlier zof report, never what a link points to; choose a new file name for --out$)"},
      {"OutReportOverADirectory", [](Sandbox& s) { fs::create_directories(s.root() / "d"); },
       "report {R} --out {S}/d", 1,
       R"(^--out .*/d is a directory; give a file name such as .*/d/report\.html$)"},
      {"OutReportDefaultOverAForeignPage",
       [](Sandbox& s) { s.write(s.run() / "report.html", "<html>my notes</html>\n"); },
       "report {R}", 1,
       R"(^report: cannot write .*/run/report\.html exists and is not a zof report: .*; give --out a new file name$)"},
      // ---- finetune --out: a new or empty directory -----------------------------------------
      {"OutFinetuneIntoAnotherModel", [](Sandbox& s) { other_model(s); },
       "finetune {F} --out {S}/other", 1,
       R"(^--out .*/other is not empty \(it holds config\.json, generation_config\.json, model\.safetensors and [0-9]+ more\); )" +
           kNewRun},
      {"OutFinetuneIntoUserFiles",
       [](Sandbox& s) {
         fs::create_directories(s.root() / "notes");
         s.write(s.root() / "notes" / "todo.txt", "buy milk\n");
       },
       "finetune {F} --out {S}/notes --json", 1,
       R"(^--out .*/notes is not empty \(it holds todo\.txt\); )" + kNewRun},
      {"OutFinetuneIntoAFinishedRun", [](Sandbox& s) { s.run("done"); },
       "finetune {F} --out {S}/done", 1,
       R"(^--out .*/done already holds a run, which has finished \(nothing to --resume\); choose another --out, or start a new run from its model with --model .*/done$)"},
      // A finished --save-format gguf run wrote model.gguf, not model.safetensors: finished
      // too, and a new run starts from that file.
      {"OutFinetuneIntoAFinishedGgufRun",
       [](Sandbox& s) {
         const fs::path r = s.run("done");
         fs::rename(r / "model.safetensors", r / "model.gguf");
       },
       "finetune {F} --out {S}/done", 1,
       R"(^--out .*/done already holds a run, which has finished \(nothing to --resume\); choose another --out, or start a new run from its model with --model .*/done/model\.gguf$)"},
      {"OutFinetuneIntoALiveRunThatHasNotStarted",
       [](Sandbox& s) {
         fs::create_directories(s.root() / "starting");
         s.write(s.root() / "starting" / ".lock", "");
         hold_lock(s, s.root() / "starting" / ".lock");
       },
       "finetune {F} --out {S}/starting", 1,
       R"(^--out .*/starting is in use by another process \(pid [0-9]+\) that holds .*/starting/\.lock; wait for it)",
       {}, release_lock},
      // ---- replay --out: a new or empty directory, locked ----------------------------------
      {"OutReplayIntoAnotherModel", [](Sandbox& s) { other_model(s); },
       "replay --model {M} --log {R} --out {S}/other", 1,
       R"(^--out .*/other is not empty \(it holds config\.json, .*\); )" + kNewReplay},
      {"OutReplayIntoAFinishedRun", [](Sandbox& s) { s.run("done"); },
       "replay --model {M} --log {R} --out {S}/done --json", 1,
       R"(^--out .*/done is not empty \(it holds checkpoint-3, config\.json, generation_config\.json and [0-9]+ more\); )" +
           kNewReplay},
      {"OutReplayIntoALiveRun",
       [](Sandbox& s) {
         s.run("live");
         hold_lock(s, s.root() / "live" / ".lock");
       },
       "replay --model {M} --log {R} --out {S}/live", 1,
       R"(^--out .*/live is in use by another process \(pid [0-9]+\) that holds .*/live/\.lock; wait for it to finish, or stop it, then try again$)",
       {}, release_lock},
      {"OutReplayOverAFile", [](Sandbox& s) { s.write(s.root() / "file", "data\n"); },
       "replay --model {M} --log {R} --out {S}/file", 1,
       R"(^--out .*/file exists and is not a directory; replay writes the rebuilt model into a new or empty directory: choose another --out$)"},
      // ---- --resume of a run that never started, or that has finished ----------------------
      {"OutResumeARunThatNeverStarted",
       [](Sandbox& s) { never_started(s, s.root() / "stopped"); },
       "finetune --resume {S}/stopped", 1,
       R"(^--resume .*/stopped: the run never started \(it was stopped before it wrote run\.json; the directory holds only zof's lock or temporary files\): start it again with zof finetune --out .*/stopped and the run's flags$)"},
      {"OutResumeAFinishedRun", {}, "finetune --resume {R}", 1,
       R"(^--resume .*/run: the run finished at step 3 of its --steps 3 and wrote its model: there is nothing to resume; to train further, start a new run from its model with zof finetune --model .*/run --out NEW_DIR$)"},
      {"OutResumeAFinishedRunJson", {}, "finetune --resume {R} --json --threads 1", 1,
       R"(^--resume .*/run: the run finished at step 3 of its --steps 3)"},
  };
}

ZOF_FAULT_TABLE(OutputFaults, output_cases());

// ---- what stays allowed ------------------------------------------------------------------------

using zof::test::run_command;

// A report may replace an earlier report (its own page, or a comparison page) and the run's
// report.html; every page it writes is recognised as a report again.
TEST(OutputRules, ReportReplacesItsOwnPages) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("ReportReplacesItsOwnPages");
  const fs::path run = s.run(), page = s.root() / "page.html";
  for (int i = 0; i < 2; ++i) {
    auto r = run_command(zof::faults::zof_binary() + " report " + shell_quoted(run) + " --out " +
                         shell_quoted(page));
    ASSERT_EQ(r.code, 0) << r.err;
    auto d = run_command(zof::faults::zof_binary() + " report " + shell_quoted(run));
    ASSERT_EQ(d.code, 0) << d.err;
  }
  EXPECT_EQ(s.read(page).rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(s.read(page), s.read(run / "report.html"));
}

// A new run into a directory that holds only zof's leftovers of a run stopped before it started
// (the lock file, a dead process's run.json.tmp.PID) starts there and removes the leftover.
TEST(OutputRules, NewRunIntoLeftoversOfARunThatNeverStarted) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("NewRunIntoLeftovers");
  const fs::path out = s.root() / "stopped";
  never_started(s, out);
  auto r = run_command(zof::faults::zof_binary() + " finetune " + s.run_flags() + " --out " +
                       shell_quoted(out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// A resume removes the temporary files a SIGKILL left mid-write (latest.tmp.PID of a dead
// process), and finishes the run.
TEST(OutputRules, ResumeRemovesTemporaryFilesOfADeadProcess) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("ResumeRemovesTmp");
  const fs::path out = s.root() / "killed";
  const std::string zof = zof::faults::zof_binary();
  auto k = run_command("ZOF_FAULT_KILL_AT_STEP=2 " + zof + " finetune " + s.run_flags() +
                       " --save-every 1 --out " + shell_quoted(out));
  ASSERT_EQ(k.code, 128 + SIGKILL) << k.err;
  const fs::path tmp = out / ("latest.tmp." + std::to_string(dead_pid()));
  s.write(tmp, "checkpoint-");
  auto r = run_command(zof + " finetune --resume " + shell_quoted(out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming at step 2"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
}

// SIGTERM between creating --out and writing run.json (ZOF_FAULT_TERM_IN_CREATE) stops the run
// at a step boundary with a checkpoint, as any later SIGTERM does: never a directory that is no
// run. The resume finishes it.
TEST(OutputRules, SigtermWhileCreatingTheRunLeavesAResumableRun) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("SigtermInCreate");
  const fs::path out = s.root() / "run";
  const std::string zof = zof::faults::zof_binary();
  auto t = run_command("ZOF_FAULT_TERM_IN_CREATE=1 " + zof + " finetune " + s.run_flags() +
                       " --out " + shell_quoted(out));
  ASSERT_EQ(t.code, 143) << t.err;
  EXPECT_NE(t.err.find("interrupted by signal 15 at step 1; checkpoint saved"), std::string::npos)
      << t.err;
  EXPECT_TRUE(fs::exists(out / "run.json"));
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  auto r = run_command(zof + " finetune --resume " + shell_quoted(out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming at step 1"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
}

// Replay into an empty directory (or a new one) writes the model and leaves no lock file.
TEST(OutputRules, ReplayIntoAnEmptyDirectory) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("ReplayIntoEmpty");
  const fs::path run = s.run(), out = s.root() / "rebuilt";
  fs::create_directories(out);
  auto r = run_command(zof::faults::zof_binary() + " replay --model " + shell_quoted(s.model()) +
                       " --log " + shell_quoted(run) + " --out " + shell_quoted(out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(s.read(out / "model.safetensors"), s.read(run / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / ".lock"));
}

}  // namespace
