// A bf16 master held in 2 bytes a parameter (Model storage in bf16, --master bf16 on the host):
// the model's own operations (random, load, save, fingerprint, non-finite search, conversion)
// against the same model held in fp32 and rounded; and the ZO walk, its updates and the
// evaluation's forward giving the same bits as a bf16 master held in fp32 storage (the
// numerics of stops 21-22, themselves tested against plain references), on every golden
// architecture, every optimizer, one- and two-sided, dense and sparse, fp32 and bf16 products.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "common.h"
#include "golden_batch.h"
#include "util/philox.h"
#include "zof/backend.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zo/jvp.h"
#include "zof/model.h"
#include "hf/safetensors.h"
#include "zof/zo.h"

namespace {

namespace fs = std::filesystem;
using zof::DType;
using zof::test::golden_batch;
using zof::test::golden_dir;
using zof::test::golden_model_dir;

std::vector<float> values(const zof::Model& m) { return zof::test::storage_values(m); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

zof::ModelConfig small_config(const std::string& golden) {
  return zof::Model::load(golden_model_dir(golden)).config();
}

TEST(Bf16Storage, RandomLoadSaveAndFingerprintMatchTheRoundedFp32Model) {
  ZOF_REQUIRE_PATH(golden_dir("gpt2") + "/model.safetensors");
  for (const std::string name : {"gpt2", "llama_gqa", "opt"}) {
    SCOPED_TRACE(name);
    const zof::ModelConfig cfg = small_config(name);
    zof::Model f = zof::Model::random(cfg, 7), h = zof::Model::random(cfg, 7, DType::BF16);
    EXPECT_EQ(h.storage_dtype(), DType::BF16);
    f.round_to(DType::BF16);
    ASSERT_TRUE(same_bits(values(f), values(h)));
    // The fingerprint is of the values; its label says how they were held.
    const std::string ff = f.fingerprint(), fh = h.fingerprint();
    EXPECT_EQ(ff.substr(0, 18), "storage-f32-mix64:");
    EXPECT_EQ(fh.substr(0, 19), "storage-bf16-mix64:");
    EXPECT_EQ(ff.substr(18), fh.substr(19));
    for (const zof::Param& p : h.params()) EXPECT_EQ(p.data, nullptr) << p.name;

    // A golden model loaded into bf16: each tensor rounded to nearest as it is read.
    zof::Model lf = zof::Model::load(golden_model_dir(name)),
               lh = zof::Model::load(golden_model_dir(name), DType::BF16);
    lf.round_to(DType::BF16);
    ASSERT_TRUE(same_bits(values(lf), values(lh)));

    // Saved in bf16 (as is: GPT-2's Conv1D transposed back) and fp32 (widened), and read back:
    // the same values; in f16, each value rounded to f16's nearest.
    const fs::path dir = fs::temp_directory_path() / ("zof_bf16_storage_" + name);
    for (DType t : {DType::BF16, DType::F32, DType::F16}) {
      fs::remove_all(dir);
      lh.save(dir.string(), t);
      const std::string head =
          zof::test::read_file((dir / "model.safetensors").string()).substr(0, 2048);
      EXPECT_NE(head.find(std::string("\"") + zof::dtype_name(t) + "\""), std::string::npos);
      zof::Model wide = zof::Model::load(dir.string());
      if (t == DType::F16) {
        std::vector<float> want = values(lh);
        for (float& x : want) x = zof::f16_to_f32(zof::f32_to_f16(x));
        for (const zof::Param& p : lh.params())  // padding is not saved
          for (int64_t j = 0; j < p.numel; ++j)
            ASSERT_EQ(wide.storage()[p.offset + j], want[p.offset + j]) << p.name << " " << j;
        continue;
      }
      zof::Model back = zof::Model::load(dir.string(), DType::BF16);
      EXPECT_TRUE(same_bits(values(back), values(lh))) << zof::dtype_name(t);
      EXPECT_TRUE(same_bits(values(wide), values(lh))) << zof::dtype_name(t);
    }
    fs::remove_all(dir);

    // Rounded to f16 (what --save-dtype f16 evaluates): in place, the values fp32 storage gets.
    zof::Model r16 = zof::Model::load(golden_model_dir(name), DType::BF16);
    r16.round_to(DType::F16);
    EXPECT_EQ(r16.storage_dtype(), DType::BF16);
    zof::Model f16 = zof::Model::load(golden_model_dir(name));
    f16.round_to(DType::BF16);
    f16.round_to(DType::F16);
    EXPECT_TRUE(same_bits(values(r16), values(f16)));

    // Conversion both ways: exact from bf16, nearest even to it.
    zof::Model c = zof::Model::load(golden_model_dir(name), DType::BF16);
    c.set_storage_dtype(DType::F32);
    EXPECT_TRUE(same_bits(values(c), values(lh)));
    EXPECT_NE(c.params()[0].data, nullptr);
    c.set_storage_dtype(DType::BF16);
    EXPECT_TRUE(same_bits(values(c), values(lh)));
  }
}

// A checkpoint read into a model (resume): bf16 into fp32 storage and fp32 into bf16, exact for
// a bf16 master's values; a finite weight past bf16's range is refused by name, not taken as inf.
TEST(Bf16Storage, ReadWeightsAcrossStorageTypes) {
  ZOF_REQUIRE_PATH(golden_model_dir("gpt2") + "/model.safetensors");
  const zof::Model h = zof::Model::load(golden_model_dir("gpt2"), DType::BF16);
  const fs::path dir = fs::temp_directory_path() / "zof_bf16_read_weights";
  for (DType file : {DType::BF16, DType::F32}) {
    fs::remove_all(dir);
    h.save(dir.string(), file);
    for (DType held : {DType::F32, DType::BF16}) {
      zof::Model m = zof::Model::load(golden_model_dir("gpt2"), held);
      EXPECT_FALSE(same_bits(values(m), values(h)) && held == DType::F32);
      m.read_weights(dir.string());
      EXPECT_TRUE(same_bits(values(m), values(h)))
          << zof::dtype_name(file) << " into " << zof::dtype_name(held);
      EXPECT_EQ(m.stored_dtype(), DType::F32) << "the base model's dtype is kept";
    }
  }
  zof::Model big = zof::Model::load(golden_model_dir("gpt2"));
  big.params()[3].data[5] = 3.4e38f;  // finite in fp32, past bf16's largest (3.39e38)
  fs::remove_all(dir);
  big.save(dir.string(), DType::F32);
  try {
    zof::Model::load(dir.string(), DType::BF16);
    FAIL() << "a weight past bf16's range was accepted";
  } catch (const zof::Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(big.params()[3].name), std::string::npos) << w;
    EXPECT_NE(w.find("3.4e+38 at element 5, beyond bf16's range"), std::string::npos) << w;
  }
  EXPECT_NO_THROW(zof::Model::load(dir.string()));  // fp32 holds it
  fs::remove_all(dir);
}

// The JVP walk reads fp32 weights: a model held in bf16 is refused by name, not misread.
TEST(Bf16Storage, JvpEstimatorRefusesBf16Storage) {
  ZOF_REQUIRE_PATH(golden_model_dir("gpt2") + "/model.safetensors");
  const zof::Model h = zof::Model::load(golden_model_dir("gpt2"), DType::BF16);
  auto be = zof::test::cpu_backend(0);
  try {
    zof::JVPEstimator j(h, *be, 8, 1);
    FAIL() << "accepted";
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find("JVP estimator reads weights held in fp32"),
              std::string::npos)
        << e.what();
  }
}

