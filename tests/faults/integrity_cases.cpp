// What a run is made of, checked before it is continued or rebuilt: the data a resumed run
// reads (run.json data_fingerprint), the step log a resume or replay reads against what the run
// recorded of it (log_bytes and log_hash in state.json and summary.json, the run's steps), and
// flags that would be silently unused (jvp's --eps, generate's --max-new-tokens beyond the
// context). Then, apart from the table, that what passes these checks still resumes and replays
// bit for bit, older runs without the fields included.

#include "common.h"
#include "faults/fault_table.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::faults::Case;
using zof::faults::Sandbox;
using zof::faults::shell_quoted;

// The sandbox's run with --steps 5 in its run.json (resealed, as a run started so would be): its
// last checkpoint (step 3) is not its end, so --resume would continue it (the cached run has
// finished, and a finished run is refused before its log is read).
fs::path unfinished_run(Sandbox& s) {
  const fs::path r = s.run();
  s.edit_json(r / "run.json", [](json& j) { j["options"]["steps"] = 5; });
  zof::faults::reseal_run(r);
  return r;
}

// Line `line` (1-based) of the run's zo_log.jsonl with the first digit after `key` but one
// changed: a record edited in place, its length and step kept.
void edit_record(Sandbox& s, int line, const std::string& key) {
  const fs::path log = s.run() / "zo_log.jsonl";
  std::string t = s.read(log);
  size_t at = 0;
  for (int i = 1; i < line; ++i) at = t.find('\n', at) + 1;
  at = t.find("\"" + key + "\":", at);
  ASSERT_NE(at, std::string::npos);
  at += key.size() + 3;
  while (!std::isdigit((unsigned char)t[at]) || !std::isdigit((unsigned char)t[at - 1])) ++at;
  t[at] = t[at] == '9' ? '8' : (char)(t[at] + 1);
  s.write(log, t);
}

// The first n lines of the run's zo_log.jsonl.
void keep_lines(Sandbox& s, const fs::path& run, int n) {
  const std::string t = s.read(run / "zo_log.jsonl");
  size_t at = 0;
  for (int i = 0; i < n; ++i) at = t.find('\n', at) + 1;
  s.write(run / "zo_log.jsonl", t.substr(0, at));
}

const std::string kResume = "finetune --resume {R}";
const std::string kReplay = "replay --model {M} --log {R} --out {S}/rebuilt";
const std::string kHash = "fnv1a64:[0-9a-f]{16}";

