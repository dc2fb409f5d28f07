// Tensor parallel in one process: T ranks as threads exchanging through a shared buffer (the
// same tp::Group the MPI ranks use), on the LLaMA-family goldens. The slices' logits are within
// fp32 tolerance of one process (and T = 1 is bit-identical to Forward), reruns are
// bit-identical, the parallel cross-entropy matches the full one, a slice's z and perturbed
// weights are the single process's elements bit for bit, and slicing then placing gives the
// model back byte for byte. The refusals name the flag, the field and the fix.
#include <barrier>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <mutex>
#include <thread>

#include <unistd.h>

#include "common.h"
#include "util/philox.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/tensor_parallel.h"
#include "zof/zo.h"

namespace {

std::string model_dir(const std::string& name) {
  if (name == "stories260K") return zof::test::assets_dir() + "/models/stories260K";
  return zof::test::source_dir() + "/tests/golden/" + name;
}

// T threads, one rank each: all_gather through per-rank slots between two barriers.
struct Threads {
  explicit Threads(int t) : T(t), bar(t), slots((size_t)t) {}
  int T;
  std::barrier<> bar;
  std::vector<std::vector<char>> slots;
};
class ThreadGroup final : public zof::tp::Group {
 public:
  ThreadGroup(Threads& s, int r) : s_(s), r_(r) {}
  int rank() const override { return r_; }
  int size() const override { return s_.T; }
  void all_gather(const void* in, size_t bytes, void* out) override {
    s_.slots[(size_t)r_].assign((const char*)in, (const char*)in + bytes);
    s_.bar.arrive_and_wait();
    for (int t = 0; t < s_.T; ++t) {
      ASSERT_EQ(s_.slots[(size_t)t].size(), bytes);
      std::memcpy((char*)out + (size_t)t * bytes, s_.slots[(size_t)t].data(), bytes);
    }
    s_.bar.arrive_and_wait();
  }

