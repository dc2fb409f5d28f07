// zof finetune under mpirun through the real binary: data-parallel and pipeline runs equal one
// process bit for bit; a killed, hung or signalled rank stops the whole job promptly with the
// last checkpoint intact, and the run resumes on another number of ranks.
//
// Why bit-identical is the right bar: every rank regenerates z from the seed, so the weights
// stay identical if the per-step scalars do. Each rank's per-example NLLs are computed as one
// process computes them (a replica packs its examples, each at its own length, so rows keep
// their length; only the number of rows differs, and oneDNN's fp32 products here give each row the
// same bits at any row count), and the loss sums are added in rank order, as one process adds
// its micro-batches. If a oneDNN version ever made a row depend on the row count, the
// data-parallel comparisons would need a tolerance (about 1e-6 relative on the losses); the
// pipeline comparison never would (the same per-block arithmetic on the same rows).
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::test::run_command;

namespace {

std::string stories() { return zof::test::assets_dir() + "/models/stories260K"; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Mpi : public zof::test::ShakespeareRunTest {
 protected:
  void SetUp() override {
    if (run_command("command -v mpirun").code != 0) {
      if (zof::test::in_ci()) FAIL() << "mpirun is missing (scripts/setup.sh installs openmpi-bin)";
      GTEST_SKIP() << "mpirun is not installed";
    }
    // Open MPI refuses root without these (CI containers run as root).
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    make_run_dir("zof_mpi");
  }

  // One thread per rank: the machine has few cores and the results do not depend on it.
  std::string args(const fs::path& out, int steps = 12, const std::string& extra = "") const {
    return "finetune --model " + stories() + " --task text --data " + (dir_ / "text.txt").string() +
           " --out " + out.string() + " --steps " + std::to_string(steps) +
           " --batch 4 --seq-len 32 --lr 1e-4 --eps 1e-3 --seed 7 --save-every 5 "
           "--eval-examples 8 --threads 1 " + extra;
  }
  static std::string zof() { return zof::test::zof_binary(); }
  static std::string mpirun(int np) {
    return "mpirun --oversubscribe --bind-to none -np " + std::to_string(np) + " " + zof();
  }
  // The step (or eval) records of a run's metrics.jsonl, without timings.
  static std::vector<json> steps_of(const fs::path& run, const char* type = "step") {
    std::vector<json> out;
    std::ifstream f(run / "metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) {
      json j = json::parse(line);
      if (j["type"] == type) {
        for (const char* k : {"step_s", "tokens_per_s", "eval_s"}) j.erase(k);
        out.push_back(j);
      }
    }
    return out;
  }
  static std::string weights(const fs::path& dir) {
    return zof::test::read_file((dir / "model.safetensors").string());
  }
  static json summary(const std::string& out) {
    const size_t nl = out.rfind('\n', out.size() - 2);
    return json::parse(out.substr(nl == std::string::npos ? 0 : nl + 1));
  }
  void expect_same_run(const fs::path& a, const fs::path& b) {
    const auto sa = steps_of(a), sb = steps_of(b);
    ASSERT_FALSE(sa.empty());
    EXPECT_EQ(sa, sb) << a << " vs " << b;
    // Rank 0 evaluates the whole model: a pipeline gathers its stages' blocks first.
    EXPECT_EQ(steps_of(a, "eval"), steps_of(b, "eval")) << a << " vs " << b;
    EXPECT_TRUE(weights(a) == weights(b)) << "final weights differ: " << a << " vs " << b;
  }
};

TEST_F(Mpi, DataParallelTwoAndFourRanksEqualOneProcess) {
  const fs::path one = dir_ / "one", two = dir_ / "two", four = dir_ / "four";
  auto r1 = run_command(zof() + " " + args(one));
  ASSERT_EQ(r1.code, 0) << r1.err;
  auto r2 = run_command(mpirun(2) + " " + args(two));
  ASSERT_EQ(r2.code, 0) << r2.err;
  auto r4 = run_command(mpirun(4) + " " + args(four));
  ASSERT_EQ(r4.code, 0) << r4.err;
  expect_same_run(one, two);
  expect_same_run(one, four);
  // A bf16 master rounds its updates stochastically (once per window of 8 steps, the auto
  // window): each rank holds the same window and draws the same bits.
  const fs::path one_b = dir_ / "one_bf16", two_b = dir_ / "two_bf16";
  auto b1 = run_command(zof() + " " + args(one_b, 12, "--master bf16"));
  ASSERT_EQ(b1.code, 0) << b1.err;
  auto b2 = run_command(mpirun(2) + " " + args(two_b, 12, "--master bf16"));
  ASSERT_EQ(b2.code, 0) << b2.err;
  expect_same_run(one_b, two_b);
  EXPECT_NE(steps_of(one_b), steps_of(one));  // the bf16 master is what the runs trained
  // Rank 0 alone writes: one summary line, one run directory's worth of files.
  const json s = summary(r4.out);
  EXPECT_EQ(s["dist"]["ranks"], 4);
  EXPECT_EQ(s["dist"]["replicas"], 4);
  // The exchange is scalars: (2q + 3) doubles gathered and broadcast, never parameters.
  EXPECT_DOUBLE_EQ(s["dist"]["bytes_per_step"].get<double>(), 2.0 * 3 * 5 * 8);
  EXPECT_EQ(r4.out.find("{\"rank\""), std::string::npos) << r4.out;
}

TEST_F(Mpi, DataParallelWithPaddedExamplesEqualsOneProcess) {
  // SST-2 examples differ in length: each replica packs its examples, each at its own length.
  ZOF_REQUIRE_PATH(zof::test::assets_dir() + "/data/sst2/train.tsv");
  const std::string a = "finetune --model " + stories() + " --task sst2 --data " +
                        zof::test::assets_dir() + "/data/sst2 --steps 5 --batch 8 --seq-len 64 "
                        "--lr 1e-4 --seed 7 --train-examples 64 --eval-examples 8 --threads 1 "
                        "--queries 2 --out ";
  const fs::path one = dir_ / "one", four = dir_ / "four";
  auto r1 = run_command(zof() + " " + a + one.string());
  ASSERT_EQ(r1.code, 0) << r1.err;
  auto r4 = run_command(mpirun(4) + " " + a + four.string());
  ASSERT_EQ(r4.code, 0) << r4.err;
  expect_same_run(one, four);
  // With micro-batches: every micro-batch is packed, each example at its own length in every
  // layout (a row's bits depend on the length it is computed at), so 2 replicas of 2
  // micro-batches each are one process's 2 micro-batches.
  const std::string m = a.substr(0, a.size() - 6) + "--micro-batches 2 --out ";
  const fs::path one_m = dir_ / "one_m", two_m = dir_ / "two_m";
  auto m1 = run_command(zof() + " " + m + one_m.string());
  ASSERT_EQ(m1.code, 0) << m1.err;
  auto m2 = run_command(mpirun(2) + " " + m + two_m.string());
  ASSERT_EQ(m2.code, 0) << m2.err;
  expect_same_run(one_m, two_m);
}

TEST_F(Mpi, PipelineStagesEqualOneProcess) {
  const fs::path one = dir_ / "one", p2 = dir_ / "p2", p2x2 = dir_ / "p2x2";
  // Evaluations during the run check the gather of the stages' blocks to rank 0.
  const std::string opts = "--queries 2 --micro-batches 2 --eval-every 4 ";
  ASSERT_EQ(run_command(zof() + " " + args(one, 12, opts)).code, 0);
  // Two stages on two ranks; then two stages x two replicas on four.
  auto r2 = run_command(mpirun(2) + " " + args(p2, 12, opts + "--pipeline-stages 2"));
  ASSERT_EQ(r2.code, 0) << r2.err;
  auto r4 = run_command(mpirun(4) + " " + args(p2x2, 12, opts + "--pipeline-stages 2"));
  ASSERT_EQ(r4.code, 0) << r4.err;
  expect_same_run(one, p2);
  expect_same_run(one, p2x2);
  // Only activations cross: 2q hidden-state streams of (rows, C) floats per micro-batch, plus
  // the reduction; far less than the model (260K parameters, 1 MB).
  const json s = summary(r2.out);
  EXPECT_EQ(s["dist"]["pipeline_stages"], 2);
  const double act = 2 * 2 * (4 * 32) * 64 * 4.0, red = 2 * (2 * 2 + 3) * 8.0;
  EXPECT_DOUBLE_EQ(s["dist"]["bytes_per_step"].get<double>(), act + red);
  // A layout that does not divide the ranks is a clear error.
  auto bad = run_command(mpirun(2) + " " + args(dir_ / "bad", 12, "--pipeline-stages 3"));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--pipeline-stages 3"), std::string::npos) << bad.err;
}

// LOZO's low-rank directions over two pipeline stages x two replicas: each stage draws its
// blocks' factors from the same counters one process would, so the same run.
TEST_F(Mpi, LowRankOnStagesAndReplicasEqualsOneProcess) {
  const fs::path one = dir_ / "lr-one", p2x2 = dir_ / "lr-p2x2";
  const std::string opts = "--queries 2 --low-rank 2 --low-rank-every 5 ";
  auto r1 = run_command(zof() + " " + args(one, 12, opts));
  ASSERT_EQ(r1.code, 0) << r1.err;
  auto r4 = run_command(mpirun(4) + " " + args(p2x2, 12, opts + "--pipeline-stages 2"));
  ASSERT_EQ(r4.code, 0) << r4.err;
  expect_same_run(one, p2x2);
}

TEST_F(Mpi, KilledRankStopsTheJobAndTheRunResumesOnMoreRanks) {
  const fs::path ref = dir_ / "ref", run = dir_ / "run";
  ASSERT_EQ(run_command(zof() + " " + args(ref, 24)).code, 0);
  // Rank 1 dies by SIGKILL at the start of step 13 (after the checkpoint at step 10).
  const double t0 = now_s();
  auto k = run_command("ZOF_FAULT_RANK=1 ZOF_FAULT_KILL_AT_STEP=13 " + mpirun(2) + " " + args(run, 24));
  const double dt = now_s() - t0;
  EXPECT_NE(k.code, 0);
  EXPECT_LT(dt, 60.0) << "the surviving rank did not stop promptly";
  EXPECT_EQ(zof::test::read_file((run / "latest").string()), "checkpoint-10\n");
  EXPECT_FALSE(fs::exists(run / "model.safetensors"));
  // Resume on four ranks: the run continues where the checkpoint left it, as if uninterrupted.
  auto r = run_command(mpirun(4) + " finetune --resume " + run.string() + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming at step 10"), std::string::npos) << r.err;
  expect_same_run(ref, run);
}

TEST_F(Mpi, HungRankTimesOutAndTheRunResumesInOneProcess) {
  const fs::path ref = dir_ / "ref", run = dir_ / "run";
  ASSERT_EQ(run_command(zof() + " " + args(ref, 24)).code, 0);
  // Rank 1 stops answering at step 13; rank 0's watchdog aborts the job after 3 s.
  const double t0 = now_s();
  auto h = run_command("ZOF_FAULT_RANK=1 ZOF_FAULT_HANG_AT_STEP=13 " + mpirun(2) + " " +
                       args(run, 24, "--dist-timeout 3"));
  const double dt = now_s() - t0;
  EXPECT_NE(h.code, 0);
  EXPECT_LT(dt, 60.0);
  EXPECT_NE(h.err.find("--dist-timeout 3"), std::string::npos) << h.err;
  EXPECT_EQ(zof::test::read_file((run / "latest").string()), "checkpoint-10\n");
  // No rank of the job is left behind ("--ou[t]" keeps pgrep from matching its own shell).
  EXPECT_NE(run_command("pgrep -f -- '--ou[t] " + run.string() + " '").code, 0);
  auto r = run_command(zof() + " finetune --resume " + run.string() + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_run(ref, run);
}

// Rank 0 evaluates and writes checkpoints alone. However long that takes (here 3 s each, twice
// the watchdog's timeout), its heartbeat keeps the waiting rank's watchdog from ending a
// healthy job, and the run is the one a single process makes.
TEST_F(Mpi, SlowEvaluationsAndCheckpointsOnRankZeroDoNotTripTheWatchdog) {
  // The heartbeat needs MPI_THREAD_MULTIPLE (without it the waiting ranks are not watched at
  // all, and this test could not fail).
  const auto info = run_command("ompi_info");
  ASSERT_NE(info.out.find("MPI_THREAD_MULTIPLE: yes"), std::string::npos) << info.out;
  const fs::path ref = dir_ / "ref", run = dir_ / "run";
  ASSERT_EQ(run_command(zof() + " " + args(ref, 6, "--eval-every 3")).code, 0);
  const double t0 = now_s();
  auto r = run_command("ZOF_FAULT_SLOW_ROOT_S=3 " + mpirun(2) + " " +
                       args(run, 6, "--eval-every 3 --dist-timeout 1.5"));
  ASSERT_EQ(r.code, 0) << r.err;
  // Three evaluations (before, at step 3, after) and two checkpoints (5, 6), 3 s each.
  EXPECT_GT(now_s() - t0, 15.0);
  expect_same_run(ref, run);
}

TEST_F(Mpi, SignalToOneRankStopsEveryRankAfterTheSameStep) {
  const fs::path ref = dir_ / "ref", run = dir_ / "run";
  ASSERT_EQ(run_command(zof() + " " + args(ref, 16)).code, 0);
  // SIGTERM reaches rank 1 alone; the stop flag travels with the step's reduction, so every
  // rank leaves after step 7 and rank 0 saves checkpoint-7.
  auto s = run_command("ZOF_FAULT_RANK=1 ZOF_FAULT_TERM_AT_STEP=6 " + mpirun(2) + " " +
                       args(run, 16, "--pipeline-stages 2"));
  EXPECT_NE(s.code, 0);
  EXPECT_EQ(zof::test::read_file((run / "latest").string()), "checkpoint-7\n");
  auto r = run_command(mpirun(2) + " finetune --resume " + run.string() + " --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  expect_same_run(ref, run);
}

}  // namespace
