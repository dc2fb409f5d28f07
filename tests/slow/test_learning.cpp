// Learning, end to end: the README demo's fine-tuning of stories260K on Tiny Shakespeare lowers
// held-out perplexity by at least a third (label `slow`: about a minute on 2 cores).
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
