// The third hostile pass, flags: `--config` values that hold '#' or an unmatched quote, `--resume`
// restating a run's own values (an "auto" the run resolved included), a warm-up longer than the
// run, and the exit status of a run stopped by SIGTERM.
#include "common.h"
#include "faults/fault_table.h"

namespace {

using zof::faults::Case;
using zof::faults::Sandbox;
using zof::faults::shell_quoted;
using zof::test::run_command;

const std::string kRun = "finetune {F} --out {S}/out";

// A finished bf16-master run (its round_every resolved to 8) at {S}/bf16.
void bf16_run(Sandbox& s) { s.run("bf16", "--master bf16"); }

std::vector<Case> hostile3_flag_cases() {
  const std::string finished = R"(the run finished at step 3 of its --steps 3)";
  return {
      // ---- --config: quotes and comments ------------------------------------------------------
      {"ConfigUnmatchedQuote",
       [](Sandbox& s) { s.write(s.root() / "c.toml", "steps = 2\nout = \"runs/cfg\n"); },
       kRun + " --config {S}/c.toml", 1,
       R"(^--config .*/c\.toml line 2: the value of `out` opens a quote \(\"\) that the line never closes; close it, or drop the quote$)"},
      {"ConfigTextAfterTheClosingQuote",
       [](Sandbox& s) { s.write(s.root() / "c.toml", "out = 'runs/a' b\n"); },
       kRun + " --config {S}/c.toml", 1,
       R"(^--config .*/c\.toml line 1: `out` has text after its closing quote \(`b`\); put the whole value inside the quotes$)"},
      // '#' inside quotes is the value's: the flag reaches its check with it.
      {"ConfigHashInsideQuotesIsKept",
       [](Sandbox& s) { s.write(s.root() / "c.toml", "objective = \"lm#1\"  # a comment\n"); },
       kRun + " --config {S}/c.toml", 1,
       R"(^--objective \(--config .*/c\.toml line 1\) must be auto, lm or classification, not 'lm#1'$)"},
      {"ConfigCommentAfterAnUnquotedValue",
       [](Sandbox& s) { s.write(s.root() / "c.toml", "warmup = -1 # none\n"); },
       kRun + " --config {S}/c.toml", 1,
       R"(^--warmup \(--config .*/c\.toml line 1\) must be a whole number of at least 0, not -1$)"},

      // ---- --resume restating the run's own values ---------------------------------------------
      // The run's own --master and --round-every (auto resolved to 8) are no change: the request
      // passes the rule and reaches the next check.
      {"ResumeRestatingTheRunsRoundEvery", bf16_run,
       "finetune --resume {S}/bf16 --round-every 8 --master bf16", 1, finished},
      {"ResumeRestatingTheRunsRoundEveryAlone", bf16_run, "finetune --resume {S}/bf16 --round-every 8",
       1, finished},
      // "auto" is what the run resolved when it started, for every option that takes it.
      {"ResumeWithDtypeAuto", {}, "finetune --resume {R} --dtype auto --save-dtype auto "
       "--round-every 0", 1, finished},
      // A changed value is still refused, and one out of range too (it would be ignored).
      {"ResumeChangingRoundEvery", bf16_run, "finetune --resume {S}/bf16 --round-every 4", 1,
       R"(so --round-every 4 would be ignored \(the run has --round-every 8\))"},
      // (The run made in fp32 whatever --dtype auto would choose here: bf16 on an AMX CPU.)
      {"ResumeChangingDtype", [](Sandbox& s) { s.run("run", "--dtype fp32"); },
       "finetune --resume {R} --dtype bf16", 1,
       R"(so --dtype bf16 would be ignored \(the run has --dtype fp32\))"},

      // ---- a warm-up longer than the run -------------------------------------------------------
      {"WarmupLongerThanTheRun", {}, kRun + " --warmup 100 --steps 5", 1,
       R"(^--warmup 100 is longer than the run's --steps 5, so the learning rate would never reach --lr: give --warmup 5 or less$)"},
  };
}

ZOF_FAULT_TABLE(Hostile3Flags, hostile3_flag_cases());

// `out = "runs/cfg_hash#1"`: the run goes to that directory, '#' and all (it was read as
// `"runs/cfg_hash`, a directory named `"runs`).
TEST(Hostile3Config, HashInsideQuotesIsPartOfTheValue) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("ConfigHashInQuotes");
  s.write(s.root() / "c.toml", "out = \"" + (s.root() / "runs" / "cfg_hash#1").string() +
                                   "\"  # where the run goes\nsteps = 2\n");
  auto r = run_command(zof::faults::zof_binary() + " finetune " + s.run_flags() + " --config " +
                       shell_quoted(s.root() / "c.toml"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(s.root() / "runs" / "cfg_hash#1" / "model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(s.root() / "\"runs"));
}

}  // namespace
