// Parameter streaming (streaming.h) on the simulated device (sim_device.h): ZO steps with the
// blocks streamed through budgets from the minimum (two slots of the largest block) to the whole
// model give the plain CPU run's losses, weights and momentum/Adam state bit for bit, never
// exceed the budget, and leave the hazard checker nothing to report; the optimizer state streams
// with its blocks (never whole on the device) and raises the minimum; a budget below the minimum
// is refused; the CLI's --sim-device --gpu-mem run writes the same model as a run without
// streaming, and an Adam run killed and resumed under streaming finishes as the plain one.
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "common.h"
#include "golden_batch.h"
#include "zof/backend.h"
#include "cuda/cuda_backend.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "cpu/sim_device.h"
#include "zof/streaming.h"
#include "zof/zo.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using Opt = zof::ZOStepOptions::Optimizer;

std::string model_dir(const std::string& name) {
  if (name == "stories260K") return zof::test::assets_dir() + "/models/stories260K";
  return zof::test::source_dir() + "/tests/golden/" + name;
}

// Two micro-batches: the golden batch's first row, then its other rows (stories260K: two
// batches of made-up ids).
std::vector<zof::LossBatch> micro_batches(const std::string& name) {
  std::vector<std::vector<int32_t>> seqs;
  if (name == "stories260K") {
    for (int r = 0; r < 3; ++r) {
      std::vector<int32_t> s;
      for (int t = 0; t < 16 - 4 * r; ++t) s.push_back(1 + (37 * t + 101 * r) % 500);
      seqs.push_back(s);
    }
  } else {
    std::ifstream f(model_dir(name) + "/golden.json");
    const json g = json::parse(f);
    for (size_t b = 0; b < g["input_ids"].size(); ++b) {
      std::vector<int32_t> s;
      for (int t = 0; t < g["lengths"][b].get<int>(); ++t) s.push_back(g["input_ids"][b][t]);
      seqs.push_back(s);
    }
  }
  std::vector<zof::LossBatch> mb;
  mb.push_back(zof::LossBatch::next_token(zof::Batch::from_sequences({seqs[0]})));
  mb.push_back(zof::LossBatch::next_token(zof::Batch::from_sequences({seqs.begin() + 1, seqs.end()})));
  return mb;
}

int64_t max_rows(const std::vector<zof::LossBatch>& mb) {
  int64_t r = 0;
  for (auto& b : mb) r = std::max(r, b.batch.B * b.batch.T);
  return r;
}

struct RunResult {
  std::vector<zof::QueryLosses> losses;
  double eval_loss = 0;
  std::vector<float> weights, m, v;  // after the flush; m, v: the optimizer state (read_state)
  zof::SimDeviceStats sim;
  zof::StreamingStats before_flush, after;
  bool all_resident = false;
  int slots = 0;
};

constexpr int kSteps = 3;

// kSteps ZO steps (losses, gradients, the update applied by the next walk), then the loss at the
// flushed weights. budget 0: the plain CPU backend, no streaming.
using zof::test::storage_values;

RunResult run_steps(const std::string& name, const zof::ZOStepOptions& o, size_t budget,
                    double bandwidth = 0, zof::DType held = zof::DType::F32) {
  zof::Model m = zof::Model::load(model_dir(name), held);
  const auto mb = micro_batches(name);
  std::unique_ptr<zof::Backend> be;
  zof::SimDevice* sim = nullptr;
  if (budget > 0) {
    zof::SimDeviceOptions so;
    so.budget = budget;
    so.copy_bandwidth = bandwidth;
    auto s = zof::make_sim_device(zof::test::cpu_backend(0), so);
    sim = s.get();
    be = std::move(s);
  } else {
    be = zof::test::cpu_backend(0);
  }
  RunResult r;
  {
    zof::ZOEngine eng(m, *be, max_rows(mb), o);
    if (budget > 0) eng.enable_streaming(budget);
    for (int step = 0; step < kSteps; ++step) {
      const auto ql = eng.perturbed_losses((uint32_t)step, mb);
      r.losses.push_back(ql);
      eng.schedule_update((uint32_t)step, 1e-3f, eng.projected_gradients(ql));
    }
    if (auto* st = eng.streamer()) {
      r.before_flush = st->stats();
      r.all_resident = st->all_resident();
      r.slots = st->num_slots();
    }
    r.eval_loss = eng.loss(mb);  // flushes: the model's storage is current from here
    if (auto* st = eng.streamer()) r.after = st->stats();
    r.weights = storage_values(m);
    eng.read_state(r.m, r.v);
  }
  if (sim) r.sim = sim->stats();
  return r;
}

// The engine's buffers and the model's blocks (with their optimizer state), measured on a roomy
// simulated device.
struct Sizes {
  size_t minimum = 0, whole = 0;  // least budget; every block resident
  size_t buffers = 0;             // the engine's own buffers
  int blocks = 0, planes = 1;     // planes: weights, then m and v
};
Sizes sizes(const std::string& name, const zof::ZOStepOptions& o,
            zof::DType held = zof::DType::F32) {
  zof::Model m = zof::Model::load(model_dir(name), held);
  const auto mb = micro_batches(name);
  zof::SimDeviceOptions so;
  so.budget = size_t(1) << 30;
  auto sim = zof::make_sim_device(zof::test::cpu_backend(0), so);
  zof::ZOEngine eng(m, *sim, max_rows(mb), o);
  const int planes = 1 + eng.state_planes();
  return {eng.streaming_minimum(),
          eng.streaming_buffers() + zof::BlockStreamer::all_resident_bytes(m, planes),
          eng.buffer_bytes(), (int)m.blocks().size(), planes};
}

