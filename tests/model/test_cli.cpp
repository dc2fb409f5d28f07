// The zof binary as a user meets it: the known greedy story, perplexity of stories260K on
// TinyStories and Tiny Shakespeare, --json, --help, and one-line errors for bad input.
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common.h"
#include "zof/error.h"
#include "zof/trainer.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::test::run_command;

namespace {

std::string stories() { return zof::test::assets_dir() + "/models/stories260K"; }

using zof::test::last_json;

TEST(Cli, GreedyStoryFromBos) {
  ZOF_REQUIRE_PATH(stories());
  // fp32 products, as transformers' greedy text (auto would pick bf16 on an AMX machine).
  auto r = run_command(zof::test::zof_binary() + " generate --model " + stories() +
                       " --prompt \"\" --temperature 0 --max-new-tokens 60 --dtype fp32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time, there was a little girl named Lily. She loved to play "
                        "outside in the park. One day, she saw a big, red ball.", 0),
            0u)
      << r.out;
  auto j = run_command(zof::test::zof_binary() + " generate --model " + stories() +
                       " --prompt \"Once upon a time\" --max-new-tokens 20 --temperature 0.8 "
                       "--top-p 0.9 --seed 3 --json");
  ASSERT_EQ(j.code, 0) << j.err;
  json g = last_json(j.out);
  EXPECT_EQ(g["new_tokens"], 20);
  EXPECT_EQ(g["text"].get<std::string>().rfind("Once upon a time", 0), 0u);
  // The same seed samples the same text.
  auto j2 = run_command(zof::test::zof_binary() + " generate --model " + stories() +
                        " --prompt \"Once upon a time\" --max-new-tokens 20 --temperature 0.8 "
                        "--top-p 0.9 --seed 3 --json");
  EXPECT_EQ(last_json(j2.out)["ids"], g["ids"]);
}

TEST(Cli, PerplexityOfStories260K) {
  ZOF_REQUIRE_PATH(stories());
  const std::string ts = zof::test::assets_dir() + "/data/tinystories/tinystories_sample_cs336.txt";
  const std::string sh = zof::test::assets_dir() + "/data/tinyshakespeare/input.txt";
  ZOF_REQUIRE_PATH(ts);
  ZOF_REQUIRE_PATH(sh);
  // fp32 products, as the golden's (on an AMX machine auto would pick bf16).
  auto a = run_command(zof::test::zof_binary() + " eval --model " + stories() + " --text " + ts +
                       " --dtype fp32 --json");
  ASSERT_EQ(a.code, 0) << a.err;
  json ja = last_json(a.out);
  // transformers on the same documents and windows (tests/reference/make_golden.py).
  std::ifstream gf(zof::test::source_dir() + "/tests/golden/stories260K/perplexity.json");
  ASSERT_TRUE(gf) << "tests/golden/stories260K/perplexity.json: run make_golden.py";
  const json golden = json::parse(gf);
  ASSERT_EQ(golden["seq_len"].get<int64_t>(), ja["seq_len"].get<int64_t>());
  EXPECT_EQ(ja["tokens"].get<int64_t>(), golden["tokens"].get<int64_t>());
  EXPECT_EQ(ja["windows"].get<int64_t>(), golden["windows"].get<int64_t>());
  // fp32 forwards of ~1e3 tokens: the mean agrees far inside 1e-4.
  EXPECT_NEAR(ja["nll"].get<double>(), golden["nll"].get<double>(), 1e-4);
  EXPECT_NEAR(ja["ppl"].get<double>(), golden["ppl"].get<double>(), 1e-3);
  auto b = run_command(zof::test::zof_binary() + " eval --model " + stories() + " --text " + sh +
                       " --seq-len 256 --max-windows 40 --json");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_GT(last_json(b.out)["ppl"].get<double>(), 10 * ja["ppl"].get<double>());
}

