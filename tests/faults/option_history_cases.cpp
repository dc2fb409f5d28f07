// run.json as older zof versions wrote it still resumes, and continues exactly as the run would
// have: each option added since (newest first: --save-format, --round-every, --master, --tf32,
// --save-dtype, --dtype, --z, --estimator, --objective) is taken from the option table's
// `before` value when run.json lacks it, which must be what those runs computed.
#include <fstream>

#include "common.h"
#include "faults/fault_table.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::faults::Sandbox;
using zof::faults::shell_quoted;
using zof::test::run_command;

TEST(OptionHistory, OlderRunJsonFilesResumeToTheSameModel) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("OptionHistory");
  const std::string zof = zof::faults::zof_binary();
  // What every older zof computed, spelled out for the new one, on SST-2: an older run.json
  // without --objective trained on the answer's tokens (lm), where today's default (auto) is
  // MeZO's classification, so a wrong `before` changes the model.
  const std::string sst2 = zof::faults::assets_dir() + "/data/sst2";
  ZOF_REQUIRE_PATH(sst2 + "/train.tsv");
  const std::string flags = "--model " + shell_quoted(s.model()) + " --task sst2 --data " +
                            shell_quoted(sst2) + " --batch 4 --seq-len 64 --lr 1e-3 "
                            "--train-examples 32 --eval-examples 4 --threads 1 --no-report "
                            "--steps 4 --save-every 2 --dtype fp32 --save-dtype input "
                            "--objective lm --round-every 1";
  const fs::path whole = s.root() / "whole", killed = s.root() / "killed";
  ASSERT_EQ(run_command(zof + " finetune " + flags + " --out " + shell_quoted(whole)).code, 0);
  const auto k = run_command("ZOF_FAULT_KILL_AT_STEP=3 " + zof + " finetune " + flags +
                             " --out " + shell_quoted(killed));
  ASSERT_EQ(k.code, 137) << k.err;
  ASSERT_TRUE(fs::exists(killed / "checkpoint-2"));
  const std::string want = s.read(whole / "model.safetensors");

  const char* const added[] = {"save_format", "round_every", "master",    "tf32", "save_dtype",
                               "dtype",       "z",           "estimator", "objective"};
  for (size_t level = 1; level <= std::size(added); ++level) {
    const fs::path older = s.root() / ("older" + std::to_string(level));
    fs::copy(killed, older, fs::copy_options::recursive);
    // An older zof wrote neither the seal nor the format, nor these options.
    s.edit_json(older / "run.json", [&](json& j) {
      j.erase("seal");
      j.erase("format");
      for (size_t i = 0; i < level; ++i) j["options"].erase(added[i]);
      j["options"]["out"] = older.string();
    });
    s.edit_json(older / "checkpoint-2" / "state.json", [](json& j) { j.erase("run_seal"); });
    SCOPED_TRACE(std::string("run.json without ") + added[level - 1] + " and those after it");
    const auto r = run_command(zof + " finetune --resume " + shell_quoted(older));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("resuming at step 2"), std::string::npos) << r.err;
    EXPECT_EQ(s.read(older / "model.safetensors"), want);
  }
}

}  // namespace
