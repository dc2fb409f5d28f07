// zof eval and finetune --tensor-parallel under mpirun through the real binary: stories260K
// split over 2 and 4 ranks (KV heads split in both) scores the text, and fine-tunes, within fp32
// of one process; the same grid twice gives the same bits (with data-parallel replicas too); the
// ranks exchange what the docs' formula says; a killed rank's run resumes on its grid bit for
// bit and on another grid within fp32; a rank count that is not T is refused.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common.h"
#include "zof/dist.h"
#include "zof/error.h"
#include "zof/model.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::test::run_command;

namespace {

class MpiTensorParallel : public zof::test::ShakespeareRunTest {
 protected:
  void SetUp() override {
    if (run_command("command -v mpirun").code != 0) {
      if (zof::test::in_ci()) FAIL() << "mpirun is missing (scripts/setup.sh installs openmpi-bin)";
      GTEST_SKIP() << "mpirun is not installed";
    }
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    make_run_dir("zof_mpi_tp");
  }
  std::string eval(const std::string& extra = "") const {
    return zof::test::zof_binary() + " eval --model " + zof::test::assets_dir() +
           "/models/stories260K --text " + (dir_ / "text.txt").string() +
           " --seq-len 64 --batch 4 --max-windows 8 --threads 1 --dtype fp32 --json " + extra;
  }
  static std::string mpirun(int np) {
    return "mpirun --oversubscribe --bind-to none -np " + std::to_string(np) + " ";
  }
  static json last_json(const zof::test::CommandResult& r) {
    const std::string& out = r.out;
    const size_t nl = out.rfind('\n', out.size() - 2);
    return json::parse(out.substr(nl == std::string::npos ? 0 : nl + 1));
  }
};

TEST_F(MpiTensorParallel, TwoAndFourRanksWithinFp32OfOneProcessAndRerunsIdentical) {
  const auto one = run_command(eval());
  ASSERT_EQ(one.code, 0) << one.err;
  const json j1 = last_json(one);
  for (int T : {2, 4}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const std::string cmd = mpirun(T) + eval("--tensor-parallel " + std::to_string(T));
    const auto a = run_command(cmd);
    ASSERT_EQ(a.code, 0) << a.err;
    const auto b = run_command(cmd);
    ASSERT_EQ(b.code, 0) << b.err;
    const json ja = last_json(a), jb = last_json(b);
    EXPECT_EQ(ja["tensor_parallel"], T);
    EXPECT_EQ(ja["tokens"], j1["tokens"]);
    EXPECT_EQ(ja["windows"], j1["windows"]);
    const double nll = ja["nll"], ref = j1["nll"];
    EXPECT_NEAR(nll, ref, 2e-6 * ref);  // fp32: the row-parallel sums are added per rank
    EXPECT_EQ(ja["nll"].get<double>(), jb["nll"].get<double>());  // the grid's bits, every run
    // Only rank 0 prints: one JSON line.
    EXPECT_EQ(a.out.find('{'), a.out.rfind('{')) << a.out;
    // What each rank hands its group per forward (docs/parallelism.md): two all-reduces of
    // (rows, C) per layer and one for the embedding, T - 1 copies each, in fp32, plus the
    // head's 20 bytes a scored row (its max in fp32, sum-exp and target logit in fp64). 8
    // windows of 64 tokens in 2 batches of 4: rows = 256 a batch, 4 x 63 of them scored.
    const int64_t rows = 256, scored = 4 * 63, C = 64, L = 5;
    const uint64_t per_batch =
        (uint64_t)(T - 1) * (uint64_t)((2 * L + 1) * rows * C * 4 + scored * 20);
    EXPECT_EQ(ja["exchanged_bytes_per_rank"].get<uint64_t>(), 2 * per_batch);
  }
}

TEST_F(MpiTensorParallel, RankCountOtherThanTIsRefused) {
  const auto few = run_command(mpirun(2) + eval("--tensor-parallel 4"));
  EXPECT_NE(few.code, 0);
  EXPECT_NE(few.err.find("zof: error: --tensor-parallel 4 splits the model over 4 ranks, and this "
                         "job has 2; start it with mpirun -np 4"),
            std::string::npos)
      << few.err;
  const auto many = run_command(mpirun(4) + eval("--tensor-parallel 2"));
  EXPECT_NE(many.code, 0);
  EXPECT_NE(many.err.find("zof: error: --tensor-parallel 2 splits the model over 2 ranks, and "
                          "this job has 4"),
            std::string::npos)
      << many.err;
}

// ---- finetune --tensor-parallel ------------------------------------------------------------

class MpiTensorFinetune : public MpiTensorParallel {
 protected:
  std::string args(const fs::path& out, int steps, const std::string& extra = "") const {
    return zof::test::zof_binary() + " finetune --model " + zof::test::assets_dir() +
           "/models/stories260K --task text --data " + (dir_ / "text.txt").string() + " --out " +
           out.string() + " --steps " + std::to_string(steps) +
           " --batch 4 --seq-len 32 --lr 1e-4 --eps 1e-3 --seed 7 --save-every 5 --queries 2 "
           "--eval-every 4 --eval-examples 8 --threads 1 --dtype fp32 " + extra;
  }
  // The step or eval records of a run's metrics.jsonl, without timings.
  static std::vector<json> records(const fs::path& run, const char* type) {
    std::vector<json> out;
    std::ifstream f(run / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      json j = json::parse(line);
      if (j["type"] != type) continue;
      for (const char* k : {"step_s", "tokens_per_s", "eval_s"}) j.erase(k);
      out.push_back(j);
    }
    return out;
  }
  static std::string weights(const fs::path& run) {
    return zof::test::read_file((run / "model.safetensors").string());
  }
  static void expect_identical(const fs::path& a, const fs::path& b) {
    ASSERT_FALSE(records(a, "step").empty());
    EXPECT_EQ(records(a, "step"), records(b, "step")) << a << " vs " << b;
    EXPECT_EQ(records(a, "eval"), records(b, "eval")) << a << " vs " << b;
    EXPECT_TRUE(weights(a) == weights(b)) << "final weights differ: " << a << " vs " << b;
  }
  // b's steps and evaluations within fp32 of a's (from step `from` on): the losses to a few
  // units of fp32's last place, the projected gradients (differences of two such losses over
  // 2 eps) to 5e-3 (1 + |g|), the held-out perplexity to ppl_rel (1e-5; Adam divides each
  // element's step by its own history, so the same drift in g moves its weights further; its
  // losses too: loss_rel 1e-4, where an AVX2 machine's kernels, summing the sliced and the whole
  // products in other orders, put Adam's losses 3.3e-5 apart by step 3).
  static void expect_within_fp32(const fs::path& a, const fs::path& b, int64_t from = 0,
                                 double ppl_rel = 1e-5, double loss_rel = 1e-5) {
    const auto sa = records(a, "step"), sb = records(b, "step");
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      if (sa[i]["step"].get<int64_t>() < from) continue;
      SCOPED_TRACE("step " + sa[i]["step"].dump());
      for (const char* k : {"loss_plus", "loss_minus"}) {
        const double x = sa[i][k], y = sb[i][k];
        EXPECT_NEAR(y, x, loss_rel * std::fabs(x)) << k;
      }
      for (size_t j = 0; j < sa[i]["g"].size(); ++j) {
        const double x = sa[i]["g"][j], y = sb[i]["g"][j];
        EXPECT_NEAR(y, x, 5e-3 * (1 + std::fabs(x))) << "g " << j;
      }
    }
    const auto ea = records(a, "eval"), eb = records(b, "eval");
    ASSERT_EQ(ea.size(), eb.size());
    for (size_t i = 0; i < ea.size(); ++i) {
      const double x = ea[i]["value"], y = eb[i]["value"];
      EXPECT_NEAR(y, x, ppl_rel * x) << "eval at step " << ea[i]["step"];
    }
  }
};