std::vector<Case> integrity_cases() {
  return {
      // ---- the data a resumed run reads -------------------------------------------------------
      {"IntegrityResumeDataGrew",
       [](Sandbox& s) {
         unfinished_run(s);
         s.write(s.text(), s.read(s.text()) + "More words than the run was started on.\n");
       },
       kResume, 1,
       R"(^--resume .*run: the data in .*text\.txt \(fingerprint files-)" + kHash +
           R"(\) are not the data this run started from \(files-)" + kHash +
           R"(, .*run/run\.json data_fingerprint\); restore .*text\.txt as it was, or start a new run on the new data$)"},
      {"IntegrityResumeDataEditedInPlace",
       [](Sandbox& s) {
         unfinished_run(s);
         std::string t = s.read(s.text());
         t[100] = t[100] == 'x' ? 'y' : 'x';  // same size
         s.write(s.text(), t);
       },
       kResume, 1, R"(the data in .*text\.txt .* are not the data this run started from)"},
      {"IntegrityRunJsonDataFingerprintNotAString",
       [](Sandbox& s) {
         s.edit_json(unfinished_run(s) / "run.json", [](json& j) { j["data_fingerprint"] = 7; });
       },
       kResume, 1, R"(run\.json: "data_fingerprint" is not a string; the run directory is damaged)"},
      // ---- the step log against what the run recorded -----------------------------------------
      {"IntegrityReplayLogCut", [](Sandbox& s) { keep_lines(s, s.run(), 2); }, kReplay, 1,
       R"(^--log .*run: zo_log\.jsonl holds [0-9]+ bytes \(2 step records\), fewer than the [0-9]+ bytes of 3 steps that .*checkpoint-3/state\.json records \(log_bytes\): the log was cut; restore it from a copy, or rebuild only its first steps with --steps 2$)"},
      {"IntegrityReplayLogCutBesideRunJsonAlone",
       [](Sandbox& s) {
         // The log's head copied beside run.json: no checkpoint or summary says how far it got.
         const fs::path r = s.root() / "head";
         fs::create_directories(r);
         fs::copy_file(s.run() / "run.json", r / "run.json");
         fs::copy_file(s.run() / "zo_log.jsonl", r / "zo_log.jsonl");
         keep_lines(s, r, 2);
       },
       "replay --model {M} --log {S}/head --out {S}/rebuilt", 1,
       R"(zo_log\.jsonl holds 2 step records, but the run took 3 steps \(--steps in .*head/run\.json, and no checkpoint or summary\.json records its log\); restore the whole log, or rebuild only its first steps with --steps 2$)"},
      {"IntegrityReplayEditedG", [](Sandbox& s) { edit_record(s, 2, "g"); }, kReplay, 1,
       R"(^--log .*run: zo_log\.jsonl: its first 3 records \(steps 0 to 2\) hash to )" + kHash +
           ", not the " + kHash +
           R"( that .*checkpoint-3/state\.json records \(log_hash\): a record was changed; restore zo_log\.jsonl from a copy$)"},
      {"IntegrityReplayEditedLr", [](Sandbox& s) { edit_record(s, 3, "lr"); }, kReplay, 1,
       R"(zo_log\.jsonl: its first 3 records \(steps 0 to 2\) hash to .* \(log_hash\): a record was changed)"},
      {"IntegrityReplayEditedWithoutCheckpoints",
       [](Sandbox& s) {
         // A run kept as its log alone (the checkpoints removed): summary.json records it.
         fs::remove_all(s.run() / "checkpoint-3");
         fs::remove(s.run() / "latest");
         edit_record(s, 1, "g");
       },
       kReplay, 1, R"(hash to .*, not the .* that .*run/summary\.json records \(log_hash\))"},
      {"IntegrityReplayRecordAppended",
       [](Sandbox& s) {
         const fs::path log = s.run() / "zo_log.jsonl";
         std::string t = s.read(log);
         const size_t last = t.rfind('\n', t.size() - 2) + 1;
         std::string rec = t.substr(last);
         rec.replace(rec.find("\"step\":2"), 8, "\"step\":3");
         s.write(log, t + rec);
       },
       kReplay, 1,
       R"(zo_log\.jsonl holds [0-9]+ bytes, more than the [0-9]+ of the run's 3 steps that .*state\.json records \(log_bytes\): records were added after the run ended)"},
      {"IntegrityReplayStepsBeyondTheLog", {}, kReplay + " --steps 5", 1,
       R"(^--steps 5: --log .*run: zo_log\.jsonl holds only 3 step records; give --steps 3 or less$)"},
      {"IntegrityReplayStepsZero", {}, kReplay + " --steps 0", 1,
       R"(^--steps must be a whole number from 1 to)"},
      {"IntegrityResumeEditedG",
       [](Sandbox& s) {
         unfinished_run(s);
         edit_record(s, 2, "g");
       },
       kResume, 1,
       R"(^.*run/zo_log\.jsonl: its first 3 records \(steps 0 to 2\) hash to .* that .*checkpoint-3/state\.json records \(log_hash\): a record was changed; zof does not append to a damaged log)"},
      {"IntegrityResumeEditedLr",
       [](Sandbox& s) {
         unfinished_run(s);
         edit_record(s, 1, "lr");
       },
       kResume, 1, R"(zo_log\.jsonl: its first 3 records .* \(log_hash\): a record was changed)"},
      {"IntegrityStateLogHashMalformed",
       [](Sandbox& s) {
         s.edit_json(unfinished_run(s) / "checkpoint-3" / "state.json",
                     [](json& j) { j["log_hash"] = "md5:0"; });
       },
       kResume, 1,
       R"(state\.json: "log_hash" is "md5:0"; it must be "fnv1a64:" and 16 hex digits; the run directory is damaged)"},
      {"IntegrityStateWindowFromPastTheStep",
       [](Sandbox& s) {
         s.edit_json(unfinished_run(s) / "checkpoint-3" / "state.json",
                     [](json& j) { j["window_from"] = 7; });
       },
       kResume, 1,
       R"(state\.json: "window_from" is 7; it must be an integer from 0 to the step before 3; the run directory is damaged)"},
      {"IntegritySummaryLogBytesNegative",
       [](Sandbox& s) {
         fs::remove_all(s.run() / "checkpoint-3");
         fs::remove(s.run() / "latest");
         s.edit_json(s.run() / "summary.json", [](json& j) { j["log_bytes"] = -4; });
       },
       kReplay, 1, R"(summary\.json: "log_bytes" is -4; it must be an integer from 0 to)"},
      // ---- flags that would be silently unused ----------------------------------------------
      {"IntegrityJvpWithEps", {}, "finetune {F} --estimator jvp --eps 0.5 --out {S}/o", 1,
       R"(^--estimator jvp computes the directional derivative exactly and takes no --eps .*: drop --eps, or use --estimator spsa$)"},
      {"IntegrityGenerateBeyondTheContext", {}, "generate --model {M} --max-new-tokens 1000", 1,
       R"(^--max-new-tokens 1000 does not fit: the prompt's 1 token\(s\) and the new tokens exceed the model's context of 512 tokens \(max_position_embeddings in .*model/config\.json\); use --max-new-tokens 512 or less$)"},
      {"IntegrityGenerateLongPromptBeyondTheContext", {},
       "generate --model {M} --prompt 'Once upon a time there was a cat' --max-new-tokens 510",
       1, R"(^--max-new-tokens 510 does not fit: the prompt's [0-9]+ token\(s\))"},
  };
}