TEST(Bf16Storage, NonFiniteSearchFindsTheElement) {
  ZOF_REQUIRE_PATH(golden_dir("llama_gqa") + "/model.safetensors");
  zof::Model m = zof::Model::load(golden_model_dir("llama_gqa"), DType::BF16);
  EXPECT_EQ(m.find_non_finite().param, -1);
  const int pi = (int)m.params().size() / 2;
  const int64_t at = m.params()[pi].numel - 3;
  uint16_t* w = m.storage_bf16() + m.params()[pi].offset;
  w[at] = zof::f32_to_bf16(-std::numeric_limits<float>::infinity());
  auto bad = m.find_non_finite();
  EXPECT_EQ(bad.param, pi);
  EXPECT_EQ(bad.index, at);
  EXPECT_TRUE(std::isinf(bad.value) && bad.value < 0);
  w[at] = zof::f32_to_bf16(std::nanf(""));
  bad = m.find_non_finite();
  EXPECT_EQ(bad.param, pi);
  EXPECT_TRUE(std::isnan(bad.value));
}

// The engine on a model held in bf16 against the engine on the same values held in fp32 (a bf16
// master rounded in fp32 storage): every step's losses and the weights after it, bit for bit.
struct Variant {
  const char* name;
  zof::ZOStepOptions::Optimizer opt;
  bool one_sided;
  float sparsity;
  DType compute;
};

