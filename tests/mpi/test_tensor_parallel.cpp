// zof eval --tensor-parallel under mpirun through the real binary: stories260K split over 2 and
// 4 ranks (KV heads split in both) scores the text within fp32 of one process, the same grid
// twice gives the same bits, the ranks exchange what the docs' formula says, and a rank count
// that is not T is refused.
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common.h"
#include "zof/dist.h"
#include "zof/error.h"

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
           " --seq-len 64 --batch 4 --max-windows 8 --threads 1 --json " + extra;
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
    // head's 20 bytes a row (its max in fp32, sum-exp and target logit in fp64). 8 windows of
    // 64 tokens in 2 batches of 4: rows = 256 a batch.
    const int64_t rows = 256, C = 64, L = 5;
    const uint64_t per_batch = (uint64_t)(T - 1) * (uint64_t)((2 * L + 1) * rows * C * 4 + rows * 20);
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