// eval --task scores what finetune's evaluation scores: the same examples, batches and metric.
// A short SST-2 run's "before" is eval --task on the base model, its "after" eval --task on the
// saved model, bit for bit; and only finetune warns of training prompts cut to fit.
TEST(Cli, EvalTaskScoresWhatFinetuneScores) {
  ZOF_REQUIRE_PATH(stories());
  const std::string sst2 = zof::test::assets_dir() + "/data/sst2";
  ZOF_REQUIRE_PATH(sst2);
  const fs::path out = fs::temp_directory_path() / ("zof_eval_task_" + std::to_string(::getpid()));
  fs::remove_all(out);
  const std::string same = " --task sst2 --data " + sst2 + " --eval-examples 48 --seed 5 --dtype fp32";
  auto ft = run_command(zof::test::zof_binary() + " finetune --model " + stories() + same +
                        " --out " + out.string() + " --steps 3 --lr 1e-3 --eps 1e-3 --no-report");
  ASSERT_EQ(ft.code, 0) << ft.err;
  const json summary = last_json(ft.out);
  // stories260K's 512-token vocabulary makes some SST-2 sentences longer than 128 tokens.
  EXPECT_NE(ft.err.find("zof: warning: "), std::string::npos) << ft.err;
  EXPECT_NE(ft.err.find("training examples are longer than --seq-len 128"), std::string::npos);
  auto before = run_command(zof::test::zof_binary() + " eval --model " + stories() + same + " --json");
  ASSERT_EQ(before.code, 0) << before.err;
  EXPECT_EQ(before.err, "");  // no training split is warned of
  const json b = last_json(before.out);
  EXPECT_EQ(b["metric"], "accuracy");
  EXPECT_EQ(b["task"], "sst2");
  EXPECT_EQ(b["value"].get<double>(), summary["eval"]["before"].get<double>()) << summary;
  auto after = run_command(zof::test::zof_binary() + " eval --model " + out.string() + same + " --json");
  ASSERT_EQ(after.code, 0) << after.err;
  EXPECT_EQ(last_json(after.out)["value"].get<double>(), summary["eval"]["after"].get<double>());
  fs::remove_all(out);
}

TEST(Cli, EveryCommandHasHelp) {
  for (const char* cmd : {"", " generate", " eval", " finetune", " replay", " report"}) {
    auto r = run_command(zof::test::zof_binary() + cmd + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("--"), std::string::npos) << cmd;
  }
  // Help wins over flags that would be refused, and --version prints to stdout.
  auto h = run_command(zof::test::zof_binary() + " finetune --steps abc --help");
  EXPECT_EQ(h.code, 0) << h.err;
  EXPECT_NE(h.out.find("--steps INT=1000"), std::string::npos) << h.out;
  auto v = run_command(zof::test::zof_binary() + " --version");
  EXPECT_EQ(v.code, 0);
  EXPECT_EQ(v.out.rfind("zof ", 0), 0u) << v.out;
  EXPECT_TRUE(v.err.empty()) << v.err;
}