// Empty vectors (no optimizer state) are equal; memcmp must not see their null data().
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Case {
  std::string model;
  int queries = 1;
  float weight_decay = 0.f;
  bool one_sided = false;
  Opt optimizer = Opt::SGD;
  zof::DType compute = zof::DType::F32;  // --dtype
  zof::DType master = zof::DType::F32;   // --master
  zof::DType held = zof::DType::F32;     // the model's storage (a bf16 master in 2 bytes)
  int round_every = 1;                   // a bf16 master's rounding window (--round-every)
};

class StreamedSteps : public ::testing::TestWithParam<Case> {};

TEST_P(StreamedSteps, MatchThePlainRunBitForBit) {
  const Case c = GetParam();
  ZOF_REQUIRE_PATH(model_dir(c.model) + "/model.safetensors");
  zof::ZOStepOptions o;
  o.eps = 1e-2f;
  o.weight_decay = c.weight_decay;
  o.queries = c.queries;
  o.seed = 99;
  o.one_sided = c.one_sided;
  o.optimizer = c.optimizer;
  o.compute = c.compute;
  o.master = c.master;
  o.round_every = c.round_every;
  const RunResult plain = run_steps(c.model, o, 0, 0, c.held);
  const Sizes sz = sizes(c.model, o, c.held);
  ASSERT_LT(sz.minimum, sz.whole);
  // The minimum, two budgets in between, the whole model, and more than it.
  const std::vector<size_t> budgets = {sz.minimum, sz.minimum + (sz.whole - sz.minimum) / 3,
                                       sz.minimum + 2 * (sz.whole - sz.minimum) / 3, sz.whole,
                                       2 * sz.whole};
  for (size_t budget : budgets) {
    SCOPED_TRACE("budget " + std::to_string(budget) + " (minimum " + std::to_string(sz.minimum) +
                 ", whole model " + std::to_string(sz.whole) + ")");
    const RunResult s = run_steps(c.model, o, budget, 0, c.held);
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_EQ(s.losses[step].sum_plus, plain.losses[step].sum_plus) << "step " << step;
      EXPECT_EQ(s.losses[step].sum_minus, plain.losses[step].sum_minus) << "step " << step;
      EXPECT_EQ(s.losses[step].count, plain.losses[step].count);
    }
    EXPECT_EQ(s.eval_loss, plain.eval_loss);
    ASSERT_EQ(s.weights.size(), plain.weights.size());
    EXPECT_EQ(std::memcmp(s.weights.data(), plain.weights.data(), s.weights.size() * 4), 0)
        << "the final weights differ";
    EXPECT_TRUE(same_bits(s.m, plain.m)) << "the optimizer's m differs";
    EXPECT_TRUE(same_bits(s.v, plain.v)) << "Adam's v differs";
    EXPECT_LE(s.sim.peak, budget);
    EXPECT_GT(s.sim.peak, 0u);
    EXPECT_EQ(s.sim.hazards, 0) << s.sim.first_hazard;
    EXPECT_EQ(s.sim.foreign, 0) << s.sim.first_foreign;
    if (budget >= sz.whole) {
      // Every block uploaded once and kept; the host copy written only by the flush.
      EXPECT_TRUE(s.all_resident);
      EXPECT_EQ(s.before_flush.uploads, sz.blocks);
      EXPECT_EQ(s.before_flush.writebacks, 0);
      EXPECT_EQ(s.after.uploads, sz.blocks);
      EXPECT_EQ(s.after.writebacks, sz.blocks);
    } else {
      EXPECT_FALSE(s.all_resident);
      EXPECT_GE(s.slots, 2);
      EXPECT_GT(s.before_flush.uploads, sz.blocks);
      if (c.round_every >= kSteps)  // every walk after the first held: nothing written back
        EXPECT_EQ(s.before_flush.writebacks, 0);
      else
        EXPECT_GT(s.before_flush.writebacks, 0);
    }
    if (budget == sz.minimum) {
      EXPECT_EQ(s.slots, 2);
    }
  }
  // The plain run's weights moved: the comparison above compared something.
  const std::vector<float> base = storage_values(zof::Model::load(model_dir(c.model), c.held));
  EXPECT_NE(std::memcmp(base.data(), plain.weights.data(), plain.weights.size() * 4), 0);
  const std::vector<float> zeros(plain.m.size(), 0.f);
  EXPECT_EQ(plain.m.size(), c.optimizer == Opt::SGD ? 0u : plain.weights.size());
  EXPECT_EQ(plain.v.size(), c.optimizer == Opt::Adam ? plain.weights.size() : 0u);
  if (c.optimizer != Opt::SGD) {
    EXPECT_FALSE(same_bits(plain.m, zeros)) << "m never moved";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, StreamedSteps,
    ::testing::Values(Case{"llama_gqa", 1}, Case{"llama_gqa", 2, 0.1f}, Case{"gpt2", 1},
                      Case{"gpt2", 2, 0.05f}, Case{"opt350_shape", 1}, Case{"opt350_shape", 2},
                      Case{"stories260K", 1}, Case{"stories260K", 2, 0.1f},
                      Case{"llama_gqa", 2, 0.f, true},
                      Case{"stories260K", 1, 0.f, false, Opt::Adam},
                      Case{"stories260K", 2, 0.1f, false, Opt::Momentum},
                      Case{"llama_gqa", 2, 0.1f, false, Opt::Adam},
                      Case{"gpt2", 1, 0.f, true, Opt::Momentum},
                      // bf16 products: the walk's bf16 copies and the evaluation's converted
                      // blocks (OPT-350m's projections, GPT-2's tied head, one-sided, Adam)
                      Case{"llama_gqa", 2, 0.1f, false, Opt::SGD, zof::DType::BF16},
                      Case{"opt350_shape", 2, 0.f, false, Opt::SGD, zof::DType::BF16},
                      Case{"gpt2", 1, 0.f, true, Opt::Momentum, zof::DType::BF16},
                      Case{"stories260K", 1, 0.f, false, Opt::Adam, zof::DType::BF16},
                      Case{"phi3", 2, 0.1f, false, Opt::SGD, zof::DType::BF16},
                      Case{"gemma2", 2, 0.1f},
                      Case{"qwen2_window", 1},
                      // a bf16 master: the rounding on the device, as on the host
                      Case{"stories260K", 2, 0.1f, false, Opt::SGD, zof::DType::F32,
                           zof::DType::BF16},
                      Case{"llama_gqa", 1, 0.f, false, Opt::Adam, zof::DType::BF16,
                           zof::DType::BF16},
                      Case{"gemma3", 1, 0.f, false, Opt::SGD, zof::DType::BF16},
                      // a bf16 master held in 2 bytes: blocks cross the bus in bf16, the walk
                      // reads and updates them so on the device (GPT-2's tied head, OPT's
                      // projections, one-sided, momentum and Adam state beside bf16 weights)
                      Case{"stories260K", 2, 0.1f, false, Opt::SGD, zof::DType::F32,
                           zof::DType::BF16, zof::DType::BF16},
                      Case{"llama_gqa", 1, 0.f, false, Opt::Adam, zof::DType::BF16,
                           zof::DType::BF16, zof::DType::BF16},
                      Case{"gpt2", 1, 0.f, true, Opt::Momentum, zof::DType::F32,
                           zof::DType::BF16, zof::DType::BF16},
                      Case{"opt350_shape", 2, 0.05f, false, Opt::SGD, zof::DType::BF16,
                           zof::DType::BF16, zof::DType::BF16},
                      Case{"gemma2", 2, 0.1f, false, Opt::Momentum, zof::DType::BF16,
                           zof::DType::BF16, zof::DType::BF16},
                      // a rounding window: the held walks (steps 1) read the device's blocks
                      // through the window's updates and write nothing back; step 2 closes it
                      // (GPT-2's tied head one-sided, OPT's projections in bf16 products)
                      Case{"stories260K", 2, 0.1f, false, Opt::SGD, zof::DType::F32,
                           zof::DType::BF16, zof::DType::BF16, 2},
                      Case{"gpt2", 1, 0.f, true, Opt::SGD, zof::DType::BF16, zof::DType::BF16,
                           zof::DType::BF16, 2},
                      Case{"opt350_shape", 2, 0.05f, false, Opt::SGD, zof::DType::BF16,
                           zof::DType::BF16, zof::DType::BF16, 4}),
    [](const auto& info) {
      const Case& c = info.param;
      return c.model + "_q" + std::to_string(c.queries) + (c.weight_decay > 0 ? "_wd" : "") +
             (c.one_sided ? "_one_sided" : "") +
             (c.optimizer == Opt::Adam ? "_adam" : c.optimizer == Opt::Momentum ? "_momentum" : "") +
             (c.compute == zof::DType::BF16 ? "_bf16" : "") +
             (c.master == zof::DType::BF16 ? "_master_bf16" : "") +
             (c.held == zof::DType::BF16 ? "_held_bf16" : "") +
             (c.round_every > 1 ? "_window" + std::to_string(c.round_every) : "");
    });

