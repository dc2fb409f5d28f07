// Learning, end to end: the README demo's fine-tuning of stories260K on Tiny Shakespeare lowers
// held-out perplexity by at least a third, and the real SmolLM2 rises on SST-2 (label `slow`:
// about a minute for the first, six for the second, on 2 cores).
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common.h"

namespace fs = std::filesystem;

TEST(Learning, ShakespearePerplexityDropsByAThird) {
  const std::string model = zof::test::assets_dir() + "/models/stories260K";
  const std::string data = zof::test::assets_dir() + "/data/tinyshakespeare/input.txt";
  ZOF_REQUIRE_PATH(model);
  ZOF_REQUIRE_PATH(data);
  const fs::path out = fs::temp_directory_path() / ("zof_learn_" + std::to_string(::getpid()));
  fs::remove_all(out);
  // The demo's settings (scripts/demo.sh) with fewer steps.
  auto r = zof::test::run_command(zof::test::zof_binary() + " finetune --model " + model +
                                  " --task text --data " + data + " --out " + out.string() +
                                  " --steps 120 --batch 16 --seq-len 128 --lr 1e-4 --eps 1e-3 "
                                  "--seed 0 --eval-examples 64 --json");
  fs::remove_all(out);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string last = r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1);
  auto s = nlohmann::json::parse(last);
  const double before = s["eval"]["before"], after = s["eval"]["after"];
  RecordProperty("ppl_before", std::to_string(before));
  RecordProperty("ppl_after", std::to_string(after));
  EXPECT_GT(before, 100);  // Shakespeare is far from TinyStories
  EXPECT_LT(after, before * 2 / 3) << "before " << before << " after " << after;
}

// The demo's run cut to 250 steps (stories260K on Tiny Shakespeare, seed 0) with extra flags:
// its exit, stderr, --json summary and the first 4 KB of the saved model.safetensors ("" when
// none was written). The run directory is removed.
struct ShortRun {
  int code = -1;
  std::string err, header;
  nlohmann::json summary;
};
ShortRun short_demo_run(const std::string& flags, const std::string& tag) {
  const std::string model = zof::test::assets_dir() + "/models/stories260K";
  const std::string data = zof::test::assets_dir() + "/data/tinyshakespeare/input.txt";
  const fs::path out = fs::temp_directory_path() / ("zof_learn_" + tag + std::to_string(::getpid()));
  fs::remove_all(out);
  auto r = zof::test::run_command(zof::test::zof_binary() + " finetune --model " + model +
                                  " --task text --data " + data + " --out " + out.string() +
                                  " --steps 250 --batch 16 --seq-len 128 --lr 1e-4 --eps 1e-3 "
                                  "--seed 0 --eval-examples 64 --no-report --json " + flags);
  ShortRun run;
  run.code = r.code, run.err = r.err;
  if (fs::exists(out / "model.safetensors"))
    run.header = zof::test::read_file((out / "model.safetensors").string()).substr(0, 4096);
  fs::remove_all(out);
  if (r.code == 0) run.summary = nlohmann::json::parse(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
  return run;
}

// bf16 products learn as fp32 does (issue 14): the same run, 250 steps, with --dtype bf16 and
// --dtype fp32 (fp32 master weights in both), ends within 3% in held-out perplexity; and bf16
// really ran (a different number). bench/dtype_study.sh measured +0.28% at 1000 steps.
TEST(Learning, Bf16ProductsLearnAsFp32) {
  ZOF_REQUIRE_PATH(zof::test::assets_dir() + "/models/stories260K");
  ZOF_REQUIRE_PATH(zof::test::assets_dir() + "/data/tinyshakespeare/input.txt");
  double after[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const char* dtype = i == 0 ? "fp32" : "bf16";
    const ShortRun r = short_demo_run(std::string("--dtype ") + dtype, dtype);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.summary["compute"]["dtype"], dtype);
    after[i] = r.summary["eval"]["after"];
    RecordProperty(std::string("ppl_after_") + dtype, std::to_string(after[i]));
  }
  EXPECT_NEAR(after[1], after[0], 0.03 * after[0]);
  EXPECT_NE(after[1], after[0]);
  EXPECT_LT(after[1], 100);  // it learned: 190 before
}