// A parse error, a range error and a file error: each one line "zof: error: ...", exit 1
// (CLI11 exited 104-114 with two lines), and with --json the same text as the last stdout line.
TEST(Cli, EveryErrorIsOneLineAndExitOne) {
  const std::string zof = zof::test::zof_binary();
  for (const std::string args :
       {" generate --model x --bogus", " generate --model", " eval --model x", " generate x",
        "", " nonsense", " finetune --steps 0", " generate --model x --seed -1 --json",
        " eval --model x --text /dev/zero --json"}) {
    auto r = run_command(zof + args);
    EXPECT_EQ(r.code, 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("zof: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("Run with --help"), std::string::npos) << args << ": " << r.err;
    if (args.find("--json") != std::string::npos || args.find("finetune") != std::string::npos) {
      const std::string line = r.err.substr(12, r.err.size() - 13);
      EXPECT_EQ(last_json(r.out).value("error", ""), line) << args << ": " << r.out;
    } else {
      EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
    }
  }
}

// The CLI runs itself again with OpenMP's waiting threads passive unless the environment says
// how they wait; run.json's compute records the policy the run had.
TEST(Cli, OpenMpWaitsPassivelyUnlessTheEnvironmentSays) {
  ZOF_REQUIRE_PATH(stories());
  const std::string sh = zof::test::assets_dir() + "/data/tinyshakespeare/input.txt";
  ZOF_REQUIRE_PATH(sh);
  const fs::path dir = fs::temp_directory_path() / ("zof_cli_omp_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (const auto& [env, want] : std::vector<std::pair<std::string, std::string>>{
           {"env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT ", "passive"},
           {"env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active ", "active"}}) {
    const std::string run = (dir / want).string();
    auto r = zof::test::run_command(env + zof::test::zof_binary() + " finetune --model " +
                                    stories() + " --data " + sh + " --out " + run +
                                    " --steps 1 --batch 2 --seq-len 16 --eval-examples 2 "
                                    "--no-report --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const json c = json::parse(zof::test::read_file(run + "/run.json"))["compute"];
    EXPECT_EQ(c.value("omp_wait_policy", ""), want) << c.dump();
  }
  fs::remove_all(dir);
}

// Whole numbers written as decimals or exponents are whole numbers; identical values and the
// layout flags pass --resume, which refuses only what it would ignore.
TEST(Cli, NumbersAndResumeFlagsThatAreAccepted) {
  ZOF_REQUIRE_PATH(stories());
  const std::string sh = zof::test::assets_dir() + "/data/tinyshakespeare/input.txt";
  ZOF_REQUIRE_PATH(sh);
  const fs::path dir = fs::temp_directory_path() / ("zof_cli_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string zof = zof::test::zof_binary();
  auto g = run_command(zof + " generate --model " + stories() + " --max-new-tokens 2e0 --seed 7 "
                       "--temperature 5e-1 --json");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(last_json(g.out)["new_tokens"], 2);
  const std::string run = (dir / "run").string();
  auto a = run_command(zof + " finetune --model " + stories() + " --data " + sh + " --out " + run +
                       " --steps 2 --batch 2 --seq-len 32 --eval-examples 4 --train-examples 1e3 "
                       "--lr 2e-6 --no-report");
  ASSERT_EQ(a.code, 0) << a.err;
  json opt = json::parse(zof::test::read_file(run + "/run.json"))["options"];
  EXPECT_EQ(opt["train_examples"], 1000);
  // The flags pass; the run itself has finished, which is what --resume then says.
  auto b = run_command(zof + " finetune --resume " + run + " --steps 2 --lr 2e-6 --threads 1 "
                       "--no-report --json");
  EXPECT_EQ(b.code, 1) << b.err;
  EXPECT_NE(b.err.find("the run finished at step 2 of its --steps 2"), std::string::npos)
      << b.err;
  auto c = run_command(zof + " finetune --resume " + run + " --steps 4 --threads 1");
  EXPECT_EQ(c.code, 1);
  EXPECT_NE(c.err.find("--steps 4 would be ignored (the run has --steps 2)"), std::string::npos)
      << c.err;
  fs::remove_all(dir);
}

class CliBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    ZOF_REQUIRE_PATH(stories());
    dir_ = fs::temp_directory_path() / ("zof_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(fs::path(stories()) / f, dir_ / f);
    fs::permissions(dir_ / "model.safetensors", fs::perms::owner_write, fs::perm_options::add);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Runs generate on the damaged copy; expects a one-line error naming `file` and `what`.
  void expect_error(const std::string& file, const std::string& what) {
    auto r = run_command(zof::test::zof_binary() + " generate --model " + dir_.string() +
                         " --max-new-tokens 2");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("zof: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary | std::ios::trunc) << text;
  }
  fs::path dir_;
};

TEST_F(CliBadInput, TruncatedWeights) {
  fs::resize_file(dir_ / "model.safetensors", 100000);
  expect_error("model.safetensors", "truncated");
}

TEST_F(CliBadInput, HeaderLengthPastEndOfFile) {
  std::string f = zof::test::read_file((dir_ / "model.safetensors").string());
  f[5] = 0x7f;  // header length far beyond the file
  write("model.safetensors", f);
  expect_error("model.safetensors", "header");
}

TEST_F(CliBadInput, WrongShape) {
  std::string cfg = zof::test::read_file((dir_ / "config.json").string());
  cfg.replace(cfg.find("\"intermediate_size\": 172"), 24, "\"intermediate_size\": 170");
  write("config.json", cfg);
  expect_error("model.safetensors", "[170, 64]");
}

TEST_F(CliBadInput, MalformedConfig) {
  write("config.json", "{\"model_type\": \"llama\",");
  expect_error("config.json", "JSON");
}

TEST_F(CliBadInput, UnknownArchitecture) {
  write("config.json", "{\"model_type\": \"bert\", \"vocab_size\": 10}");
  expect_error("config.json", "bert");
}

TEST_F(CliBadInput, UnsupportedTokenizer) {
  std::string t = zof::test::read_file((dir_ / "tokenizer.json").string());
  t.replace(t.find("\"type\": \"BPE\""), 13, "\"type\": \"WordPiece\"");
  write("tokenizer.json", t);
  expect_error("tokenizer.json", "WordPiece");
}

TEST_F(CliBadInput, MissingWeights) {
  fs::remove(dir_ / "model.safetensors");
  expect_error(dir_.string(), "model.safetensors");
}

TEST(Cli, BadFlags) {
  // Flags are checked before the model is loaded: "x" is never opened.
  auto r = run_command(zof::test::zof_binary() + " generate --model x --temperature -1");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "zof: error: --temperature must be a number from 0 to 100 (0: greedy), not -1\n");
  auto e = run_command(zof::test::zof_binary() + " eval --model " + stories() + " --text /nonexistent/file");
  EXPECT_EQ(e.code, 1);
  EXPECT_NE(e.err.find("/nonexistent/file"), std::string::npos) << e.err;
  auto s = run_command(zof::test::zof_binary() + " eval --model " + stories() + " --text " +
                       zof::test::assets_dir() + "/data/tinystories/tinystories_sample_cs336.txt --seq-len 4096");
  EXPECT_EQ(s.code, 1);
  EXPECT_NE(s.err.find("--seq-len"), std::string::npos) << s.err;
}

}  // namespace

// generate's default --max-new-tokens (128) on a model whose context holds fewer: as many as
// fit, not a refusal; the same number asked for explicitly is refused (it would be cut short).
TEST(Cli, DefaultMaxNewTokensFitsAShortContext) {
  ZOF_REQUIRE_PATH(stories());
  const fs::path dir = fs::temp_directory_path() / ("zof_cli_short_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(stories(), dir);
  json cfg = json::parse(std::ifstream(dir / "config.json"));
  cfg["max_position_embeddings"] = 40;
  std::ofstream(dir / "config.json") << cfg.dump(1);
  const std::string base = zof::test::zof_binary() + " generate --model " + dir.string() +
                           " --prompt \"\" --temperature 0 --dtype fp32 --json";
  auto r = run_command(base);
  ASSERT_EQ(r.code, 0) << r.err;
  // From BOS alone: 40 new tokens fit (the greedy story has no EOS in its first 60).
  EXPECT_EQ(last_json(r.out)["new_tokens"], 40);
  auto x = run_command(base + " --max-new-tokens 128");
  EXPECT_EQ(x.code, 1);
  EXPECT_NE(x.err.find("--max-new-tokens 128 does not fit"), std::string::npos) << x.err;
  fs::remove_all(dir);
}

// --eps with --estimator jvp is refused in a new run's flags, and passes in a saved run's
// options (an older zof wrote such runs, which must still resume and replay).
TEST(Cli, JvpEpsIsRefusedForNewRunsOnly) {
  zof::TrainOptions o;
  o.estimator = zof::EstimatorChoice::Jvp;
  o.eps = 0.5f;
  EXPECT_THROW(zof::validate_options(o), zof::Error);
  EXPECT_NO_THROW(zof::validate_options(o, /*new_run=*/false));
}