// The optimizer state streams with its blocks: the minimum grows by a slot's share of m (and v),
// and at that minimum the device never holds m or v whole, nor more than the budget.
TEST(Streaming, OptimizerStateStreamsWithItsBlocks) {
  ZOF_REQUIRE_PATH(model_dir("stories260K") + "/model.safetensors");
  zof::ZOStepOptions o;
  o.eps = 1e-2f;
  o.seed = 12;
  o.queries = 2;
  o.weight_decay = 0.05f;
  const Sizes sgd = sizes("stories260K", o);
  o.optimizer = Opt::Momentum;
  const Sizes momentum = sizes("stories260K", o);
  o.optimizer = Opt::Adam;
  const Sizes adam = sizes("stories260K", o);
  zof::Model m = zof::Model::load(model_dir("stories260K"));
  EXPECT_EQ(adam.planes, 3);
  EXPECT_EQ(adam.buffers, sgd.buffers) << "the engine's own buffers hold no optimizer state";
  EXPECT_EQ(sgd.minimum, sgd.buffers + zof::BlockStreamer::min_bytes(m, 1));
  EXPECT_EQ(momentum.minimum, sgd.buffers + zof::BlockStreamer::min_bytes(m, 2));
  EXPECT_EQ(adam.minimum, sgd.buffers + zof::BlockStreamer::min_bytes(m, 3));
  EXPECT_LT(sgd.minimum, momentum.minimum);
  EXPECT_LT(momentum.minimum, adam.minimum);

  const RunResult plain = run_steps("stories260K", o, 0);
  const RunResult s = run_steps("stories260K", o, adam.minimum);
  EXPECT_EQ(s.slots, 2);
  EXPECT_FALSE(s.all_resident);
  EXPECT_TRUE(same_bits(s.weights, plain.weights));
  EXPECT_TRUE(same_bits(s.m, plain.m));
  EXPECT_TRUE(same_bits(s.v, plain.v));
  EXPECT_EQ(s.sim.hazards, 0) << s.sim.first_hazard;
  EXPECT_EQ(s.sim.foreign, 0) << s.sim.first_foreign;
  EXPECT_LE(s.sim.peak, adam.minimum);
  // Whole on the device, m and v alone would take the weights' bytes twice over; the blocks'
  // share of the peak (two slots of weights, m and v) is well under the three whole.
  const size_t state_whole = 2 * zof::BlockStreamer::all_resident_bytes(m, 1);
  EXPECT_LT(s.sim.peak, adam.buffers + state_whole);
  EXPECT_LT(2 * (s.sim.peak - adam.buffers), zof::BlockStreamer::all_resident_bytes(m, 3));

  // A budget that fits SGD's slots but not Adam's is refused, naming the flag and the fix.
  zof::SimDeviceOptions so;
  so.budget = adam.minimum - 1;
  auto sim = zof::make_sim_device(zof::test::cpu_backend(0), so);
  const auto mb = micro_batches("stories260K");
  zof::ZOEngine eng(m, *sim, max_rows(mb), o);
  for (size_t budget : {sgd.minimum, adam.minimum - 1}) {
    try {
      eng.enable_streaming(budget);
      FAIL() << "Adam streamed within " << budget << " bytes, below its minimum of "
             << adam.minimum;
    } catch (const zof::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("--gpu-mem"), std::string::npos) << msg;
      EXPECT_NE(msg.find("minimum of " + std::to_string(adam.minimum) + " bytes"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("Adam's m and v"), std::string::npos) << msg;
    }
  }
}