TEST_F(MpiTensorFinetune, TwoAndFourRanksWithinFp32OfOneProcessRerunsIdenticalAndReplicas) {
  const fs::path one = dir_ / "one";
  const auto r1 = run_command(args(one, 12));
  ASSERT_EQ(r1.code, 0) << r1.err;
  for (int T : {2, 4}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    std::string name = "t";  // appended piece by piece: GCC 12's -Wrestrict false positive
    name += std::to_string(T);
    const fs::path a = dir_ / name, b = dir_ / (name + "b");
    const std::string t = "--tensor-parallel " + std::to_string(T);
    const auto ra = run_command(mpirun(T) + args(a, 12, t + " --json"));
    ASSERT_EQ(ra.code, 0) << ra.err;
    EXPECT_NE(ra.err.find(std::to_string(T) + " tensor-parallel rank(s) x 1 pipeline stage(s) x 1 "
                          "data-parallel replica(s)"),
              std::string::npos)
        << ra.err;
    const json s = last_json(ra);
    EXPECT_EQ(s["dist"]["tensor_parallel"], T);
    EXPECT_EQ(s["dist"]["ranks"], T);
    EXPECT_GT(s["dist"]["bytes_per_step"].get<double>(), 0.0);
    // What each rank hands its group a step (docs/parallelism.md): 2q forwards of 4 windows of
    // 32 tokens (rows = 128), each two all-reduces of (rows, C) fp32 a layer and one for the
    // embedding, T - 1 copies, plus the loss's 20 bytes a scored row (4 x 31).
    const double rows = 128, scored = 4 * 31, C = 64, L = 5, q = 2;
    EXPECT_DOUBLE_EQ(s["dist"]["tensor_bytes_per_step_per_rank"].get<double>(),
                     2 * q * (T - 1) * ((2 * L + 1) * rows * C * 4 + scored * 20));
    expect_within_fp32(one, a);
    // The grid's bits, every run.
    ASSERT_EQ(run_command(mpirun(T) + args(b, 12, t)).code, 0);
    expect_identical(a, b);
    // The saved model is the ordinary Hugging Face directory, the one process's within fp32.
    const zof::Model m1 = zof::Model::load(one.string()), mt = zof::Model::load(a.string());
    ASSERT_EQ(m1.storage_size(), mt.storage_size());
    double d = 0;
    for (int64_t i = 0; i < m1.storage_size(); ++i)
      d = std::max(d, std::fabs(double(m1.storage()[i]) - double(mt.storage()[i])));
    EXPECT_GT(d, 0.0);   // the row-parallel sums are not the single process's
    EXPECT_LT(d, 1e-5);  // and they drift by fp32's rounding only
  }
  // T = 2 x 2 data-parallel replicas: each tensor group half the batch, the sums reduced over the
  // replicas as data parallel does (the same bits as one group).
  const fs::path r = dir_ / "t2r2";
  const auto rr = run_command(mpirun(4) + args(r, 12, "--tensor-parallel 2"));
  ASSERT_EQ(rr.code, 0) << rr.err;
  EXPECT_NE(rr.err.find("2 tensor-parallel rank(s) x 1 pipeline stage(s) x 2 data-parallel"),
            std::string::npos)
      << rr.err;
  expect_identical(dir_ / "t2", r);
}