 private:
  Threads& s_;
  int r_;
};

// fn(rank, group) on T threads; the first exception is rethrown here.
void run_ranks(int T, const std::function<void(int, zof::tp::Group&)>& fn) {
  Threads s(T);
  std::exception_ptr err;
  std::mutex mu;
  std::vector<std::thread> th;
  for (int r = 0; r < T; ++r)
    th.emplace_back([&, r] {
      ThreadGroup g(s, r);
      try {
        fn(r, g);
      } catch (...) {
        std::lock_guard<std::mutex> l(mu);
        if (!err) err = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  if (err) std::rethrow_exception(err);
}

zof::Batch batch_of(int64_t vocab) {
  std::vector<std::vector<int32_t>> seqs;
  for (int b = 0; b < 3; ++b) {
    std::vector<int32_t> s;
    for (int t = 0; t < 6 + 4 * b; ++t) s.push_back((int32_t)((3 + 37 * t + 101 * b) % vocab));
    seqs.push_back(s);
  }
  return zof::Batch::from_sequences(seqs);
}

// Each rank's full logits (gathered) and NLL of the batch's next tokens, from T ranks.
struct TpOut {
  std::vector<float> logits, nll, pair_nll;
  uint64_t bytes = 0;
};

// (row, target) pairs over the batch's real positions, every row twice with two targets: more
// pairs than rows (the head in several passes) and rows scored more than once (shared prompts).
struct Pairs {
  std::vector<int32_t> rows, targets;
};
Pairs pairs_of(const zof::Batch& b, int64_t vocab) {
  Pairs p;
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t t = 0; t < b.lengths[(size_t)r]; ++t)
      for (int k = 0; k < 2; ++k) {
        p.rows.push_back((int32_t)b.row(r, t));  // the targets as in the padded layout
        p.targets.push_back((int32_t)((r * b.T + t) * (7 + 6 * k) + 1 + 4 * k) % (int32_t)vocab);
      }
  EXPECT_GT((int64_t)p.rows.size(), b.rows());
  return p;
}
TpOut tp_run(const zof::Model& full, int T, const zof::Batch& b, const zof::ZKey* key = nullptr,
             float scale = 0.f) {
  std::vector<TpOut> outs((size_t)T);
  std::vector<int32_t> targets(b.ids.size(), -1);
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t t = 0; t + 1 < b.lengths[(size_t)r]; ++t)
      targets[(size_t)(r * b.T + t)] = b.ids[(size_t)(r * b.T + t + 1)];
  run_ranks(T, [&](int r, zof::tp::Group& g) {
    const zof::tp::Plan p = zof::tp::plan(full.config(), r, T);
    zof::Model local = zof::tp::slice(full, p);
    if (key) zof::tp::perturb(p, local, *key, scale);
    auto be = zof::test::reference_backend();
    zof::tp::TensorForward f(local, p, *be, g, b.B * b.T);
    TpOut& o = outs[(size_t)r];
    f.logits(b, o.logits);
    o.nll.resize(b.ids.size());
    f.nll(b, targets.data(), o.nll.data());
    o.bytes = f.bytes_exchanged();
    const Pairs pr = pairs_of(b, full.config().vocab_size);
    o.pair_nll.resize(pr.rows.size());
    f.nll_at(b, pr.rows.data(), pr.targets.data(), (int64_t)pr.rows.size(), o.pair_nll.data());
  });
  for (int r = 1; r < T; ++r) {  // every rank holds the same numbers
    EXPECT_EQ(outs[(size_t)r].logits, outs[0].logits) << "rank " << r;
    EXPECT_EQ(outs[(size_t)r].nll, outs[0].nll) << "rank " << r;
    EXPECT_EQ(outs[(size_t)r].pair_nll, outs[0].pair_nll) << "rank " << r;
  }
  return outs[0];
}

struct Single {
  std::vector<float> logits, nll, pair_nll;
};
Single single_run(const zof::Model& m, const zof::Batch& b) {
  auto be = zof::test::reference_backend();
  zof::Forward f(m, *be, b.B * b.T);
  Single s;
  f.logits(b, s.logits);
  f.next_token_nll(b, s.nll);
  const Pairs pr = pairs_of(b, m.config().vocab_size);
  s.pair_nll.resize(pr.rows.size());
  f.nll_at(b, pr.rows.data(), pr.targets.data(), (int64_t)pr.rows.size(), s.pair_nll.data());
  return s;
}

// max |a - b| / (1 + max |b|).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return d / (1 + m);
}

class TensorParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallel, LogitsAndLossWithinFp32OfOneProcessAndRerunsIdentical) {
  const std::string dir = model_dir(GetParam());
  ZOF_REQUIRE_PATH(dir + "/model.safetensors");
  const zof::Model full = zof::Model::load(dir);
  const zof::Batch b = batch_of(full.config().vocab_size);
  const Single one = single_run(full, b);
  for (int T : {1, 2, 4}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const TpOut a = tp_run(full, T, b);
    if (T == 1) {  // one rank: the same ops in the same order as Forward
      EXPECT_EQ(a.logits, one.logits);
      EXPECT_EQ(a.bytes, 0u);
    }
    EXPECT_LT(rel_diff(a.logits, one.logits), 2e-6);
    EXPECT_LT(rel_diff(a.nll, one.nll), 2e-6);
    EXPECT_LT(rel_diff(a.pair_nll, one.pair_nll), 2e-6);
    const TpOut again = tp_run(full, T, b);
    EXPECT_EQ(again.logits, a.logits);  // bit-identical for the grid
    EXPECT_EQ(again.nll, a.nll);
    EXPECT_EQ(again.pair_nll, a.pair_nll);
    if (T > 1) {
      EXPECT_GT(a.bytes, 0u);
    }
  }
}

