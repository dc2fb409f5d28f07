// The disk tier (zof/disk_tier.h) under the ZO walk: on the golden models, steps with the host
// masters' blocks beyond a --host-mem budget on disk give the plain run's losses, weights and
// optimizer state bit for bit, at the least budget and at half the model, on the host and
// streamed through the simulated device; each step reads a disk block once and writes it at
// most once; between walks a disk block holds no memory; all of it on each I/O engine (io_uring
// where the kernel takes it, the pread/pwrite pool); and the CLI writes the same
// model.safetensors and step log at every budget and engine, through a kill and a resume, and
// says which engine it runs.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/file.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common.h"
#include "golden_batch.h"
#include "zof/config.h"
#include "zof/disk_tier.h"
#include "zof/error.h"
#include "zof/model.h"
#include "cpu/sim_device.h"
#include "hf/safetensors.h"
#include "util/block_io.h"
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

// Two micro-batches of made-up ids below every golden model's vocabulary.
std::vector<zof::LossBatch> micro_batches() {
  std::vector<std::vector<int32_t>> seqs;
  for (int r = 0; r < 3; ++r) {
    std::vector<int32_t> s;
    for (int t = 0; t < 12 - 3 * r; ++t) s.push_back(1 + (37 * t + 101 * r) % 90);
    seqs.push_back(s);
  }
  std::vector<zof::LossBatch> mb;
  mb.push_back(zof::LossBatch::next_token(zof::Batch::from_sequences({seqs[0]})));
  mb.push_back(
      zof::LossBatch::next_token(zof::Batch::from_sequences({seqs.begin() + 1, seqs.end()})));
  return mb;
}

int64_t max_rows(const std::vector<zof::LossBatch>& mb) {
  int64_t r = 0;
  for (auto& b : mb) r = std::max(r, b.batch.B * b.batch.T);
  return r;
}

struct Case {
  std::string model;
  Opt optimizer = Opt::SGD;
  zof::DType master = zof::DType::F32;
  zof::DType held = zof::DType::F32;  // the model's storage (a bf16 master in 2 bytes)
  int round_every = 1;
  int queries = 1;
  int write_back = 1;  // the disk tier's write-back window
  float weight_decay = 0.f;
  float sparsity = 0.f;
  bool one_sided = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  const Case& c = i.param;
  std::string n = c.model + (c.optimizer == Opt::SGD ? "_sgd" : c.optimizer == Opt::Adam ? "_adam"
                                                                                        : "_momentum");
  if (c.master == zof::DType::BF16) n += c.held == zof::DType::BF16 ? "_bf16held" : "_bf16";
  if (c.round_every > 1) n += "_round" + std::to_string(c.round_every);
  if (c.queries > 1) n += "_q" + std::to_string(c.queries);
  if (c.write_back > 1) n += "_writeback" + std::to_string(c.write_back);
  if (c.weight_decay > 0) n += "_wd";
  if (c.sparsity > 0) n += "_sparse";
  if (c.one_sided) n += "_onesided";
  return n;
}

zof::ZOStepOptions options(const Case& c) {
  zof::ZOStepOptions o;
  o.optimizer = c.optimizer;
  o.master = c.master;
  o.round_every = c.round_every;
  o.queries = c.queries;
  o.write_back_every = c.write_back;
  o.weight_decay = c.weight_decay;
  o.sparsity = c.sparsity;
  o.one_sided = c.one_sided;
  return o;
}

struct Outcome {
  std::vector<double> losses;
  std::vector<float> weights, m, v;
  zof::DiskTierStats stats;
  int on_disk = 0, ring = 0;
  uint64_t ring_bytes = 0;
  int64_t uploads = 0;  // the device's, when streaming
  uint64_t least = 0, all = 0;
  bool evicted_between_walks = true;  // every disk block's whole pages out after each walk
  bool evicted_after_reads = true;    // and after the reads through the tier at the end
  std::string fingerprint;            // Model::fingerprint through the tier
  std::string io;                     // the tier's describe()
};

// The whole pages inside [p, p + n) that are resident (mincore).
size_t resident_pages(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t lo = (a + 4095) / 4096 * 4096, hi = (a + n) / 4096 * 4096;
  if (hi <= lo) return 0;
  std::vector<unsigned char> v((hi - lo) / 4096);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(lo), hi - lo, v.data()), 0);
  size_t r = 0;
  for (unsigned char c : v) r += c & 1;
  return r;
}

// 4 steps; host_mem 0: no disk tier (the plain run); gpu_mem 0: the host backend.
Outcome run(const Case& c, uint64_t host_mem, size_t gpu_mem, const fs::path& dir) {
  zof::Model m = zof::Model::load(model_dir(c.model), c.held);
  const auto mb = micro_batches();
  std::unique_ptr<zof::Backend> be;
  if (gpu_mem > 0) {
    zof::SimDeviceOptions so;
    so.budget = gpu_mem;
    be = zof::make_sim_device(zof::test::cpu_backend(0), so);
  } else {
    be = zof::test::cpu_backend(0);
  }
  Outcome r;
  zof::ZOEngine eng(m, *be, max_rows(mb), options(c));
  r.least = eng.disk_tier_minimum();
  r.all = zof::DiskTier::all_bytes(m, 1 + eng.state_planes());
  if (gpu_mem > 0) eng.enable_streaming(gpu_mem);
  if (host_mem > 0) eng.enable_disk_tier(host_mem, dir.string());
  const zof::DiskTier* t = eng.disk_tier();
  if (t) {
    r.on_disk = (int)std::count(t->plan().on_disk.begin(), t->plan().on_disk.end(), true);
    r.ring = t->plan().ring;
    r.ring_bytes = t->plan().ring_bytes;
    r.io = t->describe();
  }
  for (int step = 0; step < 4; ++step) {
    const auto ql = eng.perturbed_losses((uint32_t)step, mb);
    for (size_t j = 0; j < ql.sum_plus.size(); ++j) {
      r.losses.push_back(ql.sum_plus[j]);
      r.losses.push_back(ql.sum_minus[j]);
    }
    eng.schedule_update((uint32_t)step, 1e-3f, eng.projected_gradients(ql));
    if (t) {
      // Between walks the disk blocks' pages are given back, but for the ring's read-ahead of
      // the next walk (at most ring blocks).
      uint64_t present = 0;
      for (int b = 0; b < (int)m.blocks().size(); ++b) {
        if (!t->on_disk(b)) continue;
        if (t->in_ring(b)) {
          present += zof::DiskTier::block_bytes(m, b, 1 + eng.state_planes());
          continue;
        }
        const zof::Block& blk = m.blocks()[b];
        const size_t eb = zof::dtype_size(m.storage_dtype());
        if (resident_pages(static_cast<char*>(m.storage_ptr()) + blk.offset * eb,
                           blk.span * eb) != 0)
          r.evicted_between_walks = false;
      }
      EXPECT_LE(present, t->plan().ring_bytes);
    }
  }
  if (t) r.stats = t->stats();  // the steps' traffic, before the flush
  if (eng.streamer()) r.uploads = eng.streamer()->stats().uploads;
  r.losses.push_back(eng.loss(mb));
  // Read through the tier, block by block, as a run's checkpoints and save read them: the
  // fingerprint of the weights and the optimizer state, with the disk blocks' pages given back.
  r.fingerprint = m.fingerprint(eng.host_blocks());
  eng.read_state(r.m, r.v);
  if (t) {
    for (int b = 0; b < (int)m.blocks().size(); ++b) {
      if (!t->on_disk(b) || t->in_ring(b)) continue;
      const zof::Block& blk = m.blocks()[b];
      const size_t eb = zof::dtype_size(m.storage_dtype());
      if (resident_pages(static_cast<char*>(m.storage_ptr()) + blk.offset * eb, blk.span * eb) != 0)
        r.evicted_after_reads = false;
    }
  }
  eng.disable_disk_tier();  // every block back in RAM: the whole storage compared bit for bit
  r.weights = zof::test::storage_values(m);
  return r;
}