TEST(Bf16Storage, EngineStepsEqualTheMasterHeldInFp32) {
  using Opt = zof::ZOStepOptions::Optimizer;
  const Variant variants[] = {{"sgd", Opt::SGD, false, 0.f, DType::F32},
                              {"sgd bf16", Opt::SGD, false, 0.f, DType::BF16},
                              {"momentum one-sided", Opt::Momentum, true, 0.f, DType::F32},
                              {"adam sparse bf16", Opt::Adam, false, 0.5f, DType::BF16},
                              {"sgd one-sided bf16", Opt::SGD, true, 0.f, DType::BF16}};
  for (const std::string& name : zof::test::golden_models()) {
    ZOF_REQUIRE_PATH(golden_model_dir(name) + "/model.safetensors");
    const zof::LossBatch lb = golden_batch(name);
    const int64_t rows = lb.batch.B * lb.batch.T;
    for (const Variant& v : variants) {
      SCOPED_TRACE(name + " " + v.name);
      zof::ZOStepOptions o;
      o.eps = 1e-2f, o.weight_decay = 0.05f, o.queries = 2, o.seed = 17;
      o.optimizer = v.opt, o.one_sided = v.one_sided, o.sparsity = v.sparsity;
      o.compute = v.compute, o.master = DType::BF16;
      auto be = zof::test::cpu_backend(0);
      zof::Model f = zof::Model::load(golden_model_dir(name));
      zof::Model h = zof::Model::load(golden_model_dir(name), DType::BF16);
      zof::ZOEngine ef(f, *be, rows, o), eh(h, *be, rows, o);
      const float lr = v.opt == Opt::Adam ? 1e-3f : 1e-2f;
      for (uint32_t step = 0; step < 3; ++step) {
        const auto lf = ef.perturbed_losses(step, {lb});
        const auto lh = eh.perturbed_losses(step, {lb});
        ASSERT_EQ(lf.sum_plus, lh.sum_plus) << "step " << step;
        ASSERT_EQ(lf.sum_minus, lh.sum_minus) << "step " << step;
        ef.schedule_update(step, lr, ef.projected_gradients(lf));
        eh.schedule_update(step, lr, eh.projected_gradients(lh));
      }
      ef.flush();
      eh.flush();
      const std::vector<float> wf = values(f), wh = values(h);
      ASSERT_TRUE(same_bits(wf, wh));
      zof::Model base = zof::Model::load(golden_model_dir(name), DType::BF16);
      EXPECT_FALSE(same_bits(values(base), wh)) << "the updates moved nothing";
      // The evaluation's forward reads the bf16 storage as the fp32 one.
      EXPECT_EQ(ef.loss({lb}), eh.loss({lb}));
      std::vector<float> mf, vf, mh, vh;
      ef.read_state(mf, vf);
      eh.read_state(mh, vh);
      EXPECT_TRUE(mf == mh && vf == vh) << "optimizer state differs";
    }
  }
}