// Low-rank directions (--low-rank 2, V new every 3 steps) over slices: each rank draws the whole
// matrix's factor rows for the elements it holds, so T = 2 (row-parallel slices hold half of
// each row of o and down) steps within fp32 of one process's low-rank run, reruns identically,
// and is not the dense run.
TEST_F(MpiTensorFinetune, LowRankDirectionsWithinFp32OfOneProcess) {
  const std::string lr = "--low-rank 2 --low-rank-every 3";
  const fs::path one = dir_ / "one", dense = dir_ / "dense", a = dir_ / "a", b = dir_ / "b";
  ASSERT_EQ(run_command(args(one, 8, lr)).code, 0);
  const auto ra = run_command(mpirun(2) + args(a, 8, lr + " --tensor-parallel 2"));
  ASSERT_EQ(ra.code, 0) << ra.err;
  expect_within_fp32(one, a);
  ASSERT_EQ(run_command(mpirun(2) + args(b, 8, lr + " --tensor-parallel 2")).code, 0);
  expect_identical(a, b);
  ASSERT_EQ(run_command(mpirun(2) + args(dense, 8, "--tensor-parallel 2")).code, 0);
  const auto sa = records(a, "step"), sd = records(dense, "step");
  ASSERT_EQ(sa.size(), sd.size());
  EXPECT_NE(sa.back()["g"], sd.back()["g"]);  // the directions are not the dense ones
}