// The training walk's packed layout on the CPU kernels: a pair scored alone (the head's lone-row
// case) has the bits it has among all the pairs, on 1 and 2 ranks, and the padded batch gives the
// same NLL within fp32.
TEST_P(TensorParallel, PackedBatchAndALonePairOnTheCpuKernels) {
  const std::string dir = model_dir(GetParam());
  ZOF_REQUIRE_PATH(dir + "/model.safetensors");
  const zof::Model full = zof::Model::load(dir);
  const int64_t V = full.config().vocab_size;
  const zof::Batch padded = batch_of(V), packed = padded.pack();
  ASSERT_LT(packed.rows(), padded.rows());
  const Pairs pp = pairs_of(packed, V), pd = pairs_of(padded, V);
  for (int T : {1, 2}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    std::vector<std::vector<float>> all((size_t)T), pad((size_t)T), lone((size_t)T);
    run_ranks(T, [&](int r, zof::tp::Group& g) {
      const zof::tp::Plan p = zof::tp::plan(full.config(), r, T);
      zof::Model local = zof::tp::slice(full, p);
      auto be = zof::test::cpu_backend(1);
      zof::tp::TensorForward f(local, p, *be, g, padded.rows());
      std::vector<float>& a = all[(size_t)r];
      a.resize(pp.rows.size());
      f.nll_at(packed, pp.rows.data(), pp.targets.data(), (int64_t)a.size(), a.data());
      std::vector<float>& d = pad[(size_t)r];
      d.resize(pd.rows.size());
      f.nll_at(padded, pd.rows.data(), pd.targets.data(), (int64_t)d.size(), d.data());
      for (size_t i = 0; i < pp.rows.size(); i += 7) {
        float x = 0;
        f.nll_at(packed, &pp.rows[i], &pp.targets[i], 1, &x);
        lone[(size_t)r].push_back(x);
      }
    });
    for (size_t i = 0, k = 0; i < pp.rows.size(); i += 7, ++k)
      EXPECT_EQ(lone[0][k], all[0][i]) << "pair " << i;
    EXPECT_LT(rel_diff(pad[0], all[0]), 2e-6);
    if (T == 2) {
      EXPECT_EQ(all[1], all[0]);
    }
  }
}