// A bf16 master learns near the fp32 one (issue 14): 250 steps of the same run with --master bf16
// (fp32 products) end within 1.5% in held-out perplexity with the default rounding window
// (--round-every auto: 8; measured +0.69%), closer than rounding every update (--round-every 1,
// measured +1.8%: stochastic rounding's noise, paid at every step). The saved model is the bf16
// master itself, and it learned. At the demo's 1000 steps bench/dtype_study.sh measured +1.27%
// with the window and +3.64% without.
TEST(Learning, Bf16MasterLearnsNearFp32) {
  ZOF_REQUIRE_PATH(zof::test::assets_dir() + "/models/stories260K");
  ZOF_REQUIRE_PATH(zof::test::assets_dir() + "/data/tinyshakespeare/input.txt");
  struct Run {
    const char* tag;
    const char* flags;
    const char* master;
    int round_every;
  };
  const Run runs[] = {{"master_fp32", "--master fp32", "fp32", 1},
                      {"master_bf16", "--master bf16", "bf16", 8},
                      {"master_bf16_every1", "--master bf16 --round-every 1", "bf16", 1}};
  double after[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    const Run& run = runs[i];
    const ShortRun r = short_demo_run(std::string("--dtype fp32 ") + run.flags, run.tag);
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_FALSE(r.header.empty());
    EXPECT_EQ(r.summary["master"], run.master);
    EXPECT_EQ(r.summary["round_every"], run.round_every);
    EXPECT_EQ(r.summary["save_dtype"], run.master);  // auto: the master's dtype
    EXPECT_NE(r.header.find(i == 0 ? "\"F32\"" : "\"BF16\""), std::string::npos);
    after[i] = r.summary["eval"]["after"];
    RecordProperty(std::string("ppl_after_") + run.tag, std::to_string(after[i]));
  }
  EXPECT_NEAR(after[1], after[0], 0.015 * after[0]);
  EXPECT_NE(after[1], after[0]);
  EXPECT_LT(std::fabs(after[1] - after[0]), std::fabs(after[2] - after[0]))
      << "the rounding window did not bring the bf16 master closer to fp32";
  EXPECT_NEAR(after[2], after[0], 0.03 * after[0]);
  EXPECT_LT(after[1], 100);  // it learned: 190 before
}

// A real pretrained model learns a real task (issue 30 §3): SmolLM2-135M-Instruct (converted by
// scripts/get_smollm2.sh, run by setup for the tests) on SST-2 with MeZO's protocol, 100 steps at
// lr 1e-5, scored on all 872 dev examples before and after. bench/RESULTS.md ("SmolLM2 learns
// SST-2") measured 0.516 -> 0.571 at step 100 (0.546 at 50, 0.631 at 200): the bound of 0.03
// sits well below the measured 0.055 (another CPU's rounding moves the run a little) and above
// the 0.017 standard error of an accuracy on 872 examples. About 6 minutes on 2 cores.
TEST(Learning, SmolLM2RisesAboveZeroShotOnSst2) {
  const char* env = std::getenv("ZOF_SMOLLM2_DIR");
  const std::string model = env ? env : zof::test::source_dir() + "/build/models/SmolLM2-135M-Instruct";
  const std::string data = zof::test::assets_dir() + "/data/sst2";
  ZOF_REQUIRE_PATH(model + "/model.safetensors");
  ZOF_REQUIRE_PATH(data + "/dev.tsv");
  const fs::path out = fs::temp_directory_path() / ("zof_learn_sst2_" + std::to_string(::getpid()));
  fs::remove_all(out);
  auto r = zof::test::run_command(
      zof::test::zof_binary() + " finetune --model " + model + " --task sst2 --data " + data +
      " --objective classification --steps 100 --lr 1e-5 --eps 1e-3 --batch 16 --seed 0 "
      "--train-examples 1000 --eval-examples 872 --threads 2 --seq-len 256 --dtype fp32 "
      "--no-report --json --out " + out.string());
  fs::remove_all(out);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto s = nlohmann::json::parse(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
  const double before = s["eval"]["before"], after = s["eval"]["after"];
  RecordProperty("accuracy_before", std::to_string(before));
  RecordProperty("accuracy_after", std::to_string(after));
  EXPECT_NEAR(before, 450.0 / 872, 1.5 / 872);  // zero-shot: 450 right, as transformers scores it
  EXPECT_GT(after, before + 0.03) << "before " << before << " after " << after;
}