// A --gpu-mem that holds every block of a golden model.
constexpr size_t kRoomyGpu = size_t(1) << 30;

// The least --gpu-mem of the case (every block streamed through two slots).
size_t least_gpu(const Case& c) {
  zof::Model m = zof::Model::load(model_dir(c.model), c.held);
  const auto mb = micro_batches();
  zof::SimDeviceOptions so;
  so.budget = size_t(1) << 30;
  auto sim = zof::make_sim_device(zof::test::cpu_backend(0), so);
  zof::ZOEngine eng(m, *sim, max_rows(mb), options(c));
  return eng.streaming_minimum();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// What a disk-tier run d of case c at a --gpu-mem of gpu (0: the host backend) must show against
// the plain run: the same bits, a disk block's pages given back between walks, and the traffic
// bounds.
void expect_like_plain(const Case& c, const Outcome& plain, const Outcome& d, size_t gpu,
                       const fs::path& dir) {
  EXPECT_GT(d.on_disk, 0);
  EXPECT_GE(d.ring, 2);
  EXPECT_EQ(d.losses, plain.losses);
  EXPECT_TRUE(same_bits(d.weights, plain.weights));
  EXPECT_EQ(d.fingerprint, plain.fingerprint);
  EXPECT_TRUE(d.evicted_after_reads);
  EXPECT_TRUE(same_bits(d.m, plain.m));
  EXPECT_TRUE(same_bits(d.v, plain.v));
  EXPECT_TRUE(d.evicted_between_walks);
  // The ring's bytes bound the disk blocks present at every moment of the walks.
  EXPECT_LE(d.stats.ring_peak, d.ring_bytes);
  // Traffic: 4 walks over 2 micro-batches, each reading a disk block once per micro-batch
  // (the ring is smaller than the disk blocks at the least budget, so the second
  // micro-batch reads again), written once per walk that applies an update (3 of the 4:
  // the first has none; inside a rounding window a walk writes nothing).
  // Through a device, a block is read when the device uploads it.
  EXPECT_LE(d.stats.reads, gpu ? d.uploads + d.ring : 4 * 2 * d.on_disk + d.on_disk);
  EXPECT_GT(d.stats.reads, 0);
  const int applying = c.round_every > 1 ? 1 : 3;  // a window of 3: step 3's walk rounds it
  if (c.write_back > 1) {  // a window of N: written by the walks that close one (3 / N of 1-3)
    EXPECT_LE(d.stats.writes, 3 / c.write_back * d.on_disk);
  }
  EXPECT_LE(d.stats.writes, applying * d.on_disk);
  // (Blocks resident on a roomy device are written back at the flush, after these stats.)
  // (And a write-back window that no walk closes writes at the flush too.)
  if (c.round_every == 1 && gpu != kRoomyGpu && c.write_back <= 3) {
    EXPECT_GT(d.stats.writes, 0);
  }
  if (c.write_back > 3) {
    EXPECT_EQ(d.stats.writes, 0);
  }
  // Files gone with the engine.
  EXPECT_TRUE(fs::is_empty(dir));
}

class DiskTierSteps : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zof_disk_tier_" + std::to_string(::getpid()) + "_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_P(DiskTierSteps, MatchThePlainRunBitForBit) {
  const Case& c = GetParam();
  ZOF_REQUIRE_PATH(model_dir(c.model));
  const Outcome plain = run(c, 0, 0, dir_);
  ASSERT_GT(plain.least, 0u);
  ASSERT_LT(plain.least, plain.all);
  const uint64_t half = std::max(plain.least, plain.all / 2);
  struct Budget {
    const char* name;
    uint64_t host;
    size_t gpu;
  };
  for (const Budget& b : {Budget{"least", plain.least, 0}, Budget{"half", half, 0},
                          Budget{"least_sim", plain.least, kRoomyGpu},
                          Budget{"least_both", plain.least, least_gpu(c)}}) {
    SCOPED_TRACE(b.name);
    if (c.write_back > 1 && b.gpu) continue;  // the host backend's (refused with a device)
    expect_like_plain(c, plain, run(c, b.host, b.gpu, dir_), b.gpu, dir_);
  }
}

// The disk takes its time: the same steps with the store's writes, or its reads, made late on
// purpose (a pause before each transfer, of a length that varies from one to the next), so that
// the walk meets blocks still being written or read back, at every budget, whatever the
// machine's load. Same bits, same bounds on the traffic and on the ring's bytes.
class DiskTierTiming : public DiskTierSteps {};

TEST_P(DiskTierTiming, BitsAndTrafficHoldWhenTheDiskIsLate) {
  const Case& c = GetParam();
  ZOF_REQUIRE_PATH(model_dir(c.model));
  const Outcome plain = run(c, 0, 0, dir_);
  struct HookGuard {  // the hook goes with the loop's pass, however it ends
    ~HookGuard() { zof::set_io_fault_hook({}); }
  };
  for (const char late : {'w', 'r'}) {
    SCOPED_TRACE(std::string("late ") + late);
    auto calls = std::make_shared<std::atomic<int>>(0);
    HookGuard guard;
    zof::set_io_fault_hook([late, calls](char op, size_t, uint64_t) -> long {
      if (op == late)  // 0.25 to 3 ms, a different pause each time
        std::this_thread::sleep_for(std::chrono::microseconds(250 + 250 * ((*calls)++ * 7 % 12)));
      return -1;
    });
    for (const size_t gpu : {size_t(0), least_gpu(c)}) {
      SCOPED_TRACE(gpu ? "least_both" : "least");
      expect_like_plain(c, plain, run(c, plain.least, gpu, dir_), gpu, dir_);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GoldenModels, DiskTierTiming,
                         ::testing::Values(Case{"phi3", Opt::SGD, zof::DType::BF16},
                                           Case{"stories260K", Opt::Adam},
                                           Case{"llama_gqa", Opt::Momentum}),
                         case_name);

INSTANTIATE_TEST_SUITE_P(
    GoldenModels, DiskTierSteps,
    ::testing::Values(Case{"stories260K"}, Case{"stories260K", Opt::Adam},
                      Case{"stories260K", Opt::Momentum, zof::DType::BF16},
                      Case{"stories260K", Opt::SGD, zof::DType::BF16, zof::DType::BF16, 3},
                      Case{"llama_gqa", Opt::Adam, zof::DType::BF16, zof::DType::BF16},
                      Case{"gpt2", Opt::SGD, zof::DType::F32, zof::DType::F32, 1, 2},
                      Case{"opt", Opt::Momentum}, Case{"qwen2_bias", Opt::Adam},
                      Case{"phi3", Opt::SGD, zof::DType::BF16}, Case{"gemma2"},
                      // The write-back window: fp32 and bf16 masters (stochastic rounding each
                      // step of the window), weight decay, Sparse MeZO's mask, one-sided, two
                      // queries, a window the 4 steps never close (the flush does).
                      Case{"stories260K", Opt::SGD, zof::DType::F32, zof::DType::F32, 1, 1, 2},
                      Case{"llama_gqa", Opt::SGD, zof::DType::BF16, zof::DType::BF16, 1, 1, 3},
                      Case{"gpt2", Opt::SGD, zof::DType::F32, zof::DType::F32, 1, 2, 4, 0.1f},
                      Case{"opt", Opt::SGD, zof::DType::BF16, zof::DType::F32, 1, 1, 2, 0.05f,
                           0.5f, true},
                      Case{"qwen2_bias", Opt::SGD, zof::DType::F32, zof::DType::F32, 1, 2, 3,
                           0.f, 0.25f}),
    case_name);

// The same steps on each I/O engine (ZOF_IO, read when the tier starts), at the least budget
// and at half the model: the plain run's bits, and the tier says which engine ran them.
std::vector<Case> engine_cases() {
  return {Case{"stories260K", Opt::Adam},
          Case{"stories260K", Opt::Momentum, zof::DType::BF16, zof::DType::BF16}};
}

class DiskTierEngine : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "uring") {
      const std::string why = zof::io_uring_unavailable();
      if (!why.empty()) GTEST_SKIP() << "the kernel refused io_uring (" << why
                                     << "): the disk tier runs on the pread/pwrite pool here";
    }
    dir_ = fs::temp_directory_path() / ("zof_disk_tier_io_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

TEST_P(DiskTierEngine, MatchesThePlainRunBitForBit) {
  zof::test::ScopedEnv env("ZOF_IO", GetParam().c_str());
  const std::string said = GetParam() == "uring" ? "I/O: io_uring, queue depth "
                                                 : "I/O: pread/pwrite on 2 threads (ZOF_IO=pool)";
  for (const Case& c : engine_cases()) {
    SCOPED_TRACE(c.model + (c.master == zof::DType::BF16 ? " bf16" : " fp32"));
    ZOF_REQUIRE_PATH(model_dir(c.model));
    const Outcome plain = run(c, 0, 0, dir_);
    for (uint64_t budget : {plain.least, std::max(plain.least, plain.all / 2)}) {
      const Outcome d = run(c, budget, 0, dir_);
      EXPECT_GT(d.on_disk, 0);
      EXPECT_NE(d.io.find(said), std::string::npos) << d.io;
      EXPECT_GT(d.stats.reads, 0);
      EXPECT_GT(d.stats.writes, 0);
      EXPECT_EQ(d.losses, plain.losses);
      EXPECT_TRUE(same_bits(d.weights, plain.weights));
      EXPECT_EQ(d.fingerprint, plain.fingerprint);
      EXPECT_TRUE(d.evicted_after_reads);
      EXPECT_TRUE(same_bits(d.m, plain.m));
      EXPECT_TRUE(same_bits(d.v, plain.v));
      EXPECT_TRUE(fs::is_empty(dir_));
    }
  }
}

std::vector<std::string> built_engines() {
  std::vector<std::string> e{"pool"};
  if (zof::io_uring_built()) e.push_back("uring");
  return e;
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskTierEngine, ::testing::ValuesIn(built_engines()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// A model laid out in zeros takes no memory until written (its storage is the system's untouched
// pages): what lets a model larger than RAM be drawn block by block into the disk tier
// (bench/disk_bench.cpp --scale). Written pages are resident; pages given back are not.
TEST(DiskTier, ALaidOutModelIsNotResidentUntilWritten) {
  ZOF_REQUIRE_PATH(model_dir("stories260K"));
  zof::ModelConfig big = zof::ModelConfig::load(model_dir("stories260K") + "/config.json");
  big.vocab_size = 1 << 20;  // a 2^20-row token table: megabytes of pages to count
  for (const zof::DType t : {zof::DType::F32, zof::DType::BF16}) {
    const zof::Model m = zof::Model::zeros(big, true, t);
    const size_t bytes = (size_t)m.storage_size() * zof::dtype_size(t);
    ASSERT_GT(bytes, size_t(64) << 20);
    EXPECT_EQ(resident_pages(m.storage_ptr(), bytes), 0u) << zof::dtype_name(t);
    std::memset(static_cast<char*>(m.storage_ptr()) + 8192, 1, 3 * 4096);
    EXPECT_GE(resident_pages(m.storage_ptr(), bytes), 3u);
    EXPECT_LE(resident_pages(m.storage_ptr(), bytes), 5u);
    // And the rest reads as zeros.
    const char* c = static_cast<const char*>(m.storage_ptr());
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i += 4096) nonzero += c[i] != 0;
    EXPECT_EQ(nonzero, 3u);
  }
}

// The plan's ring: three blocks in flight (the one computed, the next read ahead, the last
// written behind) where the budget holds them besides the kept blocks, else two slots of the
// largest; the blocks resident are what fits in the rest, first fit in block order. Tied (the
// token table kept resident: three layers in a row) and untied (the LM head, the token table
// and the first layer in a row across the walk's wrap: more than two of the largest).
TEST(DiskTier, ThePlanKeepsThreeBlocksInFlightWhereTheBudgetHoldsThem) {
  ZOF_REQUIRE_PATH(model_dir("stories260K"));
  zof::ModelConfig cfg = zof::ModelConfig::load(model_dir("stories260K") + "/config.json");
  cfg.vocab_size = 2048;  // the token table and head larger than a layer
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    cfg.tie_embeddings = tied;
    const zof::Model m = zof::Model::zeros(cfg, true, zof::DType::F32);
    for (const int planes : {1, 3}) {
      const std::vector<int> keep = zof::DiskTier::kept_blocks(m);
      EXPECT_EQ(keep.empty(), !tied);
      std::vector<uint64_t> walk;
      uint64_t kept = 0, largest = 0;
      for (int b = 0; b < (int)m.blocks().size(); ++b) {
        const uint64_t bytes = zof::DiskTier::block_bytes(m, b, planes);
        if (std::find(keep.begin(), keep.end(), b) != keep.end()) {
          kept += bytes;
          continue;
        }
        walk.push_back(bytes);
        largest = std::max(largest, bytes);
      }
      uint64_t three = 0;
      for (size_t i = 0; i < walk.size(); ++i)
        three = std::max(three, walk[i] + walk[(i + 1) % walk.size()] + walk[(i + 2) % walk.size()]);
      ASSERT_GT(three, 2 * largest);
      const uint64_t flight = zof::DiskTier::flight_bytes(m, planes, keep);
      EXPECT_EQ(flight, three);
      const uint64_t least = zof::DiskTier::min_bytes(m, planes, keep);
      EXPECT_EQ(least, kept + 2 * largest);
      // What stays resident besides the kept blocks at a budget leaving `room` beyond the ring.
      auto first_fit = [&](uint64_t room) {
        uint64_t r = 0;
        for (uint64_t bytes : walk)
          if (bytes <= room) {
            room -= bytes;
            r += bytes;
          }
        return r;
      };
      const uint64_t all = zof::DiskTier::all_bytes(m, planes);
      for (const uint64_t extra : {uint64_t(0), walk[0] / 2, walk[0], walk[1] + walk[1] / 3 + 7}) {
        SCOPED_TRACE("extra " + std::to_string(extra));
        ASSERT_LT(kept + flight + extra, all);  // some blocks on disk
        const zof::DiskTierPlan deep =
            zof::DiskTier::plan(m, planes, kept + flight + extra, keep, /*writes_back=*/true);
        EXPECT_EQ(deep.resident_bytes, kept + first_fit(extra));
        EXPECT_GE(deep.ring_bytes, flight);
        EXPECT_GE(deep.ring, 2);
        // A walk that only reads (evaluation, generation) keeps the two slots at any budget.
        const zof::DiskTierPlan reads =
            zof::DiskTier::plan(m, planes, kept + flight + extra, keep, /*writes_back=*/false);
        EXPECT_EQ(reads.resident_bytes, kept + first_fit(flight - 2 * largest + extra));
        if (least + extra < kept + flight) {  // only two slots fit: the old ring
          const zof::DiskTierPlan two =
              zof::DiskTier::plan(m, planes, least + extra, keep, /*writes_back=*/true);
          EXPECT_EQ(two.resident_bytes, kept + first_fit(extra));
          EXPECT_GE(two.ring_bytes, 2 * largest);
        }
      }
      // Two blocks that can be on disk (the rest kept): no three in a row, two slots of the
      // larger.
      std::vector<int> all_but_two;
      for (int b = 2; b < (int)m.blocks().size(); ++b) all_but_two.push_back(b);
      const uint64_t b0 = zof::DiskTier::block_bytes(m, 0, planes),
                     b1 = zof::DiskTier::block_bytes(m, 1, planes);
      EXPECT_EQ(zof::DiskTier::flight_bytes(m, planes, all_but_two), 2 * std::max(b0, b1));
    }
  }
}

// The optimizer state's planes come from Backend::alloc_zeroed (and alloc_host_pinned_zeroed
// when they stream): on the host, zeros that take no memory until written, also where the
// allocator hands out memory it used before, so that a disk tier's momentum and Adam state is
// never whole in RAM. The simulated device's memory clears by copies (Backend's default).
TEST(DiskTier, ZeroedHostMemoryTakesNoPagesUntilWritten) {
  const size_t bytes = (size_t(16) << 20) + 100;
  auto be = zof::test::cpu_backend(0);
  zof::SimDeviceOptions so;
  so.budget = size_t(256) << 20;
  auto sim = zof::make_sim_device(zof::test::cpu_backend(0), so);
#if !defined(__SANITIZE_ADDRESS__)
  // Large blocks from the heap, not fresh mappings: freed memory may be handed out again,
  // dirty (ASan's allocator keeps freed memory apart instead).
  ASSERT_EQ(::mallopt(M_MMAP_THRESHOLD, 32 << 20), 1);  // glibc's largest
  ASSERT_EQ(::mallopt(M_TRIM_THRESHOLD, 512 << 20), 1);  // and kept, not trimmed
#endif
  for (int k = 0; k < 3; ++k) {
    zof::Backend& b = k == 2 ? *sim : *be;
    // Memory the allocator may hand out again, dirty.
    char* dirty = static_cast<char*>(k == 1 ? b.alloc_host_pinned(bytes) : b.alloc(bytes));
    std::memset(dirty, 0xab, bytes);
    if (k == 1)
      b.free_host_pinned(dirty);
    else
      b.free(dirty);
    char* p = static_cast<char*>(k == 1 ? b.alloc_host_pinned_zeroed(bytes) : b.alloc_zeroed(bytes));
    // (Whether the allocator hands the dirty block out again depends on what else it holds:
    // the zeros below are checked either way.)
    if (k < 2) {
      EXPECT_LE(resident_pages(p, bytes), 2u) << k;  // the two partial pages at most
    }
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; ++i) nonzero += p[i] != 0;
    EXPECT_EQ(nonzero, 0u) << k;
    p[bytes - 1] = 1;  // writable to its last byte
    if (k == 1)
      b.free_host_pinned(p);
    else
      b.free(p);
  }
}

// A read or a write that fails in the middle of a walk (the disk gone bad under the run): the
// step throws one zof::Error naming the store, and the engine then goes without a crash or a
// hang (its transfers waited for before their buffers are freed), its store removed.
TEST(DiskTier, AFailedTransferMidWalkIsOneErrorAndTheEngineGoesCleanly) {
  ZOF_REQUIRE_PATH(model_dir("stories260K"));
  const fs::path dir = fs::temp_directory_path() / ("zof_disk_fail_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char op : {'r', 'w'}) {
    SCOPED_TRACE(std::string(1, op));
    zof::Model m = zof::Model::load(model_dir("stories260K"));
    const auto mb = micro_batches();
    auto be = zof::test::cpu_backend(0);
    zof::ZOStepOptions o;
    o.optimizer = Opt::Adam;  // state planes in flight too
    std::string error;
    {
      zof::ZOEngine eng(m, *be, max_rows(mb), o);
      eng.enable_disk_tier(eng.disk_tier_minimum(), dir.string());
      ASSERT_NE(eng.disk_tier(), nullptr);
      int seen = 0;  // the third transfer of its kind fails, and every one after it
      zof::set_io_fault_hook([&seen, op](char k, size_t, uint64_t) -> long {
        return k == op && ++seen >= 3 ? -EIO : -1;
      });
      try {
        for (uint32_t step = 0; step < 4; ++step) {
          const auto ql = eng.perturbed_losses(step, mb);
          eng.schedule_update(step, 1e-3f, eng.projected_gradients(ql));
        }
        eng.flush();
      } catch (const zof::Error& e) {
        error = e.what();
      }
      zof::set_io_fault_hook({});
    }  // the engine goes here, after the failure
    EXPECT_NE(error.find("zof-blocks-"), std::string::npos) << error;
    EXPECT_NE(error.find(std::strerror(EIO)), std::string::npos) << error;
    EXPECT_TRUE(fs::is_empty(dir));
  }
  fs::remove_all(dir);
}

TEST(DiskTier, TheLeastBudgetIsRefusedOneByteBelowNamingTheFlag) {
  zof::Model m = zof::Model::load(model_dir("stories260K"));
  auto be = zof::test::cpu_backend(0);
  zof::ZOEngine eng(m, *be, 64, zof::ZOStepOptions{});
  const uint64_t least = eng.disk_tier_minimum();
  try {
    eng.enable_disk_tier(least - 1, fs::temp_directory_path().string());
    FAIL() << "a budget below the least was taken";
  } catch (const zof::Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("--host-mem"), std::string::npos) << w;
    EXPECT_NE(w.find("least of " + std::to_string(least) + " bytes"), std::string::npos) << w;
  }
  EXPECT_EQ(eng.disk_tier(), nullptr);
  // At or above every block's bytes: no tier at all.
  eng.enable_disk_tier(zof::DiskTier::all_bytes(m), fs::temp_directory_path().string());
  EXPECT_EQ(eng.disk_tier(), nullptr);
}

// ---- the CLI -------------------------------------------------------------------------------

class DiskTierCli : public zof::test::ShakespeareRunTest {
 protected:
  zof::test::CommandResult finetune(const std::string& out, const std::string& extra,
                                    const std::string& env = "") {
    return zof::test::run_command(
        env + zof::test::zof_binary() + " finetune --model " + model_dir("stories260K") +
        " --task text --data " + (dir_ / "text.txt").string() + " --out " + (dir_ / out).string() +
        " --steps 4 --batch 4 --micro-batches 2 --seq-len 32 --lr 1e-4 --eps 1e-3 "
        "--seed 7 --save-every 2 --eval-examples 8 --eval-every 3 --threads 2 --no-report "
        "--json " + extra);
  }
  static json last_json(const std::string& out) { return zof::test::last_json(out); }
  // checkpoint-4 of `run` keeps its disk blocks in the store (Adam's state with them): its
  // optimizer.safetensors holds a tensor per plane for each block store.json leaves out, and
  // nothing else, each `plain`'s state of that block (the whole planes of its checkpoint).
  void expect_resident_state(const std::string& run, const std::string& plain) {
    const fs::path ck = dir_ / run / "checkpoint-4";
    const json sj = json::parse(zof::test::read_file((ck / "store.json").string()));
    const zof::Model layout = zof::Model::load_layout(model_dir("stories260K"));
    std::vector<bool> stored(layout.blocks().size(), false);
    for (const auto& e : sj["blocks"]) stored[e[0].get<int>()] = true;
    auto st = zof::safetensors::Archive::open_file((ck / "optimizer.safetensors").string());
    auto whole = zof::safetensors::Archive::open_file(
        (dir_ / plain / "checkpoint-4" / "optimizer.safetensors").string());
    const int64_t n = layout.storage_size();
    size_t expected = 0;
    for (const char* plane : {"m", "v"}) {
      std::vector<float> w((size_t)n);
      zof::safetensors::to_f32(whole.require(plane, {n}), w.data());
      for (int b = 0; b < (int)stored.size(); ++b) {
        if (stored[b]) continue;
        const zof::Block& blk = layout.blocks()[b];
        std::vector<float> got((size_t)blk.span);
        zof::safetensors::to_f32(st.require(plane + ("." + std::to_string(b)), {blk.span}),
                                 got.data());
        EXPECT_EQ(0, std::memcmp(got.data(), w.data() + blk.offset, got.size() * sizeof(float)))
            << run << " " << plane << "." << b;
        ++expected;
      }
    }
    EXPECT_GT(sj["blocks"].size(), 0u);
    EXPECT_EQ(st.names().size(), expected);
  }
  void expect_same_run(const std::string& run, const std::string& plain) {
    for (const char* f : {"model.safetensors", "zo_log.jsonl"})
      EXPECT_EQ(zof::test::read_file((dir_ / run / f).string()),
                zof::test::read_file((dir_ / plain / f).string()))
          << run << " " << f;
  }
};

// SGD, momentum and Adam, fp32 and bf16 master, host and --sim-device: at the least budget, at
// half the model and with a budget that holds it all (no tier: the plain run's path, which
// test MatchThePlainRunBitForBit and the golden tests cover), the same model.safetensors and
// step log.
TEST_F(DiskTierCli, EveryBudgetWritesTheSameModel) {
  // (The engine test above runs every optimizer with either master, on the host and the
  // device; here the CLI's two ends of it.)
  for (const auto& [opt, master] : std::vector<std::pair<std::string, std::string>>{
           {"sgd", "fp32"}, {"adam", "bf16"}}) {
    {
      const std::string base = "--optimizer " + opt + " --master " + master + " ";
      const std::string plain = "roomy_" + opt + master;
      auto roomy = finetune(plain, base + "--host-mem 1TiB");
      ASSERT_EQ(roomy.code, 0) << roomy.err;
      const json jr = last_json(roomy.out)["disk_tier"];
      EXPECT_EQ(jr["blocks_on_disk"], 0) << jr.dump();
      EXPECT_NE(roomy.err.find("holds every block in host memory"), std::string::npos)
          << roomy.err;
      const uint64_t least = jr["least_bytes"], all = jr["all_bytes"];
      ASSERT_LT(least, all);
      const uint64_t half = std::max(least, all / 2);
      for (const std::string device : {"", "--sim-device "})
        for (uint64_t budget : {least, half}) {
          if (!device.empty() && budget == half) continue;  // the engine test covers it
          const std::string run = "disk_" + opt + master + std::to_string(budget) +
                                  (device.empty() ? "" : "_sim");
          auto d = finetune(run, base + device + "--host-mem " + std::to_string(budget));
          ASSERT_EQ(d.code, 0) << d.err;
          const json jd = last_json(d.out)["disk_tier"];
          EXPECT_GT(jd["blocks_on_disk"].get<int>(), 0) << jd.dump();
          EXPECT_GT(jd["bytes_read"].get<uint64_t>(), 0u) << jd.dump();
          EXPECT_NE(d.err.find("disk tier: "), std::string::npos) << d.err;
          // The engine the start chose, and why the pool where io_uring was refused.
          const std::string why = zof::io_uring_unavailable();
          EXPECT_NE(d.err.find(why.empty() ? "; I/O: io_uring, queue depth "
                                           : "; I/O: pread/pwrite on 2 threads (io_uring "
                                             "refused: " + why + ")"),
                    std::string::npos)
              << d.err;
          expect_same_run(run, plain);
          // The checkpoints named the store's slots (no disk block copied); the finished run
          // keeps the final checkpoint's blocks there, one slot each.
          EXPECT_TRUE(fs::exists(dir_ / run / "checkpoint-4" / "store.json")) << run;
          EXPECT_FALSE(fs::exists(dir_ / run / "checkpoint-4" / "model.safetensors")) << run;
          EXPECT_TRUE(fs::exists(dir_ / run / "offload" / "zof-store.bin")) << run;
        }
      // ZOF_IO=pool forces the pread/pwrite threads, says so, and writes the same model.
      if (opt == "sgd") {
        const std::string run = "disk_pool_" + opt + master;
        auto d = finetune(run, base + "--host-mem " + std::to_string(least), "ZOF_IO=pool ");
        ASSERT_EQ(d.code, 0) << d.err;
        EXPECT_NE(d.err.find("; I/O: pread/pwrite on 2 threads (ZOF_IO=pool)"), std::string::npos)
            << d.err;
        expect_same_run(run, plain);
        // A value that names no engine: refused before the run directory exists.
        auto bad = finetune("bad_io", base + "--host-mem " + std::to_string(least), "ZOF_IO=aio ");
        EXPECT_EQ(bad.code, 1);
        EXPECT_NE(bad.err.find("zof: error: ZOF_IO=aio is not an I/O engine: use auto"),
                  std::string::npos)
            << bad.err;
        EXPECT_FALSE(fs::exists(dir_ / "bad_io"));
      }
    }
  }
}

// The write-back window through the CLI, across the run's checkpoints and evaluations (which
// close it early): at the least budget, N = 3 writes fewer bytes than N = 1 and both give the
// plain run's model and step log.
TEST_F(DiskTierCli, AWriteBackWindowWritesLessAndTheSameModel) {
  auto roomy = finetune("wb_roomy", "--host-mem 1TiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const uint64_t least = last_json(roomy.out)["disk_tier"]["least_bytes"];
  const std::string budget = "--host-mem " + std::to_string(least) + " ";
  auto every = finetune("wb_1", budget);
  ASSERT_EQ(every.code, 0) << every.err;
  auto windowed = finetune("wb_3", budget + "--write-back-every 3");
  ASSERT_EQ(windowed.code, 0) << windowed.err;
  expect_same_run("wb_1", "wb_roomy");
  expect_same_run("wb_3", "wb_roomy");
  const json j1 = last_json(every.out)["disk_tier"], j3 = last_json(windowed.out)["disk_tier"];
  EXPECT_GT(j3["blocks_on_disk"].get<int>(), 0) << j3.dump();
  EXPECT_LT(j3["bytes_written"].get<uint64_t>(), j1["bytes_written"].get<uint64_t>())
      << j1.dump() << " " << j3.dump();
}

// A store a killed run left in --offload-dir (its process gone) is removed before the free space
// is counted; one of a live process stays.
TEST_F(DiskTierCli, AStoreOfAProcessGoneIsRemovedAndALiveOnesStays) {
  auto roomy = finetune("stale_roomy", "--host-mem 1TiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const uint64_t least = last_json(roomy.out)["disk_tier"]["least_bytes"];
  const fs::path off = dir_ / "offload_stale";
  fs::create_directories(off);
  const fs::path gone = off / "zof-blocks-999999999.bin", live = off / "zof-blocks-1.bin";
  for (const fs::path& p : {gone, live}) {
    std::ofstream(p) << "old";
  }
  auto d = finetune("stale_run", "--host-mem " + std::to_string(least) + " --offload-dir " +
                                     off.string());
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_FALSE(fs::exists(gone));
  EXPECT_TRUE(fs::exists(live));  // pid 1 lives
  expect_same_run("stale_run", "stale_roomy");
}

// Killed after a checkpoint and resumed, with Adam's state on disk too: the plain run's model,
// step log and optimizer state. A budget below the least is refused before --out exists.
TEST_F(DiskTierCli, AKilledRunResumesExactlyAndTooSmallABudgetIsRefused) {
  const std::string adam = "--optimizer adam --lr 1e-3 ";
  auto plain = finetune("plain", adam);
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto roomy = finetune("roomy", adam + "--host-mem 1TiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const uint64_t least = last_json(roomy.out)["disk_tier"]["least_bytes"];
  const std::string tight = adam + "--host-mem " + std::to_string(least);
  auto killed = finetune("tight", tight, "ZOF_FAULT_KILL_AT_STEP=3 ");
  ASSERT_EQ(killed.code, 128 + SIGKILL) << killed.err;
  auto resumed = zof::test::run_command(zof::test::zof_binary() + " finetune --resume " +
                                        (dir_ / "tight").string() + " --json --host-mem " +
                                        std::to_string(least));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("resuming at step 2"), std::string::npos) << resumed.err;
  EXPECT_GT(last_json(resumed.out)["disk_tier"]["blocks_on_disk"].get<int>(), 0);
  for (const char* f : {"model.safetensors", "zo_log.jsonl"})
    EXPECT_EQ(zof::test::read_file((dir_ / "tight" / f).string()),
              zof::test::read_file((dir_ / "plain" / f).string()))
        << f;
  expect_resident_state("tight", "plain");
  // Resumed at half the model, and with every block in RAM (Adam's state of the disk blocks
  // read back from the store's slots): the same.
  const uint64_t all = last_json(roomy.out)["disk_tier"]["all_bytes"];
  // Checkpointed at half and resumed at the least (the state of blocks resident then goes
  // through the disk now), and both on the simulated device (the state streams from host memory).
  const std::string half = "--host-mem " + std::to_string(std::max(least, all / 2));
  int n = 0;
  for (const auto& [at, again] : std::vector<std::pair<std::string, std::string>>{
           {tight, half},
           {tight, std::string()},
           {adam + half, "--host-mem " + std::to_string(least)},
           {tight + " --sim-device", "--sim-device --host-mem " + std::to_string(least)}}) {
    const std::string run = "tight_again" + std::to_string(n++);
    auto k = finetune(run, at, "ZOF_FAULT_KILL_AT_STEP=3 ");
    ASSERT_EQ(k.code, 128 + SIGKILL) << k.err;
    auto r = zof::test::run_command(zof::test::zof_binary() + " finetune --resume " +
                                    (dir_ / run).string() + " --json " + again);
    ASSERT_EQ(r.code, 0) << again << ": " << r.err;
    EXPECT_NE(r.err.find("resuming at step 2"), std::string::npos) << r.err;
    expect_same_run(run, "plain");
  }
  auto below = finetune("below", adam + "--host-mem " + std::to_string(least - 1));
  EXPECT_EQ(below.code, 1);
  EXPECT_NE(below.err.find("zof: error: --host-mem"), std::string::npos) << below.err;
  EXPECT_NE(below.err.find("least of " + std::to_string(least) + " bytes"), std::string::npos)
      << below.err;
  EXPECT_FALSE(fs::exists(dir_ / "below"));
  // --host-mem is layout: run.json does not hold it.
  EXPECT_EQ(zof::test::read_file((dir_ / "tight" / "run.json").string()).find("host_mem"),
            std::string::npos);
}

// A checkpoint of a run whose blocks are on disk copies none of them: it names their slots in
// the run's store (store.json, with each block's hash) and holds the resident blocks
// (resident.safetensors). Killed after a checkpoint (with writes to the store since) and
// resumed at the same budget, at another, or with none (every block read back into RAM);
// killed inside a checkpoint after its slots were made durable (it resumes from the one
// before): the plain run's model and step log every time. A store changed since its checkpoint
// (bytes flipped, or cut short) is refused on resume, naming the store.
TEST_F(DiskTierCli, CheckpointsNameTheStoreAndEveryKillResumesExactly) {
  auto plain = finetune("ck_plain", "");
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto roomy = finetune("ck_roomy", "--host-mem 1TiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const json jr = last_json(roomy.out)["disk_tier"];
  const uint64_t least = jr["least_bytes"], all = jr["all_bytes"];
  const std::string tight = "--host-mem " + std::to_string(least);
  auto whole = finetune("ck_whole", tight);
  ASSERT_EQ(whole.code, 0) << whole.err;
  expect_same_run("ck_whole", "ck_plain");
  const fs::path ck = dir_ / "ck_whole" / "checkpoint-4";
  EXPECT_FALSE(fs::exists(ck / "model.safetensors"));
  EXPECT_LT(fs::file_size(ck / "resident.safetensors"),
            fs::file_size(dir_ / "ck_plain" / "checkpoint-4" / "model.safetensors"));
  const json sj = json::parse(zof::test::read_file((ck / "store.json").string()));
  EXPECT_EQ(sj["store"], "offload/zof-store.bin") << sj.dump();
  EXPECT_EQ(sj["blocks"].size(), last_json(whole.out)["disk_tier"]["blocks_on_disk"].get<size_t>());
  auto resume = [&](const std::string& run, const std::string& extra) {
    return zof::test::run_command(zof::test::zof_binary() + " finetune --resume " +
                                  (dir_ / run).string() + " --json " + extra);
  };
  const uint64_t half = std::max(least, all / 2);
  int n = 0;
  for (const std::string& again :
       {tight, "--host-mem " + std::to_string(half), std::string()}) {
    const std::string run = "ck_killed" + std::to_string(n++);
    auto killed = finetune(run, tight, "ZOF_FAULT_KILL_AT_STEP=3 ");
    ASSERT_EQ(killed.code, 128 + SIGKILL) << killed.err;
    ASSERT_TRUE(fs::exists(dir_ / run / "checkpoint-2" / "store.json"));
    auto r = resume(run, again);
    ASSERT_EQ(r.code, 0) << again << ": " << r.err;
    EXPECT_NE(r.err.find("resuming at step 2"), std::string::npos) << r.err;
    expect_same_run(run, "ck_plain");
  }
  // Killed inside checkpoint-4, after its blocks were committed to the store and before the
  // checkpoint was complete: checkpoint-2's slots were not written since.
  auto in_ckpt = finetune("ck_in", tight, "ZOF_FAULT_KILL_IN_CHECKPOINT=4 ");
  ASSERT_EQ(in_ckpt.code, 128 + SIGKILL) << in_ckpt.err;
  auto r = resume("ck_in", tight);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("resuming at step 2"), std::string::npos) << r.err;
  expect_same_run("ck_in", "ck_plain");
  // A store another process holds (a copy of the run directory resumed beside it): refused,
  // naming it, with the run as it was; once it is free the run resumes.
  {
    auto killed = finetune("ck_locked", tight, "ZOF_FAULT_KILL_AT_STEP=3 ");
    ASSERT_EQ(killed.code, 128 + SIGKILL) << killed.err;
    const fs::path store = dir_ / "ck_locked" / "offload" / "zof-store.bin";
    const int fd = ::open(store.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);
    auto busy = resume("ck_locked", tight);
    ::close(fd);
    EXPECT_EQ(busy.code, 1) << busy.err;
    EXPECT_NE(busy.err.find("zof: error: the disk tier's store " + store.string() +
                            " is in use by another process"),
              std::string::npos)
        << busy.err;
    auto r2 = resume("ck_locked", tight);
    ASSERT_EQ(r2.code, 0) << r2.err;
    expect_same_run("ck_locked", "ck_plain");
  }
  // And a live run holds its store's lock to the end, not only at its start (the tier reopens
  // the store with O_DIRECT and keeps the first descriptor, which holds the lock): resumed and
  // stopped at the start of its last step, the store cannot be locked by another.
  {
    auto killed = finetune("ck_live", tight, "ZOF_FAULT_KILL_AT_STEP=3 ");
    ASSERT_EQ(killed.code, 128 + SIGKILL) << killed.err;
    const fs::path store = dir_ / "ck_live" / "offload" / "zof-store.bin";
    const fs::path err = dir_ / "ck_live_err.txt";
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::setenv("ZOF_FAULT_HANG_AT_STEP", "3", 1);
      const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) ::dup2(fd, 2);
      const std::string bin = zof::test::zof_binary(), run = (dir_ / "ck_live").string();
      const std::string mem = std::to_string(least);
      ::execl(bin.c_str(), bin.c_str(), "finetune", "--resume", run.c_str(), "--host-mem",
              mem.c_str(), (char*)nullptr);
      ::_exit(127);
    }
    // Step 2 done (its progress line), then the run stops at the start of step 3.
    for (int i = 0; i < 1200 && zof::test::read_file(err.string()).find("step 3/4") ==
                                    std::string::npos;
         ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_NE(zof::test::read_file(err.string()).find("step 3/4"), std::string::npos)
        << zof::test::read_file(err.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int fd = ::open(store.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    EXPECT_NE(::flock(fd, LOCK_EX | LOCK_NB), 0) << "the live run's store was not locked";
    EXPECT_EQ(errno, EWOULDBLOCK);
    ::close(fd);
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
  // A store flipped under the checkpoint (every 4096th byte), or cut short: refused.
  for (const bool cut : {false, true}) {
    const std::string run = cut ? "ck_cut" : "ck_flipped";
    auto killed = finetune(run, tight, "ZOF_FAULT_KILL_AT_STEP=3 ");
    ASSERT_EQ(killed.code, 128 + SIGKILL) << killed.err;
    const fs::path store = dir_ / run / "offload" / "zof-store.bin";
    if (cut) {
      fs::resize_file(store, fs::file_size(store) - 4096);
    } else {
      std::string bytes = zof::test::read_file(store.string());
      for (size_t i = 100; i < bytes.size(); i += 4096) bytes[i] = (char)~bytes[i];
      std::ofstream(store, std::ios::binary) << bytes;
    }
    auto bad = resume(run, tight);
    EXPECT_EQ(bad.code, 1) << bad.err;
    EXPECT_NE(bad.err.find(cut ? "zof: error: the disk tier's store " + store.string() + " is "
                               : std::string("does not match the hash checkpoint-2/store.json "
                                             "records")),
              std::string::npos)
        << bad.err;
    EXPECT_NE(bad.err.find(store.string()), std::string::npos) << bad.err;
  }
}

// Sparse MeZO's thresholds are taken from the base weights once they are loaded into the tier:
// the plain run's model and step log at the least budget. (A GGUF save through the tier:
// tests/model/test_gguf.cpp.)
TEST_F(DiskTierCli, SparsityThresholdsAreTheLoadedWeights) {
  // The plain run (no --host-mem: the weights loaded before the engine takes its thresholds).
  auto plain = finetune("sp_plain", "--sparsity 0.5");
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto roomy = finetune("sp_roomy", "--host-mem 1TiB");  // dense: the least budget, and a
  ASSERT_EQ(roomy.code, 0) << roomy.err;                  // log that sparsity changes
  const uint64_t least = last_json(roomy.out)["disk_tier"]["least_bytes"];
  EXPECT_NE(zof::test::read_file((dir_ / "sp_roomy" / "zo_log.jsonl").string()),
            zof::test::read_file((dir_ / "sp_plain" / "zo_log.jsonl").string()));
  for (const std::string& budget : {std::to_string(least), std::string("1TiB")}) {
    const std::string run = "sp_" + budget;
    auto d = finetune(run, "--sparsity 0.5 --host-mem " + budget);
    ASSERT_EQ(d.code, 0) << d.err;
    expect_same_run(run, "sp_plain");
  }
}

// LOZO's low-rank directions through the tier: at the least budget, and with a write-back window
// whose walks rebuild a block from its terms' keys (each term's own U and V), the plain run's
// model and step log.
TEST_F(DiskTierCli, LowRankDirectionsThroughTheTierAndItsWriteBackWindow) {
  const std::string lozo = "--low-rank 2 --low-rank-every 2";
  auto plain = finetune("lr_plain", lozo);
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto roomy = finetune("lr_roomy", lozo + " --host-mem 1TiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const uint64_t least = last_json(roomy.out)["disk_tier"]["least_bytes"];
  for (const std::string& extra : {std::string(), std::string(" --write-back-every 3")}) {
    const std::string run = "lr_least" + std::to_string(extra.size());
    auto d = finetune(run, lozo + " --host-mem " + std::to_string(least) + extra);
    ASSERT_EQ(d.code, 0) << d.err;
    expect_same_run(run, "lr_plain");
  }
}

// --host-mem's default: the free host memory (ZOF_FAULT_MEM_AVAILABLE stands in for it) less a
// margin of 1 GiB and a tenth of it. Where the model fits, no tier and no word of one; where it
// does not, the tier at that budget, said in the header, and the plain run's model; where even
// the tier's least does not fit, a warning and the run in RAM.
TEST_F(DiskTierCli, TheDefaultBudgetIsTheFreeMemoryWhereTheModelDoesNotFit) {
  auto roomy = finetune("auto_roomy", "--host-mem 1TiB");
  ASSERT_EQ(roomy.code, 0) << roomy.err;
  const uint64_t least = last_json(roomy.out)["disk_tier"]["least_bytes"];
  const uint64_t gib = uint64_t(1) << 30;
  auto with_free = [&](const std::string& run, uint64_t free) {
    return finetune(run, "", "ZOF_FAULT_MEM_AVAILABLE=" + std::to_string(free) + " ");
  };
  // Free memory for a budget of the least, by the margin's rule.
  const uint64_t free = (least + gib) * 10 / 9 + 10;
  auto tight = with_free("auto_tight", free);
  ASSERT_EQ(tight.code, 0) << tight.err;
  EXPECT_NE(tight.err.find("--host-mem by default: the model's host masters"), std::string::npos)
      << tight.err;
  const json jt = last_json(tight.out)["disk_tier"];
  EXPECT_GT(jt["blocks_on_disk"].get<int>(), 0) << jt.dump();
  EXPECT_EQ(jt["host_mem"].get<uint64_t>(), free - gib - free / 10) << jt.dump();
  expect_same_run("auto_tight", "auto_roomy");
  auto plenty = with_free("auto_plenty", uint64_t(1) << 40);
  ASSERT_EQ(plenty.code, 0) << plenty.err;
  EXPECT_EQ(plenty.err.find("disk tier"), std::string::npos) << plenty.err;
  EXPECT_EQ(plenty.err.find("--host-mem by default"), std::string::npos) << plenty.err;
  EXPECT_FALSE(last_json(plenty.out).contains("disk_tier"));
  auto starved = with_free("auto_starved", gib);
  ASSERT_EQ(starved.code, 0) << starved.err;
  EXPECT_NE(starved.err.find("zof: warning: the model's host masters"), std::string::npos)
      << starved.err;
  EXPECT_FALSE(last_json(starved.out).contains("disk_tier"));
  expect_same_run("auto_plenty", "auto_roomy");
  expect_same_run("auto_starved", "auto_roomy");
}

// A model many times --host-mem goes through the whole run, never whole in RAM: loaded into the
// tier block by block (its fingerprint taken as it passes), evaluated, checkpointed and saved
// through it. Against the plain run in the same test: the same model.safetensors and
// checkpoint bytes and the same base fingerprint, and a peak resident set lower by at least
// half of what the tier keeps out of RAM (the model less the budget).
TEST_F(DiskTierCli, AModelManyTimesTheBudgetRunsThroughItWhole) {
  // 24 LLaMA layers of width 512 and stories260K's vocabulary: 82M parameters, 330 MB in fp32,
  // in blocks of 13.6 MB.
  const fs::path mdir = dir_ / "deep";
  fs::create_directories(mdir);
  const json cfg{{"model_type", "llama"},      {"hidden_size", 512},
                 {"intermediate_size", 1536},  {"num_hidden_layers", 24},
                 {"num_attention_heads", 8},   {"num_key_value_heads", 8},
                 {"vocab_size", 512},          {"max_position_embeddings", 256},
                 {"rms_norm_eps", 1e-5},       {"tie_word_embeddings", false},
                 {"hidden_act", "silu"},       {"torch_dtype", "float32"}};
  std::ofstream(mdir / "config.json") << cfg.dump(1);
  uint64_t model_bytes = 0, budget = 0;
  {
    const zof::Model m =
        zof::Model::random(zof::ModelConfig::load((mdir / "config.json").string()), 5);
    m.save(mdir.string(), zof::DType::F32);
    model_bytes = zof::DiskTier::all_bytes(m);
    budget = zof::DiskTier::min_bytes(m, 1, {}) * 3 / 2;  // the ring: three of the largest
  }
  ASSERT_GT(model_bytes, 300u << 20);
  ASSERT_LT(budget, model_bytes / 8);
  fs::copy_file(model_dir("stories260K") + "/tokenizer.json", mdir / "tokenizer.json");
  auto run = [&](const std::string& out, const std::string& extra) {
    return zof::test::run_command(
        zof::test::zof_binary() + " finetune --model " + mdir.string() + " --task text --data " +
        (dir_ / "text.txt").string() + " --out " + (dir_ / out).string() +
        " --steps 2 --batch 1 --seq-len 16 --lr 1e-4 --eps 1e-3 --seed 7 --save-every 1 "
        "--eval-examples 2 --eval-every 1 --dtype fp32 --threads 2 --no-report --json " + extra);
  };
  auto plain = run("plain", "");
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto tier = run("tier", "--host-mem " + std::to_string(budget));
  ASSERT_EQ(tier.code, 0) << tier.err;
  const json jt = last_json(tier.out);
  EXPECT_GE(jt["disk_tier"]["blocks_on_disk"].get<int>(), 20) << jt.dump();
  for (const char* f : {"model.safetensors", "zo_log.jsonl"})
    EXPECT_TRUE(zof::test::read_file((dir_ / "tier" / f).string()) ==
                zof::test::read_file((dir_ / "plain" / f).string()))
        << f;
  // The checkpoint copies no disk block: it holds the resident ones, a fraction of the model.
  EXPECT_FALSE(fs::exists(dir_ / "tier" / "checkpoint-2" / "model.safetensors"));
  EXPECT_LT(fs::file_size(dir_ / "tier" / "checkpoint-2" / "resident.safetensors"),
            fs::file_size(dir_ / "plain" / "checkpoint-2" / "model.safetensors") / 4);
  auto base_fingerprint = [&](const std::string& out) {
    return json::parse(zof::test::read_file((dir_ / out / "run.json").string()))
        .at("base_fingerprint")
        .get<std::string>();
  };
  EXPECT_EQ(base_fingerprint("tier"), base_fingerprint("plain"));
  auto peak = [&](const std::string& out) {
    return json::parse(zof::test::read_file((dir_ / out / "summary.json").string()))
        .at("peak_rss_bytes")
        .get<double>();
  };
  const double p_plain = peak("plain"), p_tier = peak("tier");
  std::printf("peak RSS %.0f MB with --host-mem %.0f MB, %.0f MB without; the model %.0f MB\n",
              p_tier / 1e6, budget / 1e6, p_plain / 1e6, model_bytes / 1e6);
  EXPECT_LT(p_tier + 0.5 * double(model_bytes - budget), p_plain)
      << "peak RSS: " << p_tier / 1e6 << " MB with the tier, " << p_plain / 1e6
      << " MB without, a model of " << model_bytes / 1e6 << " MB, --host-mem " << budget / 1e6
      << " MB";
  // `zof eval` and `zof generate` of that model through the tier (--host-mem, the store in
  // --offload-dir, removed at the end): the perplexity and the tokens of the run in RAM.
  const std::string zof = zof::test::zof_binary(), m = mdir.string();
  const std::string eval = zof + " eval --model " + m + " --text " + (dir_ / "text.txt").string() +
                           " --seq-len 16 --batch 2 --max-windows 6 --dtype fp32 --threads 2 --json";
  const std::string gen = zof + " generate --model " + m +
                          " --max-new-tokens 6 --dtype fp32 --threads 2 --json";
  const fs::path off = dir_ / "eval_offload";
  fs::create_directories(off);
  const std::string tiered = " --host-mem " + std::to_string(budget) + " --offload-dir " + off.string();
  auto e0 = zof::test::run_command(eval), e1 = zof::test::run_command(eval + tiered);
  auto g0 = zof::test::run_command(gen), g1 = zof::test::run_command(gen + tiered);
  ASSERT_EQ(e0.code, 0) << e0.err;
  ASSERT_EQ(e1.code, 0) << e1.err;
  ASSERT_EQ(g0.code, 0) << g0.err;
  ASSERT_EQ(g1.code, 0) << g1.err;
  const json je = last_json(e1.out), jg = last_json(g1.out);
  EXPECT_EQ(je["nll"].get<double>(), last_json(e0.out)["nll"].get<double>());
  EXPECT_EQ(jg["ids"], last_json(g0.out)["ids"]);
  EXPECT_FALSE(last_json(e0.out).contains("disk_tier"));
  for (const json& j : {je, jg}) {
    ASSERT_TRUE(j.contains("disk_tier")) << j.dump();
    // Every pass read the disk blocks: more than the model beyond the budget.
    EXPECT_GT(j["disk_tier"]["bytes_read"].get<double>(), 0.5 * double(model_bytes - budget))
        << j.dump();
    EXPECT_LE(j["disk_tier"]["ring_peak_bytes"].get<double>(), double(budget)) << j.dump();
  }
  EXPECT_TRUE(fs::is_empty(off));  // the store went
  // Below the least budget, and with a device: one line naming the flag.
  auto small = zof::test::run_command(eval + " --host-mem 1MiB");
  EXPECT_EQ(small.code, 1);
  EXPECT_EQ(small.err.rfind("zof: error: --host-mem 1.00 MiB is below this model's least of ", 0), 0u)
      << small.err;
  auto sim = zof::test::run_command(gen + tiered + " --sim-device");
  EXPECT_EQ(sim.code, 1);
  EXPECT_NE(sim.err.find("zof: error: --host-mem (the disk tier) reads the weights on the host"),
            std::string::npos)
      << sim.err;
}

}  // namespace
