// The pipeline pieces without MPI: stage engines chained in one process (hidden states handed on
// through a queue) give the single engine's losses and, on every stage's own blocks, its weights
// bit for bit, for tied and untied heads; and the rank layout and block split.
#include <cstring>
#include <deque>
#include <memory>

#include "common.h"
#include "zof/backend.h"
#include "zof/dist.h"
#include "zof/error.h"
#include "zof/model.h"
#include "zof/zo.h"

namespace {

std::string model_dir(const std::string& name) {
  if (name == "stories260K") return zof::test::assets_dir() + "/models/stories260K";
  return zof::test::source_dir() + "/tests/golden/" + name;
}

// Micro-batches of varied lengths over the model's vocabulary.
std::vector<zof::LossBatch> micro_batches(int64_t vocab) {
  std::vector<zof::LossBatch> out;
  for (int m = 0; m < 2; ++m) {
    std::vector<std::vector<int32_t>> seqs;
    for (int b = 0; b < 3; ++b) {
      std::vector<int32_t> s;
      for (int t = 0; t < 5 + 3 * b + m; ++t) s.push_back((int32_t)((7 + 31 * t + 11 * b + 5 * m) % vocab));
      seqs.push_back(s);
    }
    out.push_back(zof::LossBatch::next_token(zof::Batch::from_sequences(seqs)));
  }
  return out;
}

struct Case {
  std::string model;
  int stages;
};

class StageWalk : public ::testing::TestWithParam<Case> {};

TEST_P(StageWalk, ChainedStagesEqualTheWholeWalk) {
  const Case c = GetParam();
  ZOF_REQUIRE_PATH(model_dir(c.model) + "/model.safetensors");
  const zof::ZOStepOptions o{1e-2f, 0.01f, 2, 9};
  auto be = zof::test::cpu_backend(0);
  zof::Model whole = zof::Model::load(model_dir(c.model));
  const auto micro = micro_batches(whole.config().vocab_size);
  const int64_t rows = 64;
  zof::ZOEngine ref(whole, *be, rows, o);

  const auto ranges = zof::dist::stage_blocks((int)whole.config().num_layers, c.stages);
  std::vector<zof::Model> models;
  std::vector<std::unique_ptr<zof::ZOEngine>> stages;
  std::vector<std::deque<std::vector<float>>> links(c.stages);  // links[s]: into stage s
  for (int s = 0; s < c.stages; ++s) models.push_back(zof::Model::load(model_dir(c.model)));
  for (int s = 0; s < c.stages; ++s) {
    stages.push_back(std::make_unique<zof::ZOEngine>(models[s], *be, rows, o));
    zof::StageIO io;
    if (s > 0)
      io.recv = [&links, s](int, float* h, int64_t n) {
        ASSERT_FALSE(links[s].empty());
        ASSERT_EQ((int64_t)links[s].front().size(), n);
        std::memcpy(h, links[s].front().data(), n * sizeof(float));
        links[s].pop_front();
      };
    if (s + 1 < c.stages)
      io.send = [&links, s](int, const float* h, int64_t n) { links[s + 1].emplace_back(h, h + n); };
    stages[s]->set_stage(ranges[s].first, ranges[s].second, std::move(io));
  }

  for (uint32_t step = 0; step < 3; ++step) {
    auto want = ref.perturbed_losses(step, micro);
    zof::QueryLosses got;
    for (int s = 0; s < c.stages; ++s) got = stages[s]->perturbed_losses(step, micro);
    ASSERT_EQ(got.sum_plus, want.sum_plus) << "step " << step;
    ASSERT_EQ(got.sum_minus, want.sum_minus) << "step " << step;
    const auto g = ref.projected_gradients(want);
    ref.schedule_update(step, 1e-2f, g);
    for (auto& e : stages) e->schedule_update(step, 1e-2f, g);
  }
  ref.flush();
  const auto& blocks = whole.blocks();
  for (int s = 0; s < c.stages; ++s) {
    stages[s]->flush();
    for (int b = 0; b < (int)blocks.size(); ++b) {
      if (!stages[s]->owns_block(b)) continue;
      EXPECT_EQ(0, std::memcmp(models[s].storage() + blocks[b].offset, whole.storage() + blocks[b].offset,
                               blocks[b].span * sizeof(float)))
          << "stage " << s << " block " << blocks[b].name;
    }
  }
  // A tied head keeps its own copy of the embedding in step with stage 0's.
  if (whole.config().tie_embeddings && c.stages > 1) {
    EXPECT_TRUE(stages.back()->owns_block(0));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, StageWalk,
                         ::testing::Values(Case{"gpt2", 2}, Case{"llama_gqa", 2}, Case{"opt", 2},
                                           Case{"stories260K", 3}),
                         [](const auto& info) { return info.param.model + "_" + std::to_string(info.param.stages); });

TEST(DistLayout, RanksStagesReplicasAndBlockSplit) {
  const auto l = zof::dist::Layout::make(6, 3);
  EXPECT_EQ(l.replicas, 2);
  EXPECT_EQ(l.stage(4), 1);
  EXPECT_EQ(l.replica(4), 1);
  EXPECT_EQ(l.rank_of(1, 2), 5);
  EXPECT_THROW(zof::dist::Layout::make(4, 3), zof::Error);
  // 5 layers over 2 stages: [embed, layers 0-1] and [layers 2-4, head].
  const auto r = zof::dist::stage_blocks(5, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0], std::make_pair(0, 2));
  EXPECT_EQ(r[1], std::make_pair(3, 6));
  EXPECT_EQ(zof::dist::stage_blocks(4, 1)[0], std::make_pair(0, 5));
  EXPECT_THROW(zof::dist::stage_blocks(2, 3), zof::Error);
  // Not started by mpirun: one process.
  if (!zof::dist::launched_by_mpi()) {
    auto c = zof::connect_job(0);
    EXPECT_EQ(c->size(), 1);
    double v[2] = {1.5, 2.5};
    c->allreduce_sum_ordered(v, 2);
    EXPECT_EQ(v[1], 2.5);
  }
}

}  // namespace