// The state read from a streamed run (a checkpoint) and written into a fresh engine, streamed or
// not, continues exactly as the run that never stopped.
TEST(Streaming, OptimizerStateResumesExactly) {
  ZOF_REQUIRE_PATH(model_dir("stories260K") + "/model.safetensors");
  for (Opt opt : {Opt::Momentum, Opt::Adam}) {
    SCOPED_TRACE(opt == Opt::Adam ? "adam" : "momentum");
    zof::ZOStepOptions o;
    o.eps = 1e-2f;
    o.seed = 21;
    o.weight_decay = 0.1f;
    o.optimizer = opt;
    const auto mb = micro_batches("stories260K");
    const size_t minimum = sizes("stories260K", o).minimum;
    struct State {
      std::vector<float> weights, m, v;
    };
    // Steps [first, last) from `from` (null: the model's own weights and zero state) on the plain
    // backend (budget 0) or streamed; the state after a flush.
    auto steps = [&](const State* from, uint32_t first, uint32_t last, size_t budget) {
      zof::Model m = zof::Model::load(model_dir("stories260K"));
      if (from) std::copy(from->weights.begin(), from->weights.end(), m.storage());
      zof::SimDeviceOptions so;
      so.budget = budget;
      std::unique_ptr<zof::Backend> be =
          budget ? std::unique_ptr<zof::Backend>(zof::make_sim_device(zof::test::cpu_backend(0), so))
                 : zof::test::cpu_backend(0);
      State out;
      {
        zof::ZOEngine eng(m, *be, max_rows(mb), o);
        if (budget) eng.enable_streaming(budget);
        if (from) eng.write_state(from->m, from->v);
        for (uint32_t step = first; step < last; ++step) {
          const auto ql = eng.perturbed_losses(step, mb);
          eng.schedule_update(step, 1e-3f, eng.projected_gradients(ql));
          if (step == 1) eng.flush();  // where the checkpoint is taken
        }
        eng.read_state(out.m, out.v);
        out.weights.assign(m.storage(), m.storage() + m.storage_size());
      }
      if (budget) {
        const auto st = static_cast<zof::SimDevice*>(be.get())->stats();
        EXPECT_EQ(st.hazards, 0) << st.first_hazard;
        EXPECT_EQ(st.foreign, 0) << st.first_foreign;
        EXPECT_LE(st.peak, budget);
      }
      return out;
    };
    const State whole = steps(nullptr, 0, 4, 0);
    const State half = steps(nullptr, 0, 2, minimum);
    for (size_t budget : {minimum, size_t(0)}) {
      SCOPED_TRACE("resumed with budget " + std::to_string(budget));
      const State resumed = steps(&half, 2, 4, budget);
      EXPECT_TRUE(same_bits(resumed.weights, whole.weights));
      EXPECT_TRUE(same_bits(resumed.m, whole.m));
      EXPECT_TRUE(same_bits(resumed.v, whole.v));
    }
  }
}