TEST_F(MpiTensorFinetune, KilledRankStopsTheJobAndTheRunResumesOnItsGridOrAnother) {
  const fs::path ref = dir_ / "ref", run = dir_ / "run";
  ASSERT_EQ(run_command(mpirun(2) + args(ref, 24, "--tensor-parallel 2")).code, 0);
  // Rank 1 dies by SIGKILL at the start of step 13 (after the checkpoint at step 10).
  const auto k = run_command("ZOF_FAULT_RANK=1 ZOF_FAULT_KILL_AT_STEP=13 " + mpirun(2) +
                             args(run, 24, "--tensor-parallel 2"));
  EXPECT_NE(k.code, 0);
  EXPECT_EQ(zof::test::read_file((run / "latest").string()), "checkpoint-10\n");
  EXPECT_FALSE(fs::exists(run / "model.safetensors"));
  // The checkpoint is the whole model: the run resumes on another grid too (a copy of it).
  const fs::path other = dir_ / "other";
  fs::copy(run, other, fs::copy_options::recursive);
  // On its own grid it continues bit for bit.
  const auto r = run_command(mpirun(2) + zof::test::zof_binary() + " finetune --resume " +
                             run.string() + " --threads 1 --tensor-parallel 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming at step 10"), std::string::npos) << r.err;
  expect_identical(ref, run);
  // In one process it continues too, within fp32 of the tensor-parallel steps.
  const auto o = run_command(zof::test::zof_binary() + " finetune --resume " + other.string() +
                             " --threads 1");
  ASSERT_EQ(o.code, 0) << o.err;
  expect_within_fp32(ref, other, 10);
}

// The grid: pipeline stages of tensor groups (ranks = replicas x stages x tensor). A stage's
// tensor ranks hand their hidden states to the same tensor ranks of the next stage, and the
// stages compute exactly what one tensor group computes: T = 2 x S = 2, the same with 2
// replicas (8 ranks), and T = 4 x S = 2 give the T-rank run's bits.
TEST_F(MpiTensorFinetune, PipelineStagesOfTensorGroupsAreOneTensorGroupBitForBit) {
  const std::string opts = "--micro-batches 2 ";
  for (int T : {2, 4}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const std::string t = opts + "--tensor-parallel " + std::to_string(T);
    std::string name = "t";  // appended piece by piece: GCC 12's -Wrestrict false positive
    name += std::to_string(T);
    const fs::path one_group = dir_ / name, staged = dir_ / (name + "s2");
    const auto r1 = run_command(mpirun(T) + args(one_group, 12, t + " --json"));
    ASSERT_EQ(r1.code, 0) << r1.err;
    const auto r = run_command(mpirun(2 * T) + args(staged, 12, t + " --pipeline-stages 2 --json"));
    ASSERT_EQ(r.code, 0) << r.err;
    const json sj = last_json(r);
    EXPECT_EQ(sj["dist"]["pipeline_stages"], 2);
    EXPECT_EQ(sj["dist"]["tensor_parallel"], T);
    // Each stage's group exchanges for its own layers; added up, one group's exchange.
    EXPECT_EQ(sj["dist"]["tensor_bytes_per_step_per_rank"],
              last_json(r1)["dist"]["tensor_bytes_per_step_per_rank"]);
    expect_identical(one_group, staged);
    if (T == 2) {  // and two replicas of that grid
      const fs::path rep = dir_ / "t2s2r2";
      const auto rr = run_command(mpirun(8) + args(rep, 12, t + " --pipeline-stages 2"));
      ASSERT_EQ(rr.code, 0) << rr.err;
      EXPECT_NE(rr.err.find("2 tensor-parallel rank(s) x 2 pipeline stage(s) x 2 data-parallel"),
                std::string::npos)
          << rr.err;
      expect_identical(one_group, rep);
    }
  }
}