ZOF_FAULT_TABLE(IntegrityFaults, integrity_cases());

// ---- what passes still resumes and replays exactly -----------------------------------------

// The exit status of zof with these arguments (output discarded).
int zof_run(const std::string& args) {
  return zof::test::run_command(zof::faults::zof_binary() + " " + args + " </dev/null").code;
}

// A run from before the fields (no data_fingerprint, log_hash or summary log fields, and no
// seal: run.json's format, seal and state.json's run_seal) resumes and replays as before, and
// the resumed run's checkpoints record log_hash and run_seal again.
TEST(IntegrityExact, OlderRunWithoutTheFieldsResumesAndReplays) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("IntegrityExactOlderRun");
  const fs::path r = unfinished_run(s);
  s.edit_json(r / "run.json", [](json& j) {
    j.erase("data_fingerprint");
    j.erase("format");
    j.erase("seal");
  });
  s.edit_json(r / "checkpoint-3" / "state.json", [](json& j) {
    j.erase("log_hash");
    j.erase("run_seal");
  });
  s.edit_json(r / "summary.json", [](json& j) {
    j.erase("log_bytes");
    j.erase("log_hash");
  });
  ASSERT_EQ(zof_run("finetune --resume " + shell_quoted(r)), 0);
  EXPECT_TRUE(json::parse(s.read(r / "checkpoint-5" / "state.json")).contains("log_hash"));
  EXPECT_TRUE(json::parse(s.read(r / "checkpoint-5" / "state.json")).contains("run_seal"));
  ASSERT_EQ(zof_run("replay --model " + shell_quoted(s.model()) + " --log " + shell_quoted(r) +
                    " --out " + shell_quoted(s.root() / "rebuilt")),
            0);
  EXPECT_TRUE(s.read(r / "model.safetensors") == s.read(s.root() / "rebuilt" / "model.safetensors"))
      << "the replayed weights differ from the resumed run's";
}

// replay --steps N rebuilds the weights of the run's first N steps: those of a run of N steps.
TEST(IntegrityExact, ReplayOfAPrefixIsTheShorterRun) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("IntegrityExactPrefix");
  const fs::path r = s.run();
  std::string flags = s.run_flags();
  flags.replace(flags.find("--steps 3"), 9, "--steps 2");
  ASSERT_EQ(zof_run("finetune " + flags + " --out " + shell_quoted(s.root() / "two")), 0);
  ASSERT_EQ(zof_run("replay --model " + shell_quoted(s.model()) + " --log " + shell_quoted(r) +
                    " --steps 2 --out " + shell_quoted(s.root() / "rebuilt")),
            0);
  EXPECT_TRUE(s.read(s.root() / "two" / "model.safetensors") ==
              s.read(s.root() / "rebuilt" / "model.safetensors"))
      << "replay --steps 2 differs from a run of 2 steps";
}

}  // namespace