// A slow simulated bus: compute waits on uploads, and the results do not change.
TEST(Streaming, SlowCopiesChangeNothing) {
  ZOF_REQUIRE_PATH(model_dir("stories260K") + "/model.safetensors");
  zof::ZOStepOptions o;
  o.eps = 1e-2f;
  o.queries = 2;
  o.seed = 5;
  const RunResult plain = run_steps("stories260K", o, 0);
  const Sizes sz = sizes("stories260K", o);
  const RunResult s = run_steps("stories260K", o, sz.minimum, 200e6);
  for (int step = 0; step < kSteps; ++step)
    EXPECT_EQ(s.losses[step].sum_plus, plain.losses[step].sum_plus);
  EXPECT_EQ(std::memcmp(s.weights.data(), plain.weights.data(), s.weights.size() * 4), 0);
  EXPECT_EQ(s.sim.hazards, 0) << s.sim.first_hazard;
  EXPECT_EQ(s.sim.foreign, 0) << s.sim.first_foreign;
  EXPECT_LE(s.sim.peak, sz.minimum);
}

TEST(Streaming, BudgetBelowTheMinimumIsRefused) {
  ZOF_REQUIRE_PATH(model_dir("llama_gqa") + "/model.safetensors");
  zof::ZOStepOptions o;
  const Sizes sz = sizes("llama_gqa", o);
  zof::Model m = zof::Model::load(model_dir("llama_gqa"));
  const auto mb = micro_batches("llama_gqa");
  zof::SimDeviceOptions so;
  so.budget = sz.minimum - 1;
  auto sim = zof::make_sim_device(zof::test::cpu_backend(0), so);
  zof::ZOEngine eng(m, *sim, max_rows(mb), o);
  try {
    eng.enable_streaming(sz.minimum - 1);
    FAIL() << "a budget below the minimum was accepted";
  } catch (const zof::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--gpu-mem"), std::string::npos) << msg;
    EXPECT_NE(msg.find("minimum of " + std::to_string(sz.minimum) + " bytes"), std::string::npos)
        << msg;
  }
  // A device too small for the engine's own buffers fails when they are allocated, at the first
  // one or part way through (in Forward's buffers or the engine's): whatever was allocated
  // before the failure is given back.
  int part_way = 0;
  for (size_t budget : {size_t(1024), sz.minimum / 8, sz.minimum / 3, sz.minimum / 2}) {
    so.budget = budget;
    auto tiny = zof::make_sim_device(zof::test::cpu_backend(0), so);
    try {
      zof::ZOEngine e2(m, *tiny, max_rows(mb), o);
      FAIL() << "the engine's buffers fit in " << budget << " bytes";
    } catch (const zof::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--gpu-mem"), std::string::npos) << e.what();
    }
    EXPECT_EQ(tiny->stats().in_use, 0u) << "budget " << budget << ": a failed engine kept memory";
    part_way += tiny->stats().peak > 0;
  }
  EXPECT_GE(part_way, 2);  // the larger budgets failed after some buffers were allocated
}