// A bf16 master's rounding window (ZOStepOptions::round_every = 3): the walks inside the window
// leave the stored master untouched and perturb theta = master - the window's updates; the
// walk that closes it stores the window's updates summed in fp32 and rounded once. The first
// held walk against an fp32 master that applied the same update (one update is the same
// arithmetic, so the same losses); the closed master against a plain scalar reference (z
// element by element, the kernels' order of accumulation, the rounding's bits of the window's
// first step). Two-point and one-sided, dense and sparse, fp32 and bf16 products, a tied head.
TEST(Bf16Storage, RoundingWindowSumsItsStepsAndRoundsOnce) {
  using Opt = zof::ZOStepOptions::Optimizer;
  const Variant variants[] = {{"two-point", Opt::SGD, false, 0.f, DType::F32},
                              {"one-sided bf16", Opt::SGD, true, 0.f, DType::BF16},
                              {"sparse", Opt::SGD, false, 0.5f, DType::F32}};
  for (const std::string name : {"stories260K", "gpt2", "opt350_shape"}) {
    ZOF_REQUIRE_PATH(golden_model_dir(name) + "/model.safetensors");
    const zof::LossBatch lb = golden_batch(name);
    const int64_t rows = lb.batch.B * lb.batch.T;
    for (const Variant& v : variants) {
      SCOPED_TRACE(name + " " + v.name);
      zof::ZOStepOptions o;
      o.eps = 1e-2f, o.weight_decay = 0.05f, o.queries = 2, o.seed = 17;
      o.one_sided = v.one_sided, o.sparsity = v.sparsity, o.compute = v.compute;
      o.master = DType::BF16, o.round_every = 3;
      zof::ZOStepOptions of = o;  // the reference: an fp32 master, each update as it lands
      of.master = DType::F32, of.round_every = 1;
      auto be = zof::test::cpu_backend(0);
      zof::Model h = zof::Model::load(golden_model_dir(name), DType::BF16);
      zof::Model f = zof::Model::load(golden_model_dir(name));
      f.round_to(DType::BF16);  // the same values, in fp32 storage
      zof::ZOEngine eh(h, *be, rows, o), ef(f, *be, rows, of);
      const std::vector<float> base = values(h);
      const float lr = 1e-2f;
      std::vector<std::vector<double>> g;
      for (uint32_t step = 0; step < 3; ++step) {
        const auto lh = eh.perturbed_losses(step, {lb});
        if (step < 2) {  // no update yet, then the first held walk: as the fp32 master's
          const auto lf = ef.perturbed_losses(step, {lb});
          ASSERT_EQ(lh.sum_plus, lf.sum_plus) << "step " << step;
          ASSERT_EQ(lh.sum_minus, lf.sum_minus) << "step " << step;
        }
        ASSERT_TRUE(same_bits(values(h), base)) << "a walk inside the window wrote the master";
        g.push_back(eh.projected_gradients(lh));
        eh.schedule_update(step, lr, g.back());
        if (step == 0) ef.schedule_update(step, lr, g.back());
      }
      // Steps 0-2 pending, lr_wd summed in float as PendingUpdate::join does.
      float lr_wd = 0.f;
      for (int s = 0; s < 3; ++s) lr_wd += lr * o.weight_decay;
      std::vector<float> want = base;
      const auto& params = h.params();
      for (size_t pi = 0; pi < params.size(); ++pi) {
        const zof::Param& p = params[pi];
        const float mask = eh.masks()[pi];
        const int64_t at = p.offset;  // the tensor's place in the storage
        for (int64_t i = 0; i < p.numel; ++i) {
          const float th = base[at + i];
          float acc = (p.decay ? lr_wd : 0.f) * th;
          for (uint32_t s = 0; s < 3; ++s)
            for (uint32_t j = 0; j < 2; ++j) {
              const zof::ZKey key{o.seed, s, j};
              const float z = std::fabs(th) > mask ? 0.f : zof::z_element(key, (uint32_t)pi, i);
              acc = std::fmaf((float)((double)lr * g[s][j] / 2.0), z, acc);
            }
          uint32_t r[4];
          zof::round_bits_group(o.seed, 0, (uint32_t)pi, (uint32_t)(i >> 2), r);
          want[at + i] = zof::bf16_round_stochastic(th - acc, r[i & 3]);
        }
      }
      eh.perturbed_losses(3, {lb});  // step 3's walk closes the window
      const std::vector<float> got = values(h);
      EXPECT_FALSE(same_bits(got, base)) << "the window's close moved nothing";
      int64_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
      EXPECT_EQ(differ, 0) << "of " << got.size() << " weights";
    }
  }
}

// Whole-model forwards (logits, every position) on the bf16-held model against the fp32-held
// rounded one, in fp32 and bf16 products: the same bits.
TEST(Bf16Storage, ForwardEqualsTheRoundedFp32Model) {
  for (const std::string& name : zof::test::golden_models()) {
    ZOF_REQUIRE_PATH(golden_model_dir(name) + "/model.safetensors");
    SCOPED_TRACE(name);
    const zof::LossBatch lb = golden_batch(name);
    zof::Model f = zof::Model::load(golden_model_dir(name));
    f.round_to(DType::BF16);
    const zof::Model h = zof::Model::load(golden_model_dir(name), DType::BF16);
    for (DType t : {DType::F32, DType::BF16}) {
      auto be = zof::test::cpu_backend(0);
      std::vector<float> of, oh;
      zof::Forward ff(f, *be, lb.batch.B * lb.batch.T), fh(h, *be, lb.batch.B * lb.batch.T);
      ff.set_compute(t);
      fh.set_compute(t);
      ff.logits(lb.batch, of);
      fh.logits(lb.batch, oh);
      ASSERT_TRUE(same_bits(of, oh)) << zof::dtype_name(t);
      fh.logits(lb.batch, oh);  // again: the widened weights kept or made again, the same
      ASSERT_TRUE(same_bits(of, oh)) << zof::dtype_name(t);
    }
  }
}

// A model held in bf16 is a bf16 master: an fp32 master's updates would be lost in it.
TEST(Bf16Storage, EngineRefusesAnFp32MasterOnBf16Storage) {
  ZOF_REQUIRE_PATH(golden_dir("gpt2") + "/model.safetensors");
  zof::Model h = zof::Model::load(golden_model_dir("gpt2"), DType::BF16);
  auto be = zof::test::cpu_backend(0);
  zof::ZOStepOptions o;
  try {
    zof::ZOEngine e(h, *be, 8, o);
    FAIL() << "accepted";
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--master bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