// A model whose splits are uneven (a vocabulary of 515 and an FFN width of 102 over 2 and 4
// ranks) and whose LM head is its own tensor: T = 4 within fp32 of one process, and 2 stages of
// T = 2 (the head on the last stage) the T = 2 run's bits.
TEST_F(MpiTensorFinetune, UnevenSplitsAndAnUntiedHeadOnStages) {
  const fs::path m = dir_ / "uneven";
  fs::create_directories(m);
  std::ofstream(m / "config.json") << R"({"architectures": ["LlamaForCausalLM"],
    "model_type": "llama", "vocab_size": 515, "hidden_size": 64, "intermediate_size": 102,
    "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32"})";
  zof::Model::random(zof::ModelConfig::load((m / "config.json").string()), 3)
      .save(m.string(), zof::DType::F32);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                        "special_tokens_map.json"})
    fs::copy_file(zof::test::assets_dir() + "/models/stories260K/" + f, m / f);
  auto cmd = [&](const fs::path& out, const std::string& extra) {
    return zof::test::zof_binary() + " finetune --model " + m.string() + " --task text --data " +
           (dir_ / "text.txt").string() + " --out " + out.string() +
           " --steps 8 --batch 4 --seq-len 32 --lr 1e-3 --eps 1e-3 --seed 5 --queries 2 "
           "--eval-every 4 --eval-examples 8 --threads 1 --dtype fp32 " + extra;
  };
  const fs::path one = dir_ / "one", t4 = dir_ / "t4", t2 = dir_ / "t2", t2s2 = dir_ / "t2s2";
  ASSERT_EQ(run_command(cmd(one, "")).code, 0);
  const auto r4 = run_command(mpirun(4) + cmd(t4, "--tensor-parallel 4"));
  ASSERT_EQ(r4.code, 0) << r4.err;
  expect_within_fp32(one, t4);
  ASSERT_EQ(run_command(mpirun(2) + cmd(t2, "--tensor-parallel 2")).code, 0);
  const auto rs = run_command(mpirun(4) + cmd(t2s2, "--tensor-parallel 2 --pipeline-stages 2"));
  ASSERT_EQ(rs.code, 0) << rs.err;
  expect_identical(t2, t2s2);
}

// Adam's m and v travel with the slices: rank 0 gathers them into the checkpoint's whole
// optimizer.safetensors, and a resumed rank takes its slice of them.
TEST_F(MpiTensorFinetune, AdamStateIsGatheredIntoCheckpointsAndSlicedOnResume) {
  const std::string adam = "--optimizer adam --lr 1e-3 --tensor-parallel 2";
  const fs::path ref = dir_ / "ref", run = dir_ / "run", one = dir_ / "one";
  ASSERT_EQ(run_command(mpirun(2) + args(ref, 16, adam)).code, 0);
  ASSERT_EQ(run_command(args(one, 16, "--optimizer adam --lr 1e-3")).code, 0);
  expect_within_fp32(one, ref, 0, 1e-4, 1e-4);  // the same Adam steps as one process, within fp32
  const auto k = run_command("ZOF_FAULT_RANK=1 ZOF_FAULT_KILL_AT_STEP=12 " + mpirun(2) +
                             args(run, 16, adam));
  EXPECT_NE(k.code, 0);
  ASSERT_EQ(zof::test::read_file((run / "latest").string()), "checkpoint-10\n");
  ASSERT_TRUE(fs::exists(run / "checkpoint-10" / "optimizer.safetensors"));
  const fs::path other = dir_ / "other";
  fs::copy(run, other, fs::copy_options::recursive);
  const auto r = run_command(mpirun(2) + zof::test::zof_binary() + " finetune --resume " +
                             run.string() + " --threads 1 --tensor-parallel 2");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_identical(ref, run);  // the state came back: the steps after 10 are the same bits
  // The checkpoint's state is the whole model's: one process resumes from it too.
  const auto o = run_command(zof::test::zof_binary() + " finetune --resume " + other.string() +
                             " --threads 1");
  ASSERT_EQ(o.code, 0) << o.err;
  expect_within_fp32(ref, other, 10, 1e-4, 1e-4);
}