// A walk cut short by an error (a token id outside the vocabulary, found with the embedding
// block held) leaves the engine usable: the next walk and the flush give the plain run's bits.
TEST(Streaming, AWalkCutShortLeavesNothingHeld) {
  ZOF_REQUIRE_PATH(model_dir("llama_gqa") + "/model.safetensors");
  zof::ZOStepOptions o;
  o.seed = 3;
  const Sizes sz = sizes("llama_gqa", o);
  auto mb = micro_batches("llama_gqa");
  auto bad = mb;
  bad[1].batch.ids[0] = 100000;
  std::vector<std::vector<float>> weights;
  std::vector<double> losses;
  for (size_t budget : {size_t(0), sz.minimum}) {
    zof::Model m = zof::Model::load(model_dir("llama_gqa"));
    zof::SimDeviceOptions so;
    so.budget = budget;
    std::unique_ptr<zof::Backend> be = budget ? std::unique_ptr<zof::Backend>(zof::make_sim_device(
                                                    zof::test::cpu_backend(0), so))
                                              : zof::test::cpu_backend(0);
    zof::ZOEngine eng(m, *be, max_rows(mb), o);
    if (budget) eng.enable_streaming(budget);
    EXPECT_THROW(eng.perturbed_losses(0, bad), zof::Error);
    const auto ql = eng.perturbed_losses(1, mb);
    losses.push_back(ql.sum_plus[0]);
    eng.schedule_update(1, 1e-3f, eng.projected_gradients(ql));
    eng.flush();
    weights.emplace_back(m.storage(), m.storage() + m.storage_size());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(weights[0], weights[1]);
}

// The scheduler alone: blocks changed on the device in every walk (+1 per walk) reach the host
// through write-backs and slot reuse, under a slow bus; reload_from_host() picks up host edits.
TEST(Streaming, WriteBacksReachTheHost) {
  ZOF_REQUIRE_PATH(model_dir("stories260K") + "/model.safetensors");
  zof::Model m = zof::Model::load(model_dir("stories260K"));
  const std::vector<float> base(m.storage(), m.storage() + m.storage_size());
  const int nb = (int)m.blocks().size();
  size_t span = 0;
  for (auto& b : m.blocks()) span = std::max<size_t>(span, b.span);
  zof::SimDeviceOptions so;
  const size_t ones_bytes = (span * 4 + 63) / 64 * 64;
  so.budget = ones_bytes + zof::BlockStreamer::min_bytes(m) + 1024;
  so.copy_bandwidth = 100e6;
  auto sim = zof::make_sim_device(zof::test::cpu_backend(0), so);
  float* ones = (float*)sim->alloc(span * 4);
  const std::vector<float> host_ones(span, 1.f);
  sim->copy_to_device(ones, host_ones.data(), span * 4, nullptr);
  {
    zof::BlockStreamer st(m, *sim, so.budget - ones_bytes);
    EXPECT_EQ(st.num_slots(), 2);
    // Each walk: every block once, block 0 again after the last (as with a tied head); only the
    // layers change.
    std::vector<int> order;
    for (int b = 0; b < nb; ++b) order.push_back(b);
    order.push_back(0);
    const int walks = 4;
    for (int w = 0; w < walks; ++w) {
      st.begin_walk(order);
      for (int b : order) {
        float* d = st.acquire(b);
        const bool layer = b > 0 && b < nb - 1;
        if (layer) sim->add(d, ones, m.blocks()[b].span);
        st.release(b, layer);
      }
    }
    st.sync_to_host();
    for (int b = 0; b < nb; ++b) {
      const auto& blk = m.blocks()[b];
      const bool layer = b > 0 && b < nb - 1;
      for (int64_t i = 0; i < blk.span; i += 97) {
        float want = base[blk.offset + i];
        for (int w = 0; w < walks && layer; ++w) want += 1.f;
        ASSERT_EQ(m.storage()[blk.offset + i], want) << "block " << b;
      }
    }
    EXPECT_GT(st.stats().hits, 0);  // block 0 found in its slot after the head
    // Host edits (after sync_to_host: no upload reads the host copy any more): seen after
    // reload_from_host().
    m.storage()[m.blocks()[1].offset] = 1234.f;
    st.reload_from_host();
    st.begin_walk({1});
    const float* d = st.acquire(1);
    sim->synchronize(nullptr);
    EXPECT_EQ(d[0], 1234.f);
    st.release(1, false);
    st.sync_to_host();
  }
  const auto s = sim->stats();
  EXPECT_EQ(s.hazards, 0) << s.first_hazard;
  EXPECT_EQ(s.foreign, 0) << s.first_foreign;
  EXPECT_LE(s.peak, so.budget);
  sim->free(ones);
}

TEST(Streaming, MemorySizes) {
  EXPECT_EQ(zof::parse_memory_size("16GiB", "--gpu-mem"), 16ull << 30);
  EXPECT_EQ(zof::parse_memory_size("512MiB", "--gpu-mem"), 512ull << 20);
  EXPECT_EQ(zof::parse_memory_size("512mib", "--gpu-mem"), 512ull << 20);
  EXPECT_EQ(zof::parse_memory_size("1.5G", "--gpu-mem"), 3ull << 29);
  EXPECT_EQ(zof::parse_memory_size("2GB", "--gpu-mem"), 2000000000ull);
  EXPECT_EQ(zof::parse_memory_size("4096", "--gpu-mem"), 4096ull);
  EXPECT_EQ(zof::parse_memory_size("64 KiB", "--gpu-mem"), 65536ull);
  for (const char* bad : {"", "abc", "-1GiB", "16 GiBs", "1e9", "0", "0.1B", ".5G", "5.G", "inf"}) {
    try {
      zof::parse_memory_size(bad, "--gpu-mem");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const zof::Error& e) {
      EXPECT_NE(std::string(e.what()).find("--gpu-mem"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(zof::format_bytes(512), "512 B");
  EXPECT_EQ(zof::format_bytes(3 << 19), "1.50 MiB");
}

// ---- the CLI -------------------------------------------------------------------------------

class StreamingCli : public zof::test::ShakespeareRunTest {
 protected:
  // env: variables for the command (fault injection), e.g. "ZOF_FAULT_KILL_AT_STEP=3 ".
  zof::test::CommandResult finetune(const std::string& out, const std::string& extra,
                                    const std::string& env = "") {
    return zof::test::run_command(
        env + zof::test::zof_binary() + " finetune --model " + model_dir("stories260K") +
        " --task text --data " + (dir_ / "text.txt").string() + " --out " + (dir_ / out).string() +
        " --steps 5 --batch 4 --micro-batches 2 --queries 2 --seq-len 32 --lr 1e-4 --eps 1e-3 "
        "--seed 7 --save-every 2 --eval-examples 8 --json " + extra);
  }
  static json last_json(const std::string& out) { return zof::test::last_json(out); }
};

TEST_F(StreamingCli, SimDeviceRunWritesTheSameModel) {
  auto plain = finetune("plain", "");
  ASSERT_EQ(plain.code, 0) << plain.err;
  // A roomy budget (every block resident) reports the least one it would take.
  auto roomy = finetune("roomy", "--sim-device --gpu-mem 256MiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const json jr = last_json(roomy.out);
  ASSERT_TRUE(jr.contains("streaming")) << jr.dump();
  EXPECT_EQ(jr["streaming"]["streamed_blocks"], 0);
  const uint64_t minimum = jr["streaming"]["min_bytes"];
  // At the minimum: every block streams through two slots.
  auto tight = finetune("tight", "--sim-device --gpu-mem " + std::to_string(minimum));
  ASSERT_EQ(tight.code, 0) << tight.err;
  const json jt = last_json(tight.out);
  EXPECT_GT(jt["streaming"]["streamed_blocks"].get<int>(), 0) << jt.dump();
  EXPECT_EQ(jt["streaming"]["slots"], 2);
  EXPECT_LE(jt["streaming"]["peak_bytes"].get<uint64_t>(), minimum);
  EXPECT_EQ(jt["streaming"]["hazards"], 0);
  EXPECT_EQ(jt["streaming"]["foreign_pointers"], 0) << jt["streaming"].dump();
  EXPECT_GT(jt["streaming"]["bytes_uploaded"].get<uint64_t>(), 0u);
  for (const char* run : {"roomy", "tight"}) {
    EXPECT_EQ(zof::test::read_file((dir_ / run / "model.safetensors").string()),
              zof::test::read_file((dir_ / "plain" / "model.safetensors").string()))
        << run;
    EXPECT_EQ(zof::test::read_file((dir_ / run / "zo_log.jsonl").string()),
              zof::test::read_file((dir_ / "plain" / "zo_log.jsonl").string()))
        << run;
  }
  // One byte less is refused, naming the flag and the minimum.
  auto below = finetune("below", "--sim-device --gpu-mem " + std::to_string(minimum - 1));
  EXPECT_EQ(below.code, 1);
  EXPECT_NE(below.err.find("--gpu-mem"), std::string::npos) << below.err;
  EXPECT_NE(below.err.find("minimum of " + std::to_string(minimum) + " bytes"), std::string::npos)
      << below.err;
  // --gpu-mem is layout, not part of the run: run.json does not hold it.
  EXPECT_EQ(zof::test::read_file((dir_ / "tight" / "run.json").string()).find("gpu"),
            std::string::npos);
}

// Adam under streaming: its minimum is above SGD's, and a run killed after a checkpoint and
// resumed (its state back from optimizer.safetensors into host memory) writes the plain run's
// model, step log and final optimizer state.
TEST_F(StreamingCli, AdamRunResumesExactly) {
  const std::string adam = "--optimizer adam --lr 1e-3 ";
  auto plain = finetune("plain", adam);
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto roomy_sgd = finetune("roomy_sgd", "--sim-device --gpu-mem 256MiB");
  ASSERT_EQ(roomy_sgd.code, 0) << roomy_sgd.err;
  auto roomy = finetune("roomy", adam + "--sim-device --gpu-mem 256MiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const uint64_t minimum = last_json(roomy.out)["streaming"]["min_bytes"];
  EXPECT_GT(minimum, last_json(roomy_sgd.out)["streaming"]["min_bytes"].get<uint64_t>());
  const std::string tight = adam + "--sim-device --gpu-mem " + std::to_string(minimum);
  // Killed at step 3, after the checkpoint of step 2.
  auto killed = finetune("tight", tight, "ZOF_FAULT_KILL_AT_STEP=3 ");
  ASSERT_EQ(killed.code, 128 + SIGKILL) << killed.err;
  auto resumed = zof::test::run_command(zof::test::zof_binary() + " finetune --resume " +
                                        (dir_ / "tight").string() + " --json --sim-device " +
                                        "--gpu-mem " + std::to_string(minimum));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming at step 2"), std::string::npos) << resumed.err;
  const json j = last_json(resumed.out);
  EXPECT_GT(j["streaming"]["streamed_blocks"].get<int>(), 0) << j.dump();
  EXPECT_LE(j["streaming"]["peak_bytes"].get<uint64_t>(), minimum);
  EXPECT_EQ(j["streaming"]["hazards"], 0);
  EXPECT_EQ(j["streaming"]["foreign_pointers"], 0) << j["streaming"].dump();
  ASSERT_TRUE(fs::exists(dir_ / "plain" / "checkpoint-5" / "optimizer.safetensors"));
  for (const char* f : {"model.safetensors", "zo_log.jsonl", "checkpoint-5/optimizer.safetensors"})
    EXPECT_EQ(zof::test::read_file((dir_ / "tight" / f).string()),
              zof::test::read_file((dir_ / "plain" / f).string()))
        << f;
  auto below = finetune("below", adam + "--sim-device --gpu-mem " + std::to_string(minimum - 1));
  EXPECT_EQ(below.code, 1);
  EXPECT_NE(below.err.find("--gpu-mem"), std::string::npos) << below.err;
  EXPECT_NE(below.err.find("minimum of " + std::to_string(minimum) + " bytes"), std::string::npos)
      << below.err;
}

// The forward-gradient estimator on a device: the JVP walk reads the streamer's blocks (here at
// the least budget, every block through two slots) and writes the plain JVP run's model.
TEST_F(StreamingCli, JvpRunOnTheDeviceWritesTheSameModel) {
  auto plain = finetune("plain", "--estimator jvp");
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto roomy = finetune("roomy", "--estimator jvp --sim-device --gpu-mem 256MiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  // The minimum counts the JVP walk's buffers with the engine's: the run fits it exactly.
  const json jr = last_json(roomy.out)["streaming"];
  const uint64_t minimum = jr["min_bytes"];
  EXPECT_GE(jr["peak_bytes"].get<uint64_t>() - jr["device_bytes"].get<uint64_t>(),
            jr["buffer_bytes"].get<uint64_t>());
  auto tight = finetune("tight", "--estimator jvp --sim-device --gpu-mem " + std::to_string(minimum));
  ASSERT_EQ(tight.code, 0) << tight.err;
  const json jt = last_json(tight.out)["streaming"];
  EXPECT_GT(jt["streamed_blocks"].get<int>(), 0) << jt.dump();
  EXPECT_LE(jt["peak_bytes"].get<uint64_t>(), minimum) << jt.dump();
  for (const auto* r : {&roomy, &tight}) {
    const json j = last_json(r->out);
    EXPECT_EQ(j["streaming"]["hazards"], 0) << j.dump();
    EXPECT_EQ(j["streaming"]["foreign_pointers"], 0) << j["streaming"].dump();
  }
  for (const char* run : {"roomy", "tight"})
    EXPECT_EQ(zof::test::read_file((dir_ / run / "model.safetensors").string()),
              zof::test::read_file((dir_ / "plain" / "model.safetensors").string()))
        << run;
}

TEST_F(StreamingCli, BadBudgetsAreRefused) {
  auto expect_error = [&](const std::string& extra, const std::string& what) {
    auto r = finetune("bad", extra);
    EXPECT_EQ(r.code, 1) << extra << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("zof: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
    fs::remove_all(dir_ / "bad");
  };
  expect_error("--sim-device --gpu-mem 12XB", "--gpu-mem '12XB' is not a memory size");
  expect_error("--sim-device --gpu-mem 0", "--gpu-mem must be a positive memory size");
  expect_error("--sim-device --gpu-mem 4KiB", "--gpu-mem");  // not even the buffers fit
  expect_error("--gpu-mem 1GiB", "--sim-device");               // no device in a CPU build
  expect_error("--sim-device --gpu-mem 1GiB --pipeline-stages 2", "--pipeline-stages");
  expect_error("--device tpu", "--device must be cpu or cuda");
  expect_error("--device cuda --sim-device", "--sim-device");
  if (zof::cuda_device_count() == 0)  // no GPU (or a build without CUDA): says how to get one
    expect_error("--device cuda", "CUDA");
}

}  // namespace

namespace {

// `zof eval` and `zof generate` on a device: the weights stream through it from the model's
// storage within --gpu-mem. On the simulated device (the host's kernels) the numbers are the
// CPU's bit for bit, at a budget that streams most blocks and at one that holds them all.
TEST(StreamingText, EvalAndGenerateOnTheDeviceEqualTheCpu) {
  const std::string m = zof::test::assets_dir() + "/models/stories260K";
  const std::string t = zof::test::assets_dir() + "/data/tinystories/tinystories_sample_cs336.txt";
  ZOF_REQUIRE_PATH(m + "/model.safetensors");
  ZOF_REQUIRE_PATH(t);
  auto last = [](const std::string& out) {
    const size_t end = out.find_last_not_of('\n');
    const size_t start = out.rfind('\n', end);
    return json::parse(out.substr(start == std::string::npos ? 0 : start + 1));
  };
  const std::string zof = zof::test::zof_binary();
  const std::string eval = zof + " eval --model " + m + " --text " + t + " --seq-len 128 --batch 2 --json";
  const std::string gen = zof + " generate --model " + m + " --max-new-tokens 24 --json";
  auto ec = zof::test::run_command(eval);
  auto gc = zof::test::run_command(gen);
  ASSERT_EQ(ec.code, 0) << ec.err;
  ASSERT_EQ(gc.code, 0) << gc.err;
  for (const char* budget : {"2MiB", "64MiB"}) {
    SCOPED_TRACE(budget);
    auto ed = zof::test::run_command(eval + " --sim-device --gpu-mem " + budget);
    auto gd = zof::test::run_command(gen + " --sim-device --gpu-mem " + budget);
    ASSERT_EQ(ed.code, 0) << ed.err;
    ASSERT_EQ(gd.code, 0) << gd.err;
    const json je = last(ed.out), jg = last(gd.out);
    EXPECT_EQ(je["nll"].get<double>(), last(ec.out)["nll"].get<double>());
    EXPECT_EQ(jg["ids"], last(gc.out)["ids"]);
    EXPECT_EQ(je["device"], "sim:cpu");
    ASSERT_TRUE(je.contains("streaming")) << je.dump();
    EXPECT_GT(je["streaming"]["bytes_uploaded"].get<double>(), 0);
    const bool tight = std::string(budget) == "2MiB";
    EXPECT_EQ(je["streaming"]["describe"].get<std::string>().find("7 of 7 blocks resident") !=
                  std::string::npos, !tight) << je.dump();
  }
  // A budget below what streaming needs is one line naming --gpu-mem.
  auto small = zof::test::run_command(eval + " --sim-device --gpu-mem 1700KiB");
  EXPECT_EQ(small.code, 1);
  EXPECT_EQ(small.err.rfind("zof: error: --gpu-mem", 0), 0u) << small.err;
  auto cpu_mem = zof::test::run_command(eval + " --gpu-mem 1GiB");
  EXPECT_EQ(cpu_mem.code, 1);
  EXPECT_NE(cpu_mem.err.find("--device cpu has none"), std::string::npos) << cpu_mem.err;
}

}  // namespace