TEST_P(TensorParallel, PerturbedSlicesAreTheSingleProcessPerturbedModel) {
  const std::string dir = model_dir(GetParam());
  ZOF_REQUIRE_PATH(dir + "/model.safetensors");
  const zof::Model full = zof::Model::load(dir);
  const zof::ZKey key{1234, 7, 1, zof::kZGaussian};
  const float eps = 1e-3f;
  // The single process's perturbation, through the backend's ZO pass (the engine's).
  zof::Model plus = zof::Model::load(dir);
  auto be = zof::test::cpu_backend(1);
  for (int pi = 0; pi < (int)plus.params().size(); ++pi) {
    zof::Param& q = plus.params()[(size_t)pi];
    std::vector<float> out((size_t)q.numel);
    be->zo_pass(zof::Theta(q.data), q.numel, (uint32_t)pi, 0, nullptr, 0, 0.f, &key, eps,
                out.data(), nullptr);
    be->synchronize(nullptr);
    std::memcpy(q.data, out.data(), out.size() * sizeof(float));
  }
  for (int T : {2, 4}) {
    for (int r = 0; r < T; ++r) {
      const zof::tp::Plan p = zof::tp::plan(full.config(), r, T);
      zof::Model mine = zof::tp::slice(full, p);
      zof::tp::perturb(p, mine, key, eps);
      const zof::Model want = zof::tp::slice(plus, p);
      ASSERT_EQ(mine.storage_size(), want.storage_size());
      EXPECT_EQ(0, std::memcmp(mine.storage(), want.storage(), mine.storage_size() * sizeof(float)))
          << "T=" << T << " rank " << r;
      // And z itself, element by element, against the global element's z.
      const int pi = 2;  // a split matrix (q_proj of layer 0)
      std::vector<float> z((size_t)mine.params()[pi].numel);
      zof::tp::slice_z(p, mine, key, pi, z.data());
      for (int64_t j = 0; j < (int64_t)z.size(); j += 7)
        ASSERT_EQ(z[(size_t)j], zof::z_element(key, (uint32_t)pi, (uint64_t)p.global_element(pi, j)));
      // A low-rank key's z of a column-parallel (q_proj, Phi-3's qkv_proj) and a row-parallel
      // (o_proj) slice: the whole matrix's, at the width of the full model's tensor.
      int checked = 0;
      for (const std::string name : {"q_proj.weight", "qkv_proj.weight", "o_proj.weight"}) {
        int lp = -1;
        for (int i = 0; i < (int)full.params().size() && lp < 0; ++i)
          if (full.params()[(size_t)i].name == "model.layers.0.self_attn." + name) lp = i;
        if (lp < 0) continue;
        ++checked;
        zof::ZKey lk = key;
        lk.rank = 2;
        lk.rank_every = 3;
        zof::ZKey whole = lk;
        whole.cols = (uint32_t)full.params()[(size_t)lp].shape.back();
        std::vector<float> lz((size_t)mine.params()[(size_t)lp].numel);
        zof::tp::slice_z(p, mine, lk, lp, lz.data());
        for (int64_t j = 0; j < (int64_t)lz.size(); j += 5)
          ASSERT_EQ(lz[(size_t)j],
                    zof::z_element(whole, (uint32_t)lp, (uint64_t)p.global_element(lp, j)))
              << name << " T=" << T << " rank " << r << " element " << j;
      }
      EXPECT_EQ(checked, 2);
    }
  }
  // The perturbed slices gathered are the single process's perturbed model, and saved they are
  // its Hugging Face file byte for byte.
  for (int T : {2, 4}) {
    std::vector<zof::Model> gathered;
    for (int r = 0; r < T; ++r) gathered.push_back(zof::Model::zeros(full.config()));
    run_ranks(T, [&](int r, zof::tp::Group& g) {
      const zof::tp::Plan p = zof::tp::plan(full.config(), r, T);
      zof::Model mine = zof::tp::slice(full, p);
      zof::tp::perturb(p, mine, key, eps);
      zof::tp::gather(p, g, mine, gathered[(size_t)r]);
    });
    for (int r = 0; r < T; ++r)
      EXPECT_EQ(0, std::memcmp(gathered[(size_t)r].storage(), plus.storage(),
                               plus.storage_size() * sizeof(float)))
          << "T=" << T << " rank " << r;
    const auto tmp = std::filesystem::temp_directory_path() /
                     ("zof_tp_save_" + std::to_string(::getpid()) + "_" + GetParam());
    gathered[0].save((tmp / "tp").string(), zof::DType::F32);
    plus.save((tmp / "one").string(), zof::DType::F32);
    auto bytes = [](const std::filesystem::path& f) {
      std::ifstream in(f, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    EXPECT_TRUE(bytes(tmp / "tp" / "model.safetensors") == bytes(tmp / "one" / "model.safetensors"))
        << "T=" << T;
    std::filesystem::remove_all(tmp);
  }
  // The perturbed TP forward is the perturbed single process's, within fp32.
  const zof::Batch b = batch_of(full.config().vocab_size);
  const Single one = single_run(plus, b);
  const TpOut two = tp_run(full, 2, b, &key, eps);
  EXPECT_LT(rel_diff(two.logits, one.logits), 2e-6);
}

// What finetune --tensor-parallel runs on a rank: tp::perturbed_copy's two streams, and the
// ZO engine's updates over the slice's element runs (SGD with weight decay, momentum, Adam,
// three steps each so that the state carries over), are the single process's on the elements
// the slice holds, bit for bit; with dense directions and with low-rank ones (--low-rank 2, V
// new every 2 steps: steps 0 and 1 draw different U and the same V, step 2 a new V), whose
// factors are the whole matrix's, also where a row-parallel slice holds a part of each row.
TEST_P(TensorParallel, ASlicesCopiesAndUpdatesAreTheSingleProcessOnesBitForBit) {
  const std::string dir = model_dir(GetParam());
  ZOF_REQUIRE_PATH(dir + "/model.safetensors");
  const zof::Model full = zof::Model::load(dir);
  auto be = zof::test::cpu_backend(1);
  for (const uint32_t rank : {0u, 2u}) {
    SCOPED_TRACE("low rank " + std::to_string(rank));
    zof::ZKey key{99, 3, 1, zof::kZGaussian};
    key.rank = rank;
    key.rank_every = 2;
    const float eps = 1e-3f;
    for (int sign : {1, -1}) {
      zof::Model one = zof::Model::load(dir);  // the single process's stream, whole
      for (int pi = 0; pi < (int)one.params().size(); ++pi) {
        zof::Param& q = one.params()[(size_t)pi];
        std::vector<float> out((size_t)q.numel);
        zof::ZKey k = key;  // a matrix's width, as the engine's walk sets it
        k.cols = q.shape.size() >= 2 ? (uint32_t)q.shape.back() : 0;
        be->zo_pass(zof::Theta(q.data), q.numel, (uint32_t)pi, 0, nullptr, 0, 0.f, &k, eps,
                    sign > 0 ? out.data() : nullptr, sign < 0 ? out.data() : nullptr);
        be->synchronize(nullptr);
        std::memcpy(q.data, out.data(), out.size() * sizeof(float));
      }
      for (int T : {2, 4})
        for (int r = 0; r < T; ++r) {
          const zof::tp::Plan p = zof::tp::plan(full.config(), r, T);
          const zof::Model mine = zof::tp::slice(full, p);
          zof::Model copy = zof::Model::zeros(p.local);
          zof::tp::perturbed_copy(p, *be, mine, key, eps, sign, copy.storage());
          const zof::Model want = zof::tp::slice(one, p);
          EXPECT_EQ(0, std::memcmp(copy.storage(), want.storage(),
                                   want.storage_size() * sizeof(float)))
              << "sign " << sign << " T=" << T << " rank " << r;
        }
    }
    using Opt = zof::ZOStepOptions::Optimizer;
    for (Opt o : {Opt::SGD, Opt::Momentum, Opt::Adam}) {
      zof::ZOStepOptions opt;
      opt.perturb = false;
      opt.optimizer = o;
      opt.weight_decay = 0.1f;
      opt.queries = 2;
      opt.seed = 5;
      opt.low_rank = rank;
      opt.low_rank_every = 2;
      auto steps = [&](zof::ZOEngine& e) {
        e.schedule_update(0, 1e-2f, {0.7, -1.3});
        e.flush();
        e.schedule_update(1, 1e-2f, {-0.4, 2.1});
        e.flush();
        e.schedule_update(2, 1e-2f, {0.3, 0.9});  // a low-rank direction's new V
        e.flush();
      };
      zof::Model one = zof::Model::load(dir);
      std::vector<float> m1, v1;
      {
        zof::ZOEngine e(one, *be, 8, opt);
        steps(e);
        e.read_state(m1, v1);
      }
      for (int T : {2, 4})
        for (int r = 0; r < T; ++r) {
          const zof::tp::Plan p = zof::tp::plan(full.config(), r, T);
          zof::Model mine = zof::tp::slice(full, p);
          std::vector<float> m, v;
          {
            zof::ZOEngine e(mine, *be, 8, opt);
            e.set_tensor_slice(p);
            steps(e);
            e.read_state(m, v);
          }
          const zof::Model want = zof::tp::slice(one, p);
          EXPECT_EQ(0, std::memcmp(mine.storage(), want.storage(),
                                   want.storage_size() * sizeof(float)))
              << "optimizer " << (int)o << " T=" << T << " rank " << r;
          // The state too: the single process's state planes, sliced as the weights are.
          auto expect_plane = [&](const std::vector<float>& whole, const std::vector<float>& mine,
                                  const char* plane) {
            zof::Model st = zof::Model::zeros(full.config());
            ASSERT_EQ((int64_t)whole.size(), st.storage_size());
            std::memcpy(st.storage(), whole.data(), whole.size() * sizeof(float));
            const zof::Model sl = zof::tp::slice(st, p);
            ASSERT_EQ((int64_t)mine.size(), sl.storage_size());
            EXPECT_EQ(0, std::memcmp(mine.data(), sl.storage(), mine.size() * sizeof(float)))
                << "optimizer " << (int)o << " T=" << T << " rank " << r << ": " << plane;
          };
          if (o != Opt::SGD) expect_plane(m1, m, "m");
          if (o == Opt::Adam) expect_plane(v1, v, "v");
          EXPECT_EQ(v.empty(), o != Opt::Adam);
        }
    }
  }
}

TEST_P(TensorParallel, SlicesPlacedBackAreTheModelByteForByte) {
  const std::string dir = model_dir(GetParam());
  ZOF_REQUIRE_PATH(dir + "/model.safetensors");
  const zof::Model full = zof::Model::load(dir);
  for (int T : {2, 4}) {
    zof::Model back = zof::Model::load(dir);
    std::memset(back.storage(), 0, back.storage_size() * sizeof(float));
    int64_t held = 0;
    for (int r = 0; r < T; ++r) {
      const zof::tp::Plan p = zof::tp::plan(full.config(), r, T);
      const zof::Model mine = zof::tp::slice(full, p);
      held += mine.num_params();
      zof::tp::place(p, mine.storage(), back);
    }
    EXPECT_EQ(0, std::memcmp(back.storage(), full.storage(), full.storage_size() * sizeof(float)))
        << "T=" << T;
    EXPECT_GE(held, full.num_params());  // replicated norms (and KV heads) counted per rank
  }
}

INSTANTIATE_TEST_SUITE_P(LlamaFamily, TensorParallel,
                         ::testing::Values("llama_gqa", "stories260K", "qwen2_bias", "qwen3",
                                           "mistral", "mistral_window", "gemma2", "gemma3",
                                           "llama_linear", "phi3"));

TEST(TensorParallelCrossEntropy, EqualsTheFullOneWithinFp32) {
  const int64_t rows = 5, V = 37;
  std::vector<float> logits((size_t)(rows * V));
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = float(std::sin(0.37 * double(i)) * (i % 5 == 0 ? 30.0 : 3.0));
  const std::vector<int32_t> targets{0, 36, 17, -1, 18};
  auto be = zof::test::reference_backend();
  std::vector<float> want((size_t)rows);
  be->cross_entropy(logits.data(), targets.data(), want.data(), rows, V);
  for (int T : {1, 2, 3, 4}) {
    std::vector<std::vector<float>> got((size_t)T, std::vector<float>((size_t)rows));
    run_ranks(T, [&](int r, zof::tp::Group& g) {
      const int64_t v0 = V * r / T, v1 = V * (r + 1) / T;
      std::vector<float> mine;
      for (int64_t i = 0; i < rows; ++i)
        mine.insert(mine.end(), logits.begin() + i * V + v0, logits.begin() + i * V + v1);
      zof::tp::parallel_cross_entropy(g, mine.data(), rows, v0, v1, targets.data(),
                                      got[(size_t)r].data());
    });
    for (int r = 0; r < T; ++r)
      for (int64_t i = 0; i < rows; ++i)
        EXPECT_NEAR(got[(size_t)r][(size_t)i], want[(size_t)i], 1e-5 * (1 + std::fabs(want[(size_t)i])))
            << "T=" << T << " rank " << r << " row " << i;
    EXPECT_EQ(got[(size_t)T - 1][3], 0.f);  // no target, no loss
  }
}

TEST(TensorParallelPlan, KvHeadsSplitOrReplicatedAndRefusals) {
  const zof::ModelConfig gqa = zof::ModelConfig::load(model_dir("llama_gqa") + "/config.json");
  // 8 heads, 2 KV heads: T = 2 splits them, T = 4 and 8 give each rank the one its q heads use.
  const zof::tp::Plan two = zof::tp::plan(gqa, 1, 2);
  EXPECT_FALSE(two.kv_replicated);
  EXPECT_EQ(two.kv_begin, 1);
  EXPECT_EQ(two.local.num_heads, 4);
  for (int r = 0; r < 4; ++r) {
    const zof::tp::Plan p = zof::tp::plan(gqa, r, 4);
    EXPECT_TRUE(p.kv_replicated);
    EXPECT_EQ(p.kv_begin, r / 2);
    EXPECT_EQ(p.local.num_kv_heads, 1);
  }
  auto refused = [](const zof::ModelConfig& c, int T, const std::string& says) {
    try {
      zof::tp::check(c, T);
      ADD_FAILURE() << "T=" << T << " was not refused";
    } catch (const zof::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("--tensor-parallel " + std::to_string(T)), std::string::npos) << m;
      EXPECT_NE(m.find(says), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    }
  };
  refused(gqa, 3, "does not divide num_attention_heads 8");
  refused(gqa, 16, "does not divide num_attention_heads 8");
  refused(zof::ModelConfig::load(model_dir("opt") + "/config.json"), 2, "the opt family");
  refused(zof::ModelConfig::load(model_dir("gpt2") + "/config.json"), 2, "the gpt2 family");
  EXPECT_NO_THROW(zof::tp::check(zof::ModelConfig::load(model_dir("phi3") + "/config.json"), 2));
  zof::ModelConfig mistral = zof::ModelConfig::load(model_dir("mistral") + "/config.json");
  mistral.num_heads = 12;  // 4 KV heads: T = 6 divides the heads, and is neither
  refused(mistral, 6, "num_key_value_heads 4");
  mistral.num_heads = 8;
  mistral.o_bias = true;
  refused(mistral, 2, "biases on o_proj");
  EXPECT_NO_THROW(zof::tp::check(gqa, 1));
  EXPECT_NO_THROW(zof::tp::check(zof::ModelConfig::load(model_dir("opt") + "/config.json"), 1));
}

}  // namespace
