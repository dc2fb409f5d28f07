// Bad flags and flag files: what the parser refuses (unknown flags, missing values, no command),
// numbers out of range or beyond float's range, files of the wrong kind (a directory, a FIFO,
// /dev/zero) for --config, --data and --text, and --resume with flags the run would ignore. Each
// is one line naming the flag and what it takes, exit 1, before anything is loaded or created.
#include <sys/stat.h>

#include "faults/fault_table.h"

namespace {

using zof::faults::Case;
using zof::faults::Sandbox;

// A short text run into a fresh directory that the refusal must not create.
const std::string kRun = "finetune {F} --out {S}/out";

void fifo(Sandbox& s, const std::string& name) {
  ASSERT_EQ(::mkfifo((s.root() / name).c_str(), 0600), 0) << name;
}

std::vector<Case> flag_cases() {
  return {
      // ---- the parser ---------------------------------------------------------------------
      {"FlagUnknown", {}, "generate --model {M} --max-new-tokns 2", 1,
       R"(^--max-new-tokns is not a flag of zof generate \(see zof generate --help\)$)"},
      {"FlagUnknownFinetuneJson", {}, kRun + " --stepz 3 --json", 1,
       R"(^--stepz is not a flag of zof finetune)"},
      {"FlagMissingValue", {}, "generate --model", 1, R"(^--model needs a value)"},
      {"FlagMissingValueFinetune", {}, kRun + " --steps", 1, R"(^--steps needs a value)"},
      {"FlagMissingRequired", {}, "eval --model {M}", 1, R"(^zof eval needs --text)"},
      {"FlagExtraPositional", {}, "generate --model {M} stray --max-new-tokens 2", 1,
       R"(^unexpected argument 'stray': zof generate takes flags only)"},
      {"FlagNoCommand", {}, "", 1, R"(^no command given; zof takes one of generate, eval)"},
      {"FlagUnknownCommand", {}, "finetuen --model {M}", 1, R"(^unknown command 'finetuen')"},
      {"FlagBeforeCommand", {}, "--steps 3 finetune", 1,
       R"(^--steps is not a flag of zof; flags follow the command)"},
      {"FlagNotAWholeNumber", {}, kRun + " --steps abc --json", 1,
       R"(^--steps must be a whole number from 1 to 4294967295, not 'abc'$)"},
      {"FlagFractionForWholeNumber", {}, kRun + " --batch 1.5", 1,
       R"(^--batch must be a whole number from 1 to 1048576, not 1\.5$)"},

      // ---- --dtype -------------------------------------------------------------------------
      {"FlagDtypeUnknown", {}, kRun + " --dtype fp16 --json", 1,
       R"(^--dtype must be auto, bf16 or fp32, not 'fp16'$)"},
      {"FlagDtypeUnknownEval", {}, "eval --model {M} --text {T} --dtype half", 1,
       R"(^--dtype must be auto, bf16 or fp32, not 'half'$)"},
      {"FlagDtypeJvpBf16", {}, kRun + " --estimator jvp --dtype bf16", 1,
       R"(^--estimator jvp computes in fp32 only; use --dtype fp32 \(or auto\), or --estimator spsa for bf16$)"},

      // ---- ranges, in words -----------------------------------------------------------------
      {"FlagStepsZero", {}, kRun + " --steps 0 --json", 1,
       R"(^--steps must be a whole number from 1 to 4294967295, not 0$)"},
      {"FlagStepsBeyondInt64", {}, kRun + " --steps 99999999999999999999", 1,
       R"(^--steps must be a whole number from 1 to 4294967295, not 99999999999999999999$)"},
      {"FlagQueriesRange", {}, kRun + " --queries 2000", 1,
       R"(^--queries must be a whole number from 1 to 1024, not 2000$)"},
      {"FlagQueriesBeyondInt", {}, kRun + " --queries 99999999999", 1,
       R"(^--queries must be a whole number from 1 to 1024, not 99999999999$)"},
      {"FlagMicroBatchesAboveBatch", {}, kRun + " --micro-batches 3", 1,
       R"(^--micro-batches must be a whole number from 1 to --batch \(2\), not 3$)"},
      {"FlagSeqLenOne", {}, kRun + " --seq-len 1", 1,
       R"(^--seq-len must be a whole number from 2 to 1048576, not 1$)"},
      {"FlagWarmupNegative", {}, kRun + " --warmup -4", 1,
       R"(^--warmup must be a whole number of at least 0, not -4$)"},
      {"FlagEvalEveryNegative", {}, kRun + " --eval-every -1", 1,
       R"(^--eval-every must be a whole number of at least 0 \(0: before and after only\), not -1$)"},
      {"FlagMaxBadStepsZero", {}, kRun + " --max-bad-steps 0", 1,
       R"(^--max-bad-steps must be a whole number of at least 1, not 0$)"},
      {"FlagThreadsNegative", {}, kRun + " --threads -1", 1,
       R"(^--threads must be a whole number from 0 to 4096 \(0: all cores\), not -1$)"},
      {"FlagPipelineStagesZero", {}, kRun + " --pipeline-stages 0", 1,
       R"(^--pipeline-stages must be a whole number from 1 to 4096, not 0$)"},
      {"FlagDistTimeoutNegative", {}, kRun + " --dist-timeout -1", 1,
       R"(^--dist-timeout must be a finite number of at least 0 \(seconds; 0: wait for ever\), not -1$)"},
      {"FlagScheduleUnknown", {}, kRun + " --schedule exponential", 1,
       R"(^--schedule must be constant, linear or cosine, not 'exponential'$)"},
      {"FlagTaskUnknown", {}, kRun + " --task glue", 1, R"(^unknown task "glue" \(--task\))"},

      // ---- floats: finite, within float's range ----------------------------------------------
      {"FlagWeightDecayNan", {}, kRun + " --weight-decay nan --json", 1,
       R"(^--weight-decay must be a finite number of at least 0, not nan$)"},
      {"FlagLrNan", {}, kRun + " --lr nan", 1, R"(^--lr must be a finite number of at least 0, not nan$)"},
      {"FlagLrInf", {}, kRun + " --lr inf", 1, R"(^--lr must be a finite number of at least 0, not inf$)"},
      {"FlagLrBeyondFloat", {}, kRun + " --lr 1e39", 1,
       R"(^--lr must be a finite number of at least 0, not 1e39 \(beyond float's range, about 3\.4e38\)$)"},
      {"FlagLrBelowFloat", {}, kRun + " --lr 1e-400", 1,
       R"(^--lr must be .*, not 1e-400 \(below the smallest positive float, about 1\.2e-38\)$)"},
      {"FlagEpsBelowFloat", {}, kRun + " --eps 1e-50", 1,
       R"(^--eps must be a finite number above 0 \(the perturbation's scale\), not 1e-50 \(below the smallest positive float, about 1\.2e-38: too small to perturb the weights\)$)"},
      {"FlagEpsZero", {}, kRun + " --eps 0", 1, R"(^--eps must be a finite number above 0 .*, not 0$)"},
      {"FlagBeta1Nan", {}, kRun + " --optimizer momentum --beta1 nan", 1,
       R"(^--beta1 must be in \[0, 1\), not nan$)"},
      {"FlagBeta2One", {}, kRun + " --optimizer adam --beta2 1", 1,
       R"(^--beta2 must be in \[0, 1\), not 1$)"},
      {"FlagAdamEpsZero", {}, kRun + " --optimizer adam --adam-eps 0", 1,
       R"(^--adam-eps must be a finite number above 0, not 0$)"},
      {"FlagSparsityNan", {}, kRun + " --sparsity nan", 1,
       R"(^--sparsity must be in \[0, 1\) \(the fraction of each weight matrix left unperturbed\), not nan$)"},
      {"FlagSeedNegative", {}, kRun + " --seed -1", 1,
       R"(^--seed must be a whole number from 0 to 18446744073709551615, not -1$)"},
      {"FlagSeedBeyondUint64", {}, kRun + " --seed 18446744073709551616", 1,
       R"(^--seed must be a whole number from 0 to 18446744073709551615, not 18446744073709551616$)"},

      // ---- generate, eval, replay ------------------------------------------------------------
      {"FlagGenerateSeedNegative", {}, "generate --model {M} --seed -1 --json", 1,
       R"(^--seed must be a whole number from 0 to 18446744073709551615, not -1$)"},
      {"FlagGenerateSeedFraction", {}, "generate --model {M} --seed 2.5", 1,
       R"(^--seed must be a whole number from 0 to 18446744073709551615, not 2\.5$)"},
      {"FlagTemperatureNan", {}, "generate --model {M} --temperature nan --json", 1,
       R"(^--temperature must be a number from 0 to 100 \(0: greedy\), not nan$)"},
      {"FlagTemperatureNegative", {}, "generate --model {M} --temperature -1", 1,
       R"(^--temperature must be a number from 0 to 100 \(0: greedy\), not -1$)"},
      {"FlagTemperatureBeyondFloat", {}, "generate --model {M} --temperature 1e39", 1,
       R"(^--temperature must be .*, not 1e39 \(beyond float's range, about 3\.4e38\)$)"},
      {"FlagTopPNan", {}, "generate --model {M} --top-p nan", 1,
       R"(^--top-p must be in \(0, 1\] \(.*\), not nan$)"},
      {"FlagTopPZero", {}, "generate --model {M} --top-p 0", 1, R"(^--top-p must be in \(0, 1\] .*, not 0$)"},
      {"FlagMaxNewTokensZero", {}, "generate --model {M} --max-new-tokens 0", 1,
       R"(^--max-new-tokens must be a whole number from 1 to 1048576, not 0$)"},
      {"FlagEvalBatchZero", {}, "eval --model {M} --text {T} --batch 0 --json", 1,
       R"(^--batch must be a whole number from 1 to 4096, not 0$)"},
      {"FlagEvalSeqLenOne", {}, "eval --model {M} --text {T} --seq-len 1", 1,
       R"(^--seq-len must be a whole number from 2 to 1048576, not 1$)"},
      {"FlagEvalMaxWindowsNegative", {}, "eval --model {M} --text {T} --max-windows -1", 1,
       R"(^--max-windows must be a whole number of at least 0 \(0: all\), not -1$)"},
      {"FlagEvalThreadsNotANumber", {}, "eval --model {M} --text {T} --threads many", 1,
       R"(^--threads must be a whole number from 0 to 4096 \(0: all cores\), not 'many'$)"},
      {"FlagReplayThreadsNegative", {}, "replay --model {M} --log {R} --out {S}/rebuilt --threads -2 --json", 1,
       R"(^--threads must be a whole number from 0 to 4096 \(0: all cores\), not -2$)"},

      // ---- --config ----------------------------------------------------------------------------
      {"FlagConfigDirectory",
       [](Sandbox& s) { std::filesystem::create_directory(s.root() / "conf.d"); },
       "finetune --config {S}/conf.d " + std::string("{F} --out {S}/out"), 1,
       R"(^--config .*/conf\.d is a directory; --config takes a file of `key = value` lines$)"},
      {"FlagConfigFifo", [](Sandbox& s) { fifo(s, "conf.fifo"); },
       "finetune --config {S}/conf.fifo {F} --out {S}/out", 1,
       R"(^--config .*/conf\.fifo is a FIFO \(named pipe\), not a file; --config takes a file)",
       {}, {}, 30},
      {"FlagConfigDevZero", {}, "finetune --config /dev/zero {F} --out {S}/out", 1,
       R"(^--config /dev/zero is a device, not a file; --config takes a file)", {}, {}, 30},
      {"FlagConfigMissing", {}, "finetune --config {S}/none.toml {F} --out {S}/out", 1,
       R"(^--config .*/none\.toml: no such file \(--config takes a file)"},
      {"FlagConfigUnknownKey",
       [](Sandbox& s) { s.write(s.root() / "run.toml", "# a run\nstepz = 3\n"); },
       "finetune --config {S}/run.toml {F} --out {S}/out", 1,
       R"(^--stepz \(--config .*/run\.toml line 2\) is not a flag of zof finetune)"},
      {"FlagConfigEmptyValue",
       [](Sandbox& s) { s.write(s.root() / "run.toml", "steps =\n"); },
       "finetune --config {S}/run.toml {F} --out {S}/out", 1,
       R"(^--config .*/run\.toml line 1: `steps` has no value)"},
      {"FlagConfigValueNan",
       [](Sandbox& s) { s.write(s.root() / "run.toml", "lr = nan\n"); },
       "finetune --config {S}/run.toml {F} --out {S}/out --json", 1,
       R"(^--lr must be a finite number of at least 0, not nan$)"},
      {"FlagConfigBooleanNotABoolean",
       [](Sandbox& s) { s.write(s.root() / "run.toml", "one_sided = maybe\n"); },
       "finetune --config {S}/run.toml {F} --out {S}/out", 1,
       R"(^--one-sided \(--config .*/run\.toml line 1\) is a switch: give it alone \(or =true, =false\), not with 'maybe'$)"},
      {"FlagSwitchWithValue", {}, "generate --model {M} --json=maybe", 1,
       R"(^--json is a switch: give it alone \(or =true, =false\), not with 'maybe'$)"},

      // ---- --data, --text: the kind of path each takes --------------------------------------
      {"FlagDataDirectoryForText",
       [](Sandbox& s) { std::filesystem::create_directory(s.root() / "data.d"); },
       kRun + " --data {S}/data.d --json", 1,
       R"(^--data .*/data\.d is a directory; --task text reads one plain-text file$)"},
      {"FlagDataFifo", [](Sandbox& s) { fifo(s, "data.fifo"); },
       kRun + " --data {S}/data.fifo", 1,
       R"(^--data .*/data\.fifo is a FIFO \(named pipe\), not a file; --task text reads one plain-text file$)",
       {}, {}, 30},
      {"FlagDataDevZero", {}, kRun + " --data /dev/zero", 1,
       R"(^--data /dev/zero is a device, not a file; --task text reads one plain-text file$)", {}, {}, 30},
      {"FlagDataMissing", {}, kRun + " --data {S}/none.txt", 1,
       R"(^--data .*/none\.txt: no such file \(--task text reads one plain-text file\)$)"},
      {"FlagDataFifoForSst2", [](Sandbox& s) { fifo(s, "sst2.fifo"); },
       kRun + " --task sst2 --data {S}/sst2.fifo", 1,
       R"(^--data .*/sst2\.fifo is a FIFO \(named pipe\), not a file; --task sst2 reads a directory \(train\.tsv and dev\.tsv\) or one TSV file$)",
       {}, {}, 30},
      {"FlagDataDevZeroForCopa", {}, kRun + " --task copa --data /dev/zero", 1,
       R"(^--data /dev/zero is a device, not a file; --task copa reads a directory \(train\.jsonl and val\.jsonl\) or one JSONL file$)",
       {}, {}, 30},
      {"FlagTextDirectory", {}, "eval --model {M} --text {S} --json", 1,
       R"(^--text .* is a directory; --text takes one plain-text file$)"},
      {"FlagTextFifo", [](Sandbox& s) { fifo(s, "text.fifo"); },
       "eval --model {M} --text {S}/text.fifo", 1,
       R"(^--text .*/text\.fifo is a FIFO \(named pipe\), not a file; --text takes one plain-text file$)",
       {}, {}, 30},
      {"FlagTextDevZero", {}, "eval --model {M} --text /dev/zero", 1,
       R"(^--text /dev/zero is a device, not a file; --text takes one plain-text file$)", {}, {}, 30},

      // ---- --resume with the flags that define a run ------------------------------------------
      {"FlagResumeWithRunFlags", {}, "finetune --resume {R} --steps 320 --lr 0.5", 1,
       R"(^--resume .* continues the run with the options it was started with, so --steps 320 and --lr 0\.5 would be ignored \(the run has --steps 3 and --lr 1e-06\); drop them, or start a new run with --out DIR$)"},
      {"FlagResumeWithConfigFlags",
       [](Sandbox& s) { s.write(s.root() / "more.toml", "lr = 0.5\n"); },
       "finetune --resume {R} --config {S}/more.toml --threads 1 --json", 1,
       R"(^--resume .* so --lr 0\.5 \(--config .*/more\.toml line 1\) would be ignored \(the run has --lr 1e-06\); drop it)"},
      {"FlagResumeWithOneSided", {}, "finetune --resume {R} --one-sided --json", 1,
       R"(so --one-sided would be ignored \(the run has no --one-sided\))"},
      {"FlagResumeWithData", {}, "finetune --resume {R} --data {S}/other.txt --task text", 1,
       R"(so --data .*/other\.txt would be ignored \(the run has --data .*/text\.txt\))"},
  };
}

ZOF_FAULT_TABLE(FlagFaults, flag_cases());

}  // namespace