// MeZO's classification objective on SST-2 (examples packed, each at its own length), two
// micro-batches and two directions a step, and a model saved in bf16: the tensor-parallel run is
// one process's within fp32, and 2 x 2 replicas are one group's bit for bit.
TEST_F(MpiTensorFinetune, ClassificationWithMicroBatchesAndABf16Save) {
  ZOF_REQUIRE_PATH(zof::test::assets_dir() + "/data/sst2/train.tsv");
  auto cmd = [&](const fs::path& out) {
    return zof::test::zof_binary() + " finetune --model " + zof::test::assets_dir() +
           "/models/stories260K --task sst2 --data " + zof::test::assets_dir() +
           "/data/sst2 --steps 6 --batch 8 --seq-len 64 --lr 1e-4 --seed 7 --train-examples 64 "
           "--eval-examples 16 --eval-every 3 --queries 2 --micro-batches 2 --save-dtype bf16 "
           "--threads 1 --dtype fp32 --out " + out.string();
  };
  const fs::path one = dir_ / "one", two = dir_ / "two", four = dir_ / "four";
  const auto r1 = run_command(cmd(one));
  ASSERT_EQ(r1.code, 0) << r1.err;
  const auto r2 = run_command(mpirun(2) + cmd(two) + " --tensor-parallel 2");
  ASSERT_EQ(r2.code, 0) << r2.err;
  const auto r4 = run_command(mpirun(4) + cmd(four) + " --tensor-parallel 2");
  ASSERT_EQ(r4.code, 0) << r4.err;
  expect_within_fp32(one, two);
  expect_identical(two, four);
  // Saved in bf16 from every rank's rounded slice: one process's bf16 file but where fp32's
  // drift crossed a rounding boundary.
  const zof::Model a = zof::Model::load(one.string()), b = zof::Model::load(two.string());
  EXPECT_EQ(b.stored_dtype(), zof::DType::BF16);
  ASSERT_EQ(a.storage_size(), b.storage_size());
  int64_t differ = 0;
  for (int64_t i = 0; i < a.storage_size(); ++i) differ += a.storage()[i] != b.storage()[i];
  EXPECT_LT(differ, a.num_params() / 1000) << differ << " of " << a.num_params();
}

TEST_F(MpiTensorFinetune, AFamilyThatCannotSplitIsRefusedByName) {
  const auto r = run_command(
      mpirun(2) + zof::test::zof_binary() + " finetune --model " + zof::test::source_dir() +
      "/tests/golden/opt --task text --data " + (dir_ / "text.txt").string() + " --out " +
      (dir_ / "opt").string() + " --steps 2 --batch 2 --threads 1 --tensor-parallel 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("zof: error: --tensor-parallel 2: the opt family cannot be split yet"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "opt"));  // refused before --out
}

}  // namespace

namespace {

TEST(DistGrid, TensorGroupOnConsecutiveRanksThenStagesThenReplicas) {
  // 8 ranks = 2 replicas x 2 stages x 2 tensor.
  const auto g = zof::dist::Grid::make(8, 2, 2);
  EXPECT_EQ(g.replicas, 2);
  EXPECT_EQ(g.tensor_rank(5), 1);
  EXPECT_EQ(g.stage(5), 0);
  EXPECT_EQ(g.replica(5), 1);
  EXPECT_EQ(g.stage(6), 1);
  EXPECT_EQ(g.tensor_group(5), (std::vector<int>{4, 5}));
  EXPECT_EQ(g.tensor_group(6), (std::vector<int>{6, 7}));
  // tensor = 1 is the pipeline layout.
  const auto l = zof::dist::Layout::make(6, 3);
  const auto g1 = zof::dist::Grid::make(6, 3, 1);
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(g1.stage(r), l.stage(r));
    EXPECT_EQ(g1.replica(r), l.replica(r));
  }
  try {
    zof::dist::Grid::make(6, 2, 2);
    ADD_FAILURE() << "6 ranks for 2 stages x 2 tensor was not refused";
  } catch (const zof::Error& e) {
    EXPECT_STREQ(e.what(),
                 "--pipeline-stages 2 x --tensor-parallel 2 = 4 does not divide the 6 ranks of "
                 "the job; ranks = replicas x stages x tensor, so start a multiple of 4 ranks "
                 "(mpirun -np)");
  }
}

}  // namespace
