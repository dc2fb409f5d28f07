// Op conformance: every op of every compiled backend against the scalar reference backend on
// random inputs of many shapes (fp32: error under kTol of the output's largest magnitude, never a
// NaN), the reference itself against hand-computed values, aliasing, and thread-count
// independence of the CPU backend. A new backend adds one line to fast_backends().
#include <cmath>
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#if ZOF_WITH_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "common.h"
#include "cpu/cpu_ops.h"
#include "cpu/sim_device.h"
#include "zof/backend.h"
#include "zof/config.h"

namespace {

using zof::Backend;

// fp32 ops against the double-accumulating reference. The measured worst case is 1.3e-6 (layer_norm
// of rows with mean 30; matmul with K=1000 8e-7); 1e-5 leaves room for other compilers and CPUs.
constexpr double kTol = 1e-5;
// bf16 attention (OpsConform.AttentionBf16): against the reference's bf16, measured worst
// 1.5e-3 (about an ulp of bf16, 2^-9, of the largest probabilities); against fp32 5.0e-3.
constexpr double kAttnBf16 = 4e-3, kAttnBf16VsFp32 = 1.5e-2;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct BackendCase {
  std::string label;
  std::function<std::unique_ptr<Backend>()> make;
};

// Every compiled backend that is tested against the reference.
std::vector<BackendCase> fast_backends() {
  return {
      {"cpu(1 thread)", [] { return zof::make_cpu_backend(1); }},
      {"cpu(2 threads)", [] { return zof::make_cpu_backend(2); }},
  };
}

// The reference, then every fast backend: the hand-computed cases run on all of them.
std::vector<BackendCase> all_backends() {
  std::vector<BackendCase> all{{"reference", [] { return zof::make_reference_backend(); }}};
  for (auto& c : fast_backends()) all.push_back(c);
  return all;
}

// Device buffers of one backend, freed together; inputs are uploaded from host vectors and
// outputs start as NaN, so an element an op forgets to write fails the NaN check.
class Device {
 public:
  explicit Device(Backend& be) : be_(be) {}
  ~Device() {
    for (void* p : ptrs_) be_.free(p);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  template <class T>
  T* put(const std::vector<T>& host) {  // empty: nullptr (an absent optional argument)
    if (host.empty()) return nullptr;
    void* d = be_.alloc(host.size() * sizeof(T));
    ptrs_.push_back(d);
    be_.copy_to_device(d, host.data(), host.size() * sizeof(T), nullptr);
    return static_cast<T*>(d);
  }
  float* output(size_t n) { return put(std::vector<float>(n, kNaN)); }
  template <class T>
  std::vector<T> get(const T* d, size_t n) {
    std::vector<T> host(n);
    be_.copy_to_host(host.data(), d, n * sizeof(T), nullptr);
    be_.synchronize(nullptr);
    return host;
  }

 private:
  Backend& be_;
  std::vector<void*> ptrs_;
};

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// max |got - want| / max |want| under tol, with no NaN or inf on either side.
::testing::AssertionResult close(const std::vector<float>& want, const std::vector<float>& got,
                                 double tol) {
  if (want.size() != got.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  double scale = 0.0, err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) return ::testing::AssertionFailure() << "reference[" << i << "] = " << want[i];
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "out[" << i << "] = " << got[i];
    scale = std::max(scale, std::fabs(double(want[i])));
    double e = std::fabs(double(got[i]) - double(want[i]));
    if (e > err) err = e, worst = i;
  }
  double rel = err / std::max(scale, 1e-30);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << rel << " > " << tol << " at [" << worst
                                       << "]: " << got[worst] << " vs " << want[worst]
                                       << " (scale " << scale << ")";
}

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- one function per op: host inputs in, host output back --------------------------------------

std::vector<float> run_matmul(Backend& be, const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& bias, int64_t M, int64_t N, int64_t K) {
  Device dev(be);
  float* y = dev.output(size_t(M * N));
  be.matmul(dev.put(x), dev.put(w), dev.put(bias), y, M, N, K);
  return dev.get(y, size_t(M * N));
}

// w_offset 1: Gemma's RMSNorm, y = x r (w + 1).
std::vector<float> run_rms_norm(Backend& be, const std::vector<float>& x,
                                const std::vector<float>& w, int64_t rows, int64_t dim, float eps,
                                float w_offset = 0.f) {
  Device dev(be);
  float* y = dev.output(x.size());
  be.rms_norm(dev.put(x), dev.put(w), y, rows, dim, eps, w_offset);
  return dev.get(y, x.size());
}

std::vector<float> run_layer_norm(Backend& be, const std::vector<float>& x,
                                  const std::vector<float>& w, const std::vector<float>& b,
                                  int64_t rows, int64_t dim, float eps) {
  Device dev(be);
  float* y = dev.output(x.size());
  be.layer_norm(dev.put(x), dev.put(w), dev.put(b), y, rows, dim, eps);
  return dev.get(y, x.size());
}

// RoPE with the table inv_freq over the first rotary_dim dims of each head.
std::vector<float> run_rope_table(Backend& be, const std::vector<float>& x,
                                  const std::vector<int32_t>& pos, int64_t rows, int64_t heads,
                                  int64_t head_dim, int64_t rotary_dim,
                                  const std::vector<float>& inv_freq) {
  Device dev(be);
  float* d = dev.put(x);
  be.rope(d, dev.put(pos), rows, heads, head_dim, rotary_dim, dev.put(inv_freq));
  return dev.get(d, x.size());
}
// Plain RoPE: every dim, the default table of theta.
std::vector<float> run_rope(Backend& be, const std::vector<float>& x,
                            const std::vector<int32_t>& pos, int64_t rows, int64_t heads,
                            int64_t head_dim, float theta) {
  return run_rope_table(be, x, pos, rows, heads, head_dim, head_dim,
                        zof::rope_default_inv_freq(theta, head_dim));
}

struct AttnShape {
  int64_t B, Tq, Tk, H, Hkv, D, q_offset;
};

// window > 0: a sliding window; softcap > 0: Gemma 2's score soft-capping (backend.h); scale 0:
// 1 / sqrt(D).
std::vector<float> run_attention(Backend& be, const std::vector<float>& q,
                                 const std::vector<float>& k, const std::vector<float>& v,
                                 const std::vector<uint8_t>& mask, const AttnShape& s,
                                 int64_t window = 0, float softcap = 0.f, float scale = 0.f,
                                 zof::DType t = zof::DType::F32) {
  Device dev(be);
  const size_t n = size_t(s.B * s.Tq * s.H * s.D);
  float* out = dev.output(n);
  if (scale == 0.f) scale = 1.0f / std::sqrt(float(s.D));
  be.attention(dev.put(q), dev.put(k), dev.put(v), out, dev.put(mask), s.B, s.Tq, s.Tk, s.H, s.Hkv,
               s.D, s.q_offset, scale, window, softcap, t);
  return dev.get(out, n);
}

std::vector<float> run_silu_mul(Backend& be, const std::vector<float>& gate,
                                const std::vector<float>& up) {
  Device dev(be);
  float* out = dev.output(gate.size());
  be.silu_mul(dev.put(gate), dev.put(up), out, int64_t(gate.size()));
  return dev.get(out, gate.size());
}

std::vector<float> run_gelu_tanh_mul(Backend& be, const std::vector<float>& gate,
                                     const std::vector<float>& up) {
  Device dev(be);
  float* out = dev.output(gate.size());
  be.gelu_tanh_mul(dev.put(gate), dev.put(up), out, int64_t(gate.size()));
  return dev.get(out, gate.size());
}

std::vector<float> run_mul_scalar(Backend& be, const std::vector<float>& x, float a) {
  Device dev(be);
  float* d = dev.put(x);
  be.mul_scalar(d, a, int64_t(x.size()));
  return dev.get(d, x.size());
}

std::vector<float> run_softcap(Backend& be, const std::vector<float>& x, float cap) {
  Device dev(be);
  float* y = dev.output(x.size());
  be.softcap(dev.put(x), y, cap, int64_t(x.size()));
  return dev.get(y, x.size());
}

using InPlaceOp = void (Backend::*)(float*, int64_t, zof::Stream*);
std::vector<float> run_in_place(Backend& be, InPlaceOp op, const std::vector<float>& x) {
  Device dev(be);
  float* d = dev.put(x);
  (be.*op)(d, int64_t(x.size()), nullptr);
  return dev.get(d, x.size());
}

std::vector<float> run_add(Backend& be, const std::vector<float>& y, const std::vector<float>& x) {
  Device dev(be);
  float* d = dev.put(y);
  be.add(d, dev.put(x), int64_t(y.size()));
  return dev.get(d, y.size());
}

std::vector<float> run_embedding(Backend& be, const std::vector<int32_t>& ids,
                                 const std::vector<float>& table, const std::vector<float>& out0,
                                 int64_t dim, bool accumulate) {
  Device dev(be);
  float* out = accumulate ? dev.put(out0) : dev.output(ids.size() * size_t(dim));
  be.embedding(dev.put(ids), dev.put(table), out, int64_t(ids.size()), dim, accumulate);
  return dev.get(out, ids.size() * size_t(dim));
}

std::vector<float> run_cross_entropy(Backend& be, const std::vector<float>& logits,
                                     const std::vector<int32_t>& targets, int64_t vocab) {
  Device dev(be);
  float* nll = dev.output(targets.size());
  be.cross_entropy(dev.put(logits), dev.put(targets), nll, int64_t(targets.size()), vocab);
  return dev.get(nll, targets.size());
}

// Runs `run` on the reference and on every fast backend and compares.
void conform(const std::string& what, const std::function<std::vector<float>(Backend&)>& run,
             double tol = kTol) {
  auto ref = zof::make_reference_backend();
  std::vector<float> want = run(*ref);
  for (auto& c : fast_backends()) {
    auto be = c.make();
    EXPECT_TRUE(close(want, run(*be), tol)) << c.label << ": " << what;
  }
}

// ---- memory and streams ---------------------------------------------------------------------------

TEST(Ops, MemoryAndStreams) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    EXPECT_FALSE(be->name().empty());
    EXPECT_GT(be->free_memory(), size_t(0));
    for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(100000)}) {
      void* d = be->alloc(bytes);
      void* h = be->alloc_host_pinned(bytes);
      ASSERT_NE(d, nullptr);
      ASSERT_NE(h, nullptr);
      be->free(d);
      be->free_host_pinned(h);
    }
    zof::Stream* s = be->create_stream();
    EXPECT_NE(s, be->default_stream());
    zof::Event* e = be->create_event();
    std::vector<float> src = uniform(1000, -1, 1, 1), back(1000);
    float* h = static_cast<float*>(be->alloc_host_pinned(4000));
    float* d1 = static_cast<float*>(be->alloc(4000));
    float* d2 = static_cast<float*>(be->alloc(4000));
    std::memcpy(h, src.data(), 4000);
    be->copy_to_device(d1, h, 4000, s);
    be->copy_device(d2, d1, 4000, s);
    be->record(e, s);
    be->wait(be->default_stream(), e);
    be->copy_to_host(back.data(), d2, 4000, be->default_stream());
    be->synchronize(be->default_stream());
    EXPECT_TRUE(bit_identical(src, back));
    be->free(d1);
    be->free(d2);
    be->free_host_pinned(h);
  }
}

// ---- hand-computed values, on every backend including the reference -----------------------------

TEST(OpsHand, Matmul2x2) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    // x = [[1,2],[3,4]], w = [[5,6],[7,8]] (rows are outputs), bias = [0.5, -1]
    auto y = run_matmul(*be, {1, 2, 3, 4}, {5, 6, 7, 8}, {0.5f, -1.0f}, 2, 2, 2);
    EXPECT_EQ(y, (std::vector<float>{17.5f, 22.0f, 39.5f, 52.0f}));
    y = run_matmul(*be, {1, 2, 3, 4}, {5, 6, 7, 8}, {}, 2, 2, 2);
    EXPECT_EQ(y, (std::vector<float>{17.0f, 23.0f, 39.0f, 53.0f}));
  }
}

TEST(OpsHand, Norms) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    // rms([3,4]) = sqrt(12.5)
    auto y = run_rms_norm(*be, {3, 4}, {1, 2}, 1, 2, 0.0f);
    EXPECT_TRUE(close({float(3 / std::sqrt(12.5)), float(8 / std::sqrt(12.5))}, y, 1e-6));
    // mean 2, biased variance 1
    y = run_layer_norm(*be, {1, 3}, {1, 1}, {0, 10}, 1, 2, 0.0f);
    EXPECT_TRUE(close({-1.0f, 11.0f}, y, 1e-6));
  }
}

TEST(OpsHand, Rope) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    const std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, 2, -3};  // (rows 2, heads 1, head_dim 4)
    // Position 0 is the identity.
    EXPECT_EQ(run_rope(*be, x, {0, 0}, 2, 1, 4, 100.0f), x);
    // Position 1 rotates the pairs (0,2) and (1,3) by inv_freq = 100^(-2i/4) = 1 and 0.1 rad.
    auto y = run_rope(*be, x, {1, 1}, 2, 1, 4, 100.0f);
    std::vector<float> want(8);
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 2; ++i) {
        double a = x[r * 4 + i], b = x[r * 4 + i + 2], t = i == 0 ? 1.0 : 0.1;
        want[r * 4 + i] = float(a * std::cos(t) - b * std::sin(t));
        want[r * 4 + i + 2] = float(b * std::cos(t) + a * std::sin(t));
      }
    }
    EXPECT_TRUE(close(want, y, 1e-6));
  }
}

// The rope op rotates by the table it is given, over the first rotary_dim dims of each head;
// the rest pass through bit for bit (partial rotary).
TEST(OpsHand, RopeTablePartialRotary) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    // (rows 2, heads 2, head_dim 6), rotary_dim 4: pairs (0,2) and (1,3) at 0.5 and 0.25 rad per
    // position; dims 4 and 5 untouched.
    const std::vector<float> x = {1, 2, 3, 4, 5, 6, -1, 0.5f, 2, -3, 7, 8,
                                  0.1f, 0.2f, 0.3f, 0.4f, 9, 10, 2, 1, -2, -1, 11, 12};
    const std::vector<float> inv = {0.5f, 0.25f};
    const std::vector<int32_t> pos = {3, 1};
    auto y = run_rope_table(*be, x, pos, 2, 2, 6, 4, inv);
    std::vector<float> want = x;
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 2; ++i) {
          const int o = (r * 2 + h) * 6;
          const double a = x[o + i], b = x[o + i + 2], t = double(float(pos[r]) * inv[i]);
          want[o + i] = float(a * std::cos(t) - b * std::sin(t));
          want[o + i + 2] = float(b * std::cos(t) + a * std::sin(t));
        }
    EXPECT_TRUE(close(want, y, 1e-6));
    for (int rh = 0; rh < 4; ++rh)
      for (int d = 4; d < 6; ++d) EXPECT_EQ(y[rh * 6 + d], x[rh * 6 + d]);
  }
}

// The default table is the formula the kernels computed from theta before they took a table:
// the same bits.
TEST(OpsHand, RopeDefaultTableBits) {
  for (float theta : {10000.0f, 50000.0f, 500000.0f, 1e6f})
    for (int64_t dim : {2, 8, 64, 80, 128}) {
      const std::vector<float> inv = zof::rope_default_inv_freq(theta, dim);
      ASSERT_EQ((int64_t)inv.size(), dim / 2);
      for (int64_t i = 0; i < dim / 2; ++i)
        EXPECT_EQ(inv[i], float(1.0 / std::pow(double(theta), double(2 * i) / double(dim))));
    }
}

TEST(OpsHand, Attention) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    // One key: the output is its value, whatever the query.
    AttnShape one{1, 1, 1, 1, 1, 3, 0};
    EXPECT_EQ(run_attention(*be, {5, -2, 1}, {0.3f, 7, -1}, {1, 2, 3}, {}, one),
              (std::vector<float>{1, 2, 3}));
    // A known softmax row: q=1, D=1, scale 1/sqrt(1), keys [0, ln2, ln3] give weights 1/6, 2/6, 3/6.
    AttnShape row{1, 1, 3, 1, 1, 1, 2};
    auto y = run_attention(*be, {1}, {0, float(std::log(2.0)), float(std::log(3.0))}, {6, 12, 18},
                           {}, row);
    EXPECT_TRUE(close({14.0f}, y, 1e-6));  // (6 + 24 + 54) / 6
    // Causality and the mask: key 0 is padding, so query 0 (sees key 0 only) gets zeros and
    // query 1 sees key 1 alone.
    AttnShape causal{1, 2, 2, 1, 1, 2, 0};
    y = run_attention(*be, {1, 1, 1, 1}, {1, 1, 1, 1}, {10, 20, 30, 40}, {0, 1}, causal);
    EXPECT_EQ(y, (std::vector<float>{0, 0, 30, 40}));
    // Without the mask query 0 reads key 0 only (causal).
    y = run_attention(*be, {1, 1, 1, 1}, {1, 1, 1, 1}, {10, 20, 30, 40}, {}, causal);
    EXPECT_TRUE(close({10, 20, 20, 30}, y, 1e-6));
  }
}

TEST(OpsHand, Pointwise) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    auto y = run_silu_mul(*be, {0, 1, -1}, {3, 2, 2});
    EXPECT_TRUE(close({0.0f, float(2 / (1 + std::exp(-1.0))), float(-2 / (1 + std::exp(1.0)))}, y, 1e-6));
    // gelu(1): 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) and 0.5 (1 + erf(1/sqrt2)); gelu(0) = 0
    y = run_in_place(*be, &Backend::gelu_tanh, {0, 1});
    EXPECT_TRUE(close({0.0f, 0.8411919906f}, y, 1e-6));
    y = run_in_place(*be, &Backend::gelu_erf, {0, 1});
    EXPECT_TRUE(close({0.0f, 0.8413447461f}, y, 1e-6));
    EXPECT_EQ(run_in_place(*be, &Backend::relu, {-1, 2, 0}), (std::vector<float>{0, 2, 0}));
    EXPECT_EQ(run_add(*be, {1, 2}, {10, 20}), (std::vector<float>{11, 22}));
    // table rows 0..2 of dim 2
    const std::vector<float> table = {0, 1, 10, 11, 20, 21};
    EXPECT_EQ(run_embedding(*be, {2, 0, 2}, table, {}, 2, false),
              (std::vector<float>{20, 21, 0, 1, 20, 21}));
    EXPECT_EQ(run_embedding(*be, {1}, table, {5, 6}, 2, true), (std::vector<float>{15, 17}));
  }
}

// Gemma's variants: RMSNorm with weights stored as offsets from 1, a sliding window, soft-capped
// scores, GeGLU, the embedding normalizer and the final-logit soft-capping.
TEST(OpsHand, Gemma) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    // rms([3,4]) = sqrt(12.5), weights (0, 1) + 1
    auto y = run_rms_norm(*be, {3, 4}, {0, 1}, 1, 2, 0.0f, 1.0f);
    EXPECT_TRUE(close({float(3 / std::sqrt(12.5)), float(8 / std::sqrt(12.5))}, y, 1e-6));
    // q = 1, D = 1, scale 1, keys [0, ln2, ln3]: window 2 leaves query i keys i-1 and i, so the
    // weights are (1/3, 2/3) and (2/5, 3/5); window 1 leaves each query its own key exactly.
    AttnShape seq{1, 3, 3, 1, 1, 1, 0};
    const std::vector<float> kl = {0, float(std::log(2.0)), float(std::log(3.0))}, vl = {6, 12, 18};
    y = run_attention(*be, {1, 1, 1}, kl, vl, {}, seq, 2, 0.f, 1.f);
    EXPECT_TRUE(close({6.0f, 10.0f, 15.6f}, y, 1e-6));
    EXPECT_EQ(run_attention(*be, {1, 1, 1}, kl, vl, {}, seq, 1, 0.f, 1.f), vl);
    // The same window for a decoded query at position 2 (q_offset 2).
    y = run_attention(*be, {1}, kl, vl, {}, AttnShape{1, 1, 3, 1, 1, 1, 2}, 2, 0.f, 1.f);
    EXPECT_TRUE(close({15.6f}, y, 1e-6));
    // Soft-capped scores: keys [0, 3] with cap 2 score 0 and 2 tanh(1.5) instead of 0 and 3.
    y = run_attention(*be, {1, 1}, {0, 3}, {6, 12}, {}, AttnShape{1, 2, 2, 1, 1, 1, 0}, 0, 2.f,
                      1.f);
    const double s1 = 2 * std::tanh(1.5), w1 = std::exp(s1) / (1 + std::exp(s1));
    EXPECT_TRUE(close({6.0f, float(6 + 6 * w1)}, y, 1e-6));
    // gelu_tanh(1) = 0.8411919906 and gelu_tanh(-1) = gelu_tanh(1) - 1, times up.
    y = run_gelu_tanh_mul(*be, {0, 1, -1}, {3, 2, 0.5f});
    EXPECT_TRUE(close({0.0f, 2 * 0.8411919906f, 0.5f * (0.8411919906f - 1)}, y, 1e-6));
    EXPECT_EQ(run_mul_scalar(*be, {1, -2, 0.5f, 0}, 3.0f), (std::vector<float>{3, -6, 1.5f, 0}));
    // cap tanh(x / cap): 0, 2 tanh(1), and -cap for a score far below -cap.
    y = run_softcap(*be, {0, 2, -200}, 2.0f);
    EXPECT_TRUE(close({0.0f, float(2 * std::tanh(1.0)), -2.0f}, y, 1e-6));
  }
}

TEST(OpsHand, CrossEntropy) {
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    const int64_t V = 1000;
    // Uniform logits give log(V) for any target; an ignored target (< 0) gives 0.
    auto nll = run_cross_entropy(*be, std::vector<float>(3 * V, 2.5f), {0, -100, int32_t(V - 1)}, V);
    EXPECT_TRUE(close({float(std::log(double(V))), 0.0f, float(std::log(double(V)))}, nll, 1e-6));
    EXPECT_EQ(nll[1], 0.0f);
    // logits [0, ln2, ln3], target 2: log(6) - log(3) = log(2); huge logits stay finite.
    nll = run_cross_entropy(*be, {0, float(std::log(2.0)), float(std::log(3.0)), 1000, -1000, 0},
                            {2, 1}, 3);
    EXPECT_TRUE(close({float(std::log(2.0)), 2000.0f}, nll, 1e-6));
  }
}

// ---- random inputs against the reference -----------------------------------------------------------

TEST(OpsConform, Matmul) {
  struct Shape {
    int64_t M, N, K;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 17, 33}, Shape{2, 3, 5}, Shape{7, 5, 3}, Shape{16, 16, 16},
                  Shape{33, 65, 127}, Shape{1, 300, 1000}, Shape{64, 48, 768}, Shape{100, 130, 70},
                  Shape{3, 7, 0}, Shape{70, 4097, 40}}) {
    for (bool has_bias : {false, true}) {
      auto x = uniform(size_t(s.M * s.K), -1, 1, 1);
      auto w = uniform(size_t(s.N * s.K), -1, 1, 2);
      auto bias = has_bias ? uniform(size_t(s.N), -1, 1, 3) : std::vector<float>{};
      conform("matmul M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                  " K=" + std::to_string(s.K) + (has_bias ? " +bias" : ""),
              [&](Backend& be) { return run_matmul(be, x, w, bias, s.M, s.N, s.K); });
    }
  }
}

TEST(OpsConform, Norms) {
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {1, 7, 64, 768, 1001}) {
      const std::string what = " rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
      auto x = uniform(size_t(rows * dim), -2, 2, 4);
      auto shifted = x;
      for (auto& a : shifted) a += 30.0f;  // a large mean: the variance must not cancel
      auto w = uniform(size_t(dim), 0.5f, 1.5f, 5), b = uniform(size_t(dim), -1, 1, 6);
      conform("rms_norm" + what, [&](Backend& be) { return run_rms_norm(be, x, w, rows, dim, 1e-6f); });
      conform("layer_norm" + what,
              [&](Backend& be) { return run_layer_norm(be, x, w, b, rows, dim, 1e-5f); });
      conform("layer_norm shifted" + what,
              [&](Backend& be) { return run_layer_norm(be, shifted, w, b, rows, dim, 1e-5f); });
    }
  }
}

TEST(OpsConform, Rope) {
  std::mt19937 rng(7);
  for (int64_t rows : {1, 5, 40}) {
    for (int64_t heads : {1, 3}) {
      for (int64_t head_dim : {2, 8, 64, 80, 128, 300}) {
        for (float theta : {10000.0f, 500000.0f}) {
          auto x = uniform(size_t(rows * heads * head_dim), -1, 1, 8);
          std::vector<int32_t> pos(static_cast<size_t>(rows));
          for (auto& p : pos) p = int32_t(rng() % 4096);
          pos[0] = 0;
          conform("rope rows=" + std::to_string(rows) + " heads=" + std::to_string(heads) +
                      " head_dim=" + std::to_string(head_dim) + " theta=" + std::to_string(theta),
                  [&](Backend& be) { return run_rope(be, x, pos, rows, heads, head_dim, theta); });
          if (head_dim >= 8) {  // partial rotary, with a scaled table
            const int64_t rd = head_dim / 2 - (head_dim / 2) % 2;
            std::vector<float> inv = zof::rope_default_inv_freq(theta, rd);
            for (size_t i = 0; i < inv.size(); ++i) inv[i] /= float(1 + i % 3);
            conform("rope rows=" + std::to_string(rows) + " heads=" + std::to_string(heads) +
                        " head_dim=" + std::to_string(head_dim) + " rotary_dim=" +
                        std::to_string(rd),
                    [&](Backend& be) {
                      return run_rope_table(be, x, pos, rows, heads, head_dim, rd, inv);
                    });
          }
        }
      }
    }
  }
}

enum Mask { kNone, kRightPad, kLeftPad, kRandom };

// A key mask (B, Tk) of the kind asked (empty for kNone): odd sequences are padded on the right
// or the left by Tk/3 + 1 keys, or a random quarter of all keys is masked.
std::vector<uint8_t> attention_mask(Mask kind, const AttnShape& s) {
  std::vector<uint8_t> mask;
  if (kind == kNone) return mask;
  mask.assign(size_t(s.B * s.Tk), 1);
  std::mt19937 rng(12);
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t pad = b % 2 == 1 ? s.Tk / 3 + 1 : 0;  // odd sequences are padded
    for (int64_t j = 0; j < s.Tk; ++j) {
      if (kind == kRightPad && j >= s.Tk - pad) mask[b * s.Tk + j] = 0;
      if (kind == kLeftPad && j < pad) mask[b * s.Tk + j] = 0;
      if (kind == kRandom && rng() % 4 == 0) mask[b * s.Tk + j] = 0;
    }
  }
  return mask;
}

TEST(OpsConform, Attention) {
  struct Case {
    AttnShape s;
    Mask mask;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{1, 1, 1, 1, 1, 8, 0}, kNone, "T=1"},
      {{2, 7, 7, 4, 4, 16, 0}, kNone, "MHA"},
      {{2, 13, 13, 4, 2, 64, 0}, kNone, "GQA H/Hkv=2"},
      {{1, 33, 33, 8, 2, 32, 0}, kNone, "GQA H/Hkv=4"},
      {{2, 3, 20, 4, 2, 16, 17}, kNone, "KV cache Tq<Tk q_offset>0"},
      {{2, 1, 9, 4, 1, 64, 8}, kRightPad, "decode one token, MQA, right padding"},
      {{3, 4, 10, 2, 1, 24, 2}, kRandom, "Tq<Tk, queries see part of the cache"},
      {{2, 21, 21, 2, 2, 5, 0}, kLeftPad, "left padding (queries that see no key), odd D"},
      {{2, 130, 130, 2, 1, 64, 0}, kRandom, "several key and query blocks"},
      {{1, 70, 200, 4, 4, 80, 130}, kLeftPad, "long cache, left padding, D=80"},
  };
  for (const Case& c : cases) {
    const AttnShape& s = c.s;
    auto q = uniform(size_t(s.B * s.Tq * s.H * s.D), -2, 2, 9);
    auto k = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -2, 2, 10);
    auto v = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -1, 1, 11);
    const std::vector<uint8_t> mask = attention_mask(c.mask, s);
    conform(std::string("attention ") + c.what,
            [&](Backend& be) { return run_attention(be, q, k, v, mask, s); });
  }
}

TEST(OpsConform, Pointwise) {
  for (int64_t n : {1, 15, 1000, 4097, 70001}) {
    const std::string what = " n=" + std::to_string(n);
    auto x = uniform(size_t(n), -8, 8, 13), y = uniform(size_t(n), -3, 3, 14);
    // The tails: exp overflow and underflow inside silu and gelu must not make NaN.
    auto wide = uniform(size_t(n), -200, 200, 15);
    conform("silu_mul" + what, [&](Backend& be) { return run_silu_mul(be, x, y); });
    conform("silu_mul wide" + what, [&](Backend& be) { return run_silu_mul(be, wide, y); });
    for (auto [op, name] : {std::pair{&Backend::gelu_tanh, "gelu_tanh"},
                            std::pair{&Backend::gelu_erf, "gelu_erf"}, std::pair{&Backend::relu, "relu"}}) {
      conform(name + what, [&](Backend& be) { return run_in_place(be, op, x); });
      conform(name + std::string(" wide") + what, [&](Backend& be) { return run_in_place(be, op, wide); });
    }
    conform("add" + what, [&](Backend& be) { return run_add(be, y, x); });
  }
}

// ---- Gemma 2/3: RMSNorm on offsets from 1, windowed and capped attention, GeGLU, softcap ----

// Gemma's RMSNorm (w_offset 1): the weights are offsets around 0 and the norm multiplies by
// (w + 1) formed in fp32, also in place (y == x) as the model runs it (measured worst 1.9e-7, under
// kTol). That is the plain norm with the weights w + 1 rounded to fp32, bit for bit, on every
// backend.
TEST(OpsConform, RmsNormGemmaOffset) {
  for (int64_t rows : {1, 3, 17, 64}) {
    for (int64_t dim : {1, 7, 64, 768, 1001}) {
      const std::string what = " rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
      auto x = uniform(size_t(rows * dim), -2, 2, 51), w = uniform(size_t(dim), -0.5f, 0.5f, 52);
      std::vector<float> w1 = w;
      for (auto& a : w1) a += 1.0f;
      conform("rms_norm w_offset=1" + what,
              [&](Backend& be) { return run_rms_norm(be, x, w, rows, dim, 1e-6f, 1.0f); });
      conform("rms_norm w_offset=1 in place" + what, [&](Backend& be) {
        Device dev(be);
        float* d = dev.put(x);
        be.rms_norm(d, dev.put(w), d, rows, dim, 1e-6f, 1.0f);
        return dev.get(d, x.size());
      });
      for (auto& c : all_backends()) {
        auto be = c.make();
        EXPECT_TRUE(bit_identical(run_rms_norm(*be, x, w, rows, dim, 1e-6f, 1.0f),
                                  run_rms_norm(*be, x, w1, rows, dim, 1e-6f)))
            << c.label << what;
      }
    }
  }
}

// Sliding windows and soft-capped scores on both kernel paths of the CPU backend: items of 16
// rows (a row is a (position, query head) pair of one kv head: 16 / group positions per item)
// walking keys in blocks of 64, and items of <= 4 rows one row at a time (decoding). Windows of
// 1, 3, 5 keys and ones that cross block boundaries (64, 100), alone and with caps of 2.5 (scores
// of +-4 and more: most of them bent) and 50 (Gemma 2's attention cap), with and without masks.
// The queries are twice the usual range so that the cap of 2.5 saturates. kTol holds: the
// measured worst is 1.5e-6 (uncapped or capped at 50: scores up to ~10, whose fp32 rounding the
// softmax amplifies; 5.8e-7 under the cap of 2.5, decoding 6.0e-7), tanh_f32's few ulp are lost
// in the scores' own rounding.
TEST(OpsConform, AttentionGemma) {
  struct Case {
    AttnShape s;
    Mask mask;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{2, 70, 70, 8, 2, 64, 0}, kNone, "tiles, GQA H/Hkv=4"},
      {{2, 70, 70, 8, 2, 64, 0}, kRightPad, "tiles, GQA H/Hkv=4, right padding"},
      {{2, 130, 130, 2, 1, 64, 0}, kRandom, "tiles, MQA H/Hkv=2, several key blocks"},
      {{1, 150, 150, 2, 2, 32, 0}, kLeftPad, "tiles, MHA (16 positions an item)"},
      {{1, 70, 200, 4, 4, 80, 130}, kLeftPad, "tiles, long cache q_offset=130, D=80"},
      {{1, 9, 30, 2, 1, 16, 21}, kNone, "a 16-row item and a 2-row item"},
      {{2, 1, 9, 4, 1, 64, 8}, kRightPad, "decode one token, MQA, right padding"},
      {{2, 2, 40, 4, 2, 16, 38}, kRandom, "decode two tokens, GQA"},
      {{3, 3, 100, 3, 3, 24, 97}, kLeftPad, "decode three tokens, MHA, 100 keys"},
  };
  for (const Case& c : cases) {
    const AttnShape& s = c.s;
    auto q = uniform(size_t(s.B * s.Tq * s.H * s.D), -4, 4, 53);
    auto k = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -2, 2, 54);
    auto v = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -1, 1, 55);
    const std::vector<uint8_t> mask = attention_mask(c.mask, s);
    for (int64_t window : {0, 1, 3, 5, 64, 100}) {
      for (float cap : {0.0f, 2.5f, 50.0f}) {
        conform(std::string("attention ") + c.what + " window=" + std::to_string(window) +
                    " softcap=" + std::to_string(cap),
                [&](Backend& be) { return run_attention(be, q, k, v, mask, s, window, cap); });
      }
    }
    // A window that reaches key 0 from the last query (q_offset + Tq keys) or beyond is no
    // window: the same bits as without one, on every backend. One key less changes the output.
    const int64_t reach = s.q_offset + s.Tq;
    for (auto& bc : all_backends()) {
      auto be = bc.make();
      for (float cap : {0.0f, 2.5f}) {
        const std::vector<float> plain = run_attention(*be, q, k, v, mask, s, 0, cap);
        for (int64_t window : {reach, reach + 1, int64_t(1) << 40})
          EXPECT_TRUE(bit_identical(plain, run_attention(*be, q, k, v, mask, s, window, cap)))
              << bc.label << " " << c.what << " window=" << window << " softcap=" << cap;
        if (c.mask == kNone) {
          EXPECT_FALSE(bit_identical(plain, run_attention(*be, q, k, v, mask, s, reach - 1, cap)))
              << bc.label << " " << c.what << " window=" << reach - 1 << " softcap=" << cap;
        }
      }
    }
  }
}

// Attention on bf16 inputs (a bf16 walk's, Backend::attention's t): q * scale, k, v and the
// probabilities rounded to bf16, products summed in fp32. Every fast backend against the
// reference's bf16 (its probabilities rounded from the row's overall maximum, the CPU's from the
// running one of its online softmax, so they differ by about a bf16 rounding of the largest
// probabilities: kAttnBf16, measured worst 1.5e-3), on both CPU kernel paths (16-row tiles
// with vdpbf16ps, rows one at a time), GQA, masks (a masked key's garbage value must not leak),
// odd D and Tk, windows and caps. The rounding is real: bf16 differs from fp32 by more than fp32's
// tolerance, and by no more than bf16's inputs explain (kAttnBf16VsFp32, measured worst 5.0e-3).
TEST(OpsConform, AttentionBf16) {
  struct Case {
    AttnShape s;
    Mask mask;
    int64_t window;
    float cap;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{1, 1, 1, 1, 1, 8, 0}, kNone, 0, 0.f, "T=1"},
      {{2, 13, 13, 4, 2, 64, 0}, kNone, 0, 0.f, "GQA H/Hkv=2"},
      {{2, 40, 40, 6, 2, 64, 0}, kRandom, 0, 0.f, "GQA H/Hkv=3: tiles end at odd keys"},
      {{1, 33, 33, 8, 2, 32, 0}, kRightPad, 0, 0.f, "GQA H/Hkv=4, right padding"},
      {{2, 130, 130, 2, 1, 64, 0}, kRandom, 0, 0.f, "several key and query blocks"},
      {{2, 21, 21, 2, 2, 5, 0}, kLeftPad, 0, 0.f, "left padding, odd D"},
      {{1, 70, 201, 4, 4, 80, 131}, kLeftPad, 0, 0.f, "long cache, odd Tk, D=80"},
      {{2, 1, 9, 4, 1, 64, 8}, kRightPad, 0, 0.f, "decode one token, MQA"},
      {{3, 3, 100, 3, 3, 24, 97}, kLeftPad, 0, 0.f, "decode three tokens, MHA"},
      {{2, 70, 70, 8, 2, 64, 0}, kNone, 5, 0.f, "window 5"},
      {{2, 70, 70, 8, 2, 64, 0}, kRandom, 64, 50.f, "window 64, cap 50"},
      {{2, 2, 40, 4, 2, 16, 38}, kRandom, 3, 2.5f, "decode two tokens, window 3, cap 2.5"},
  };
  double worst_ref = 0, worst_fp32 = 0;
  for (const Case& c : cases) {
    const AttnShape& s = c.s;
    auto q = uniform(size_t(s.B * s.Tq * s.H * s.D), -2, 2, 61);
    auto k = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -2, 2, 62);
    auto v = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -1, 1, 63);
    const std::vector<uint8_t> mask = attention_mask(c.mask, s);
    for (size_t i = 0; i < mask.size(); ++i)  // a padding slot's value is garbage
      if (!mask[i])
        for (int64_t h = 0; h < s.Hkv; ++h)
          for (int64_t d = 0; d < s.D; ++d) v[(i * s.Hkv + h) * s.D + d] = kNaN;
    auto ref = zof::make_reference_backend();
    const std::vector<float> want =
        run_attention(*ref, q, k, v, mask, s, c.window, c.cap, 0.f, zof::DType::BF16);
    const std::vector<float> fp32 = run_attention(*ref, q, k, v, mask, s, c.window, c.cap);
    for (auto& bc : fast_backends()) {
      auto be = bc.make();
      const std::vector<float> got =
          run_attention(*be, q, k, v, mask, s, c.window, c.cap, 0.f, zof::DType::BF16);
      EXPECT_TRUE(close(want, got, kAttnBf16)) << bc.label << ": " << c.what;
      EXPECT_TRUE(close(fp32, got, kAttnBf16VsFp32)) << bc.label << " against fp32: " << c.what;
      double e = 0, e32 = 0, sc = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        sc = std::max(sc, std::fabs(double(want[i])));
        e = std::max(e, std::fabs(double(got[i]) - want[i]));
        e32 = std::max(e32, std::fabs(double(got[i]) - fp32[i]));
      }
      worst_ref = std::max(worst_ref, e / std::max(sc, 1e-30));
      worst_fp32 = std::max(worst_fp32, e32 / std::max(sc, 1e-30));
      if (s.Tq > 1) {  // rounding happened: more than fp32's tolerance away from fp32
        EXPECT_FALSE(close(fp32, got, kTol)) << bc.label << ": " << c.what;
      }
    }
  }
  std::printf("worst bf16 against the bf16 reference %.3g, against fp32 %.3g\n", worst_ref,
              worst_fp32);
}

// Backend::attention_packed (a packed batch, Batch::starts): each sequence attends to its own
// keys only, and gets the bits of one attention() call on it alone, on every backend (the
// reference runs the default loop; the CPU backend one parallel region over every sequence's
// heads; the simulated device queues that on its stream, with its own copy of starts, which the
// caller may overwrite at once), in fp32 and bf16, with GQA and MQA (a thread goes from one
// sequence's kv head to the next sequence's same head), a window and a cap, on 1 and 2 threads;
// the CPU's values are the reference's within the ops' tolerances.
TEST(OpsConform, AttentionPackedIsEachSequenceAlone) {
  const std::vector<int32_t> lens = {1, 5, 17, 40, 3, 70, 2};
  std::vector<int32_t> starts = {0};
  for (int32_t n : lens) starts.push_back(starts.back() + n);
  const int64_t B = (int64_t)lens.size(), rows = starts.back(), D = 32;
  const float scale = 1.0f / std::sqrt(float(D));
  auto part = [](const std::vector<float>& x, int64_t r0, int64_t n, int64_t width) {
    return std::vector<float>(x.begin() + r0 * width, x.begin() + (r0 + n) * width);
  };
  for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{6, 2}, {4, 1}}) {
    const auto q = uniform(size_t(rows * H * D), -2, 2, 71);
    const auto k = uniform(size_t(rows * Hkv * D), -2, 2, 72);
    const auto v = uniform(size_t(rows * Hkv * D), -1, 1, 73);
    for (zof::DType t : {zof::DType::F32, zof::DType::BF16})
      for (auto [window, cap] : {std::pair<int64_t, float>{0, 0.f}, {5, 2.5f}}) {
        const std::string what = "H " + std::to_string(H) + " Hkv " + std::to_string(Hkv) + ", " +
                                 zof::dtype_name(t) + ", window " + std::to_string(window) +
                                 " cap " + std::to_string(cap);
        std::vector<float> ref_out;
        std::vector<BackendCase> backends = all_backends();
        backends.push_back({"sim(cpu 2 threads)", [] {
                              return zof::make_sim_device(zof::make_cpu_backend(2), {});
                            }});
        for (auto& bc : backends) {
          auto be = bc.make();
          Device dev(*be);
          float* out = dev.output(size_t(rows * H * D));
          std::vector<int32_t> st = starts;
          be->attention_packed(dev.put(q), dev.put(k), dev.put(v), out, st.data(), B, H, Hkv, D,
                               scale, window, cap, t);
          std::fill(st.begin(), st.end(), 0);  // the call's starts, reused before it runs
          const std::vector<float> got = dev.get(out, size_t(rows * H * D));
          for (int64_t b = 0; b < B; ++b) {
            const AttnShape s{1, lens[b], lens[b], H, Hkv, D, 0};
            const std::vector<float> alone =
                run_attention(*be, part(q, starts[b], lens[b], H * D),
                              part(k, starts[b], lens[b], Hkv * D),
                              part(v, starts[b], lens[b], Hkv * D), {}, s, window, cap, scale, t);
            EXPECT_EQ(part(got, starts[b], lens[b], H * D), alone)
                << bc.label << ", " << what << ": sequence " << b;
          }
          if (ref_out.empty())
            ref_out = got;  // the reference comes first
          else
            EXPECT_TRUE(close(ref_out, got, t == zof::DType::F32 ? kTol : kAttnBf16))
                << bc.label << ", " << what;
        }
      }
  }
}

// A window can leave a query no visible key where causality and the mask alone would not: the
// right-padded positions whose last `window` keys are all padding. They get zeros, not NaN, on
// both kernel paths, with and without a cap; without the window the same rows read real keys.
// The other rows meet kTol (measured 2.1e-7).
TEST(OpsConform, AttentionWindowPastPaddingGivesZeros) {
  const int64_t Tk = 40, pad_from = 26, window = 3;  // sequence 1: keys 26..39 are padding
  for (AttnShape s : {AttnShape{2, 40, 40, 4, 2, 32, 0}, AttnShape{2, 1, 40, 4, 1, 32, 39},
                      AttnShape{2, 3, 40, 2, 2, 32, 37}, AttnShape{2, 2, 40, 2, 1, 32, 38}}) {
    auto q = uniform(size_t(s.B * s.Tq * s.H * s.D), -2, 2, 56);
    auto k = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -2, 2, 57);
    auto v = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -1, 1, 58);
    std::vector<uint8_t> mask(size_t(s.B * Tk), 1);
    for (int64_t j = pad_from; j < Tk; ++j) mask[Tk + j] = 0;
    const std::string what = "Tq=" + std::to_string(s.Tq) + " H=" + std::to_string(s.H) +
                             " Hkv=" + std::to_string(s.Hkv);
    for (float cap : {0.0f, 2.5f}) {
      conform("attention window past padding " + what,
              [&](Backend& be) { return run_attention(be, q, k, v, mask, s, window, cap); });
      for (auto& bc : all_backends()) {
        auto be = bc.make();
        const std::vector<float> y = run_attention(*be, q, k, v, mask, s, window, cap);
        const std::vector<float> y0 = run_attention(*be, q, k, v, mask, s, 0, cap);
        for (int64_t i = 0; i < s.Tq; ++i) {
          const int64_t p = s.q_offset + i;
          const bool blind = p - window + 1 >= pad_from;  // every key of its window is padding
          const size_t o = size_t((s.Tq + i) * s.H * s.D), n = size_t(s.H * s.D);  // sequence 1
          size_t zeros = 0, zeros0 = 0;
          for (size_t e = o; e < o + n; ++e) {
            zeros += y[e] == 0.0f;
            zeros0 += y0[e] == 0.0f;
          }
          EXPECT_EQ(zeros, blind ? n : size_t(0)) << bc.label << " " << what << " position " << p;
          EXPECT_EQ(zeros0, size_t(0)) << bc.label << " " << what << " position " << p;
        }
      }
    }
  }
}

// GeGLU and softcap within kTol (measured worst 2.4e-7); mul_scalar exactly.
TEST(OpsConform, PointwiseGemma) {
  for (int64_t n : {1, 15, 1000, 4097, 70001}) {
    const std::string what = " n=" + std::to_string(n);
    auto x = uniform(size_t(n), -8, 8, 59), y = uniform(size_t(n), -3, 3, 60);
    // The tails: exp overflow and underflow inside the GELU must not make NaN.
    auto wide = uniform(size_t(n), -200, 200, 61);
    conform("gelu_tanh_mul" + what, [&](Backend& be) { return run_gelu_tanh_mul(be, x, y); });
    conform("gelu_tanh_mul wide" + what,
            [&](Backend& be) { return run_gelu_tanh_mul(be, wide, y); });
    for (float cap : {30.0f, 50.0f, 2.5f}) {
      conform("softcap " + std::to_string(cap) + what,
              [&](Backend& be) { return run_softcap(be, x, cap); });
      conform("softcap " + std::to_string(cap) + " wide" + what,
              [&](Backend& be) { return run_softcap(be, wide, cap); });
    }
    // One fp32 product per element: the same bits as the reference.
    auto ref = zof::make_reference_backend();
    for (float a : {48.0f, float(std::sqrt(2304.0)), 0.3f, -1.5f}) {
      const std::vector<float> want = run_mul_scalar(*ref, x, a);
      for (auto& c : fast_backends()) {
        auto be = c.make();
        EXPECT_TRUE(bit_identical(want, run_mul_scalar(*be, x, a)))
            << c.label << " mul_scalar" << what;
      }
    }
  }
}

// tanh_f32 (vec_math.h) through softcap, element by element against the reference's double tanh
// rounded to fp32: tiny |x / cap| (the odd series), dense on both sides of |x / cap| = 0.25 where
// tanh_f32 switches from the series to (1 - e^-2a) / (1 + e^-2a), across the curve, saturated,
// huge, negative, and Gemma 2's final cap of 30 over logits up to +-100. The error relative to
// each element (not to the largest) is measured at 2.85e-7 (3 ulp of 0.628 at |x / cap| = 0.257,
// just past the switch, where 1 - e with e = 0.6 loses bits to cancellation; 2.4e-7 for the cap of
// 30 over the logits); 5e-7 (4 to 8 ulp) leaves room for other CPUs and compilers and still fails
// a formula that is off by 1e-6 anywhere.
TEST(OpsConform, SoftcapTanhAccuracy) {
  constexpr double kTanhTol = 5e-7;
  for (float cap : {30.0f, 50.0f, 2.5f, 1.0f}) {
    std::vector<float> x;
    for (double r : {1e-30, 1e-12, 1e-6, 1e-3, 0.01, 0.1, 0.2, 0.249, 0.251, 0.3, 0.5, 1.0, 2.0,
                     5.0, 9.0, 10.0, 20.0, 50.0, 1e3, 1e10, 1e30})
      for (double sign : {1.0, -1.0}) x.push_back(float(sign * r * cap));
    // |x / cap| in [0.24, 0.26], and the 64 fp32 neighbours of x = 0.25 cap on each side.
    for (int i = 0; i <= 2000; ++i) {
      const float r = 0.24f + 0.02f * float(i) / 2000.0f;
      x.push_back(r * cap);
      x.push_back(-r * cap);
    }
    float up = 0.25f * cap, down = 0.25f * cap;
    for (int i = 0; i < 64; ++i) {
      x.push_back(up);
      x.push_back(-down);
      up = std::nextafter(up, 2 * cap);
      down = std::nextafter(down, 0.0f);
    }
    for (float r : uniform(20001, -4, 4, 62)) x.push_back(r * cap);
    for (float l : uniform(70001, -100, 100, 63)) x.push_back(l);  // logits: the cap of 30
    x.push_back(std::numeric_limits<float>::max());
    x.push_back(-std::numeric_limits<float>::max());
    x.push_back(0.0f);
    auto ref = zof::make_reference_backend();
    const std::vector<float> want = run_softcap(*ref, x, cap);
    for (auto& c : fast_backends()) {
      auto be = c.make();
      const std::vector<float> got = run_softcap(*be, x, cap);
      double worst = 0.0;
      size_t at = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << c.label << " softcap(" << x[i] << ") = " << got[i];
        if (want[i] == 0.0f) {
          EXPECT_EQ(got[i], 0.0f) << c.label << " x = " << x[i];
          continue;
        }
        const double e = std::fabs(double(got[i]) - double(want[i])) / std::fabs(double(want[i]));
        if (e > worst) worst = e, at = i;
      }
      EXPECT_LT(worst, kTanhTol) << c.label << " cap " << cap << " at x = " << x[at] << ": "
                                 << got[at] << " vs " << want[at];
    }
  }
}

TEST(OpsConform, Embedding) {
  const int64_t vocab = 50;
  for (int64_t n : {1, 9, 100}) {
    for (int64_t dim : {1, 33, 768}) {
      auto table = uniform(size_t(vocab * dim), -1, 1, 16);
      std::vector<int32_t> ids(static_cast<size_t>(n));
      std::mt19937 rng(17);
      for (auto& i : ids) i = int32_t(rng() % vocab);
      auto out0 = uniform(size_t(n * dim), -1, 1, 18);
      for (bool acc : {false, true})
        conform("embedding n=" + std::to_string(n) + " dim=" + std::to_string(dim),
                [&](Backend& be) { return run_embedding(be, ids, table, out0, dim, acc); });
    }
  }
}

TEST(OpsConform, CrossEntropy) {
  for (int64_t rows : {1, 4, 9}) {
    for (int64_t vocab : {1, 2, 17, 1000, 50257}) {
      auto logits = uniform(size_t(rows * vocab), -10, 10, 19);
      std::vector<int32_t> targets(static_cast<size_t>(rows));
      std::mt19937 rng(20);
      for (auto& t : targets) t = int32_t(rng() % vocab);
      if (rows > 1) targets[1] = -100;  // ignored
      conform("cross_entropy rows=" + std::to_string(rows) + " vocab=" + std::to_string(vocab),
              [&](Backend& be) { return run_cross_entropy(be, logits, targets, vocab); });
    }
  }
}

// The online softmax over vocabulary chunks (the ZO walk's LM head) equals the one-shot loss.
TEST(OpsConform, CrossEntropyChunked) {
  auto ref = zof::make_reference_backend();
  for (int64_t vocab : {1, 17, 1000, 50257}) {
    const int64_t rows = 6;
    auto logits = uniform(size_t(rows * vocab), -10, 10, 21);
    std::vector<int32_t> targets(static_cast<size_t>(rows));
    std::mt19937 rng(22);
    for (auto& t : targets) t = int32_t(rng() % vocab);
    targets[2] = -100;  // ignored
    targets[3] = int32_t(vocab - 1);
    const std::vector<float> want = run_cross_entropy(*ref, logits, targets, vocab);
    for (int64_t chunk : {int64_t(1), int64_t(64), int64_t(1000), vocab}) {
      std::vector<std::unique_ptr<Backend>> bes;
      bes.push_back(zof::make_reference_backend());
      for (auto& c : fast_backends()) bes.push_back(c.make());
      for (auto& be : bes) {
        Device dev(*be);
        std::vector<float> init(3 * rows, 0.f);
        for (int64_t r = 0; r < rows; ++r) init[r] = -std::numeric_limits<float>::infinity();
        float* st = dev.put(init);
        const int32_t* tg = dev.put(targets);
        for (int64_t v0 = 0; v0 < vocab; v0 += chunk) {
          const int64_t n = std::min(chunk, vocab - v0);
          std::vector<float> part(size_t(rows * n));
          for (int64_t r = 0; r < rows; ++r)
            std::copy_n(logits.begin() + r * vocab + v0, n, part.begin() + r * n);
          be->cross_entropy_chunk(dev.put(part), tg, rows, n, v0, st, st + rows, st + 2 * rows);
        }
        const std::vector<float> s = dev.get(st, 3 * size_t(rows));
        for (int64_t r = 0; r < rows; ++r) {
          const float nll = targets[r] < 0 ? 0.f : s[r] + std::log(s[rows + r]) - s[2 * rows + r];
          EXPECT_NEAR(nll, want[r], 2e-5 * std::max(1.f, std::fabs(want[r])))
              << be->name() << " vocab=" << vocab << " chunk=" << chunk << " row " << r;
        }
      }
    }
  }
}

// ---- aliasing: y == x for norms, out == gate or up for silu_mul --------------------------------

TEST(Ops, Aliasing) {
  const int64_t rows = 5, dim = 300;
  auto x = uniform(size_t(rows * dim), -2, 2, 21), w = uniform(size_t(dim), 0.5f, 1.5f, 22);
  auto b = uniform(size_t(dim), -1, 1, 23), up = uniform(size_t(rows * dim), -2, 2, 24);
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    {
      Device dev(*be);
      float* d = dev.put(x);
      be->rms_norm(d, dev.put(w), d, rows, dim, 1e-6f);
      EXPECT_TRUE(bit_identical(dev.get(d, x.size()), run_rms_norm(*be, x, w, rows, dim, 1e-6f)));
    }
    {
      Device dev(*be);
      float* d = dev.put(x);
      be->layer_norm(d, dev.put(w), dev.put(b), d, rows, dim, 1e-5f);
      EXPECT_TRUE(bit_identical(dev.get(d, x.size()), run_layer_norm(*be, x, w, b, rows, dim, 1e-5f)));
    }
    const auto want = run_silu_mul(*be, x, up);
    {
      Device dev(*be);
      float* g = dev.put(x);
      be->silu_mul(g, dev.put(up), g, int64_t(x.size()));
      EXPECT_TRUE(bit_identical(dev.get(g, x.size()), want)) << "out == gate";
    }
    {
      Device dev(*be);
      float* u = dev.put(up);
      be->silu_mul(dev.put(x), u, u, int64_t(x.size()));
      EXPECT_TRUE(bit_identical(dev.get(u, x.size()), want)) << "out == up";
    }
  }
}

// Gemma's ops in place: the norm with w_offset 1 (y == x), GeGLU (out == gate or up), softcap
// (y == x); the same bits as into a separate buffer.
TEST(Ops, AliasingGemma) {
  const int64_t rows = 5, dim = 300, n = rows * dim;
  auto x = uniform(size_t(n), -4, 4, 64), w = uniform(size_t(dim), -0.5f, 0.5f, 65);
  auto up = uniform(size_t(n), -2, 2, 66);
  for (auto& c : all_backends()) {
    SCOPED_TRACE(c.label);
    auto be = c.make();
    {
      Device dev(*be);
      float* d = dev.put(x);
      be->rms_norm(d, dev.put(w), d, rows, dim, 1e-6f, 1.0f);
      EXPECT_TRUE(
          bit_identical(dev.get(d, x.size()), run_rms_norm(*be, x, w, rows, dim, 1e-6f, 1.0f)));
    }
    const auto want = run_gelu_tanh_mul(*be, x, up);
    {
      Device dev(*be);
      float* g = dev.put(x);
      be->gelu_tanh_mul(g, dev.put(up), g, n);
      EXPECT_TRUE(bit_identical(dev.get(g, x.size()), want)) << "gelu_tanh_mul out == gate";
    }
    {
      Device dev(*be);
      float* u = dev.put(up);
      be->gelu_tanh_mul(dev.put(x), u, u, n);
      EXPECT_TRUE(bit_identical(dev.get(u, x.size()), want)) << "gelu_tanh_mul out == up";
    }
    {
      Device dev(*be);
      float* d = dev.put(x);
      be->softcap(d, d, 2.5f, n);
      EXPECT_TRUE(bit_identical(dev.get(d, x.size()), run_softcap(*be, x, 2.5f)))
          << "softcap y == x";
    }
  }
}

// ---- bf16 weights: the matrix product, the cast, the ZO pass's copies ---------------------------

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = zof::f32_to_bf16(x[i]);
  return b;
}

std::vector<float> run_matmul_bf16(Backend& be, const std::vector<float>& x,
                                   const std::vector<uint16_t>& w, const std::vector<float>& bias,
                                   int64_t M, int64_t N, int64_t K) {
  Device dev(be);
  float* y = dev.output(size_t(M * N));
  be.matmul(dev.put(x), dev.put(w), zof::DType::BF16, dev.put(bias), y, M, N, K);
  return dev.get(y, size_t(M * N));
}

// x is rounded to bf16 before the product: 1 + 2^-10 (between two bf16 values, nearer 1) times
// a bf16 1 is exactly 1, where an fp32 source would give 1.0009765625.
TEST(OpsHand, MatmulBf16RoundsTheSource) {
  for (auto& c : all_backends()) {
    auto be = c.make();
    const float x = 1.f + std::ldexp(1.f, -10);
    const std::vector<float> y = run_matmul_bf16(*be, {x, 2.f}, to_bf16({1.f, 0.5f}), {}, 1, 1, 2);
    EXPECT_EQ(y[0], 2.f) << c.label;
    const std::vector<float> yb = run_matmul_bf16(*be, {x, 2.f}, to_bf16({1.f, 0.5f}), {0.25f}, 1, 1, 2);
    EXPECT_EQ(yb[0], 2.25f) << c.label << " (fp32 bias)";
  }
}

TEST(OpsConform, MatmulBf16) {
  struct Shape {
    int64_t M, N, K;
  };
  // The CPU backend's blocks (cpu_matmul.cpp): 64 rows, the last padded (M=520: nine); on AVX2
  // N=1000 and 600 in column blocks (their weights, bias and output at an offset); where the
  // weights are laid out for brgemm kernels (AVX-512, AMX), N=4097 in two column blocks of 2049
  // and 2048 (33 and 32 strips of 64, the last of one column), written through a buffer.
  for (Shape s : {Shape{1, 1, 1}, Shape{2, 3, 5}, Shape{16, 16, 16}, Shape{33, 65, 127},
                  Shape{1, 300, 1000}, Shape{64, 48, 768}, Shape{3, 7, 0}, Shape{520, 40, 96},
                  Shape{5, 1000, 64}, Shape{300, 600, 40}, Shape{70, 4097, 40}}) {
    for (bool has_bias : {false, true}) {
      auto x = uniform(size_t(s.M * s.K), -1, 1, 41);
      auto w = to_bf16(uniform(size_t(s.N * s.K), -1, 1, 42));
      auto bias = has_bias ? uniform(size_t(s.N), -1, 1, 43) : std::vector<float>{};
      // The products of bf16 values are exact; only the fp32 sums' order differs.
      conform("bf16 matmul M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                  " K=" + std::to_string(s.K) + (has_bias ? " +bias" : ""),
              [&](Backend& be) { return run_matmul_bf16(be, x, w, bias, s.M, s.N, s.K); });
    }
  }
  // And it is a bf16 product: against fp32 weights and source, the error is bf16's (relative
  // rounding 2^-9 of each operand), far above fp32's and far below a wrong result.
  const int64_t M = 32, N = 64, K = 512;
  auto x = uniform(size_t(M * K), -1, 1, 44), w = uniform(size_t(N * K), -1, 1, 45);
  auto ref = zof::make_reference_backend();
  const std::vector<float> exact = run_matmul(*ref, x, w, {}, M, N, K);
  for (auto& c : all_backends()) {
    auto be = c.make();
    const std::vector<float> got = run_matmul_bf16(*be, x, to_bf16(w), {}, M, N, K);
    EXPECT_FALSE(close(exact, got, 1e-5)) << c.label << ": bf16 product as exact as fp32";
    EXPECT_TRUE(close(exact, got, 1e-2)) << c.label;
  }
}

TEST(Ops, CastMatchesTheScalarRounding) {
  std::vector<float> x = uniform(70001, -3, 3, 46);
  const float inf = std::numeric_limits<float>::infinity();
  // Ties (1 + 2^-8 is halfway between bf16 neighbours), NaN, infinities, subnormals, f16 overflow.
  for (float v : {1.f + std::ldexp(1.f, -8), 1.f + 3 * std::ldexp(1.f, -8), kNaN, inf, -inf,
                  std::ldexp(1.f, -140), -0.f, 70000.f, 65520.f, std::ldexp(1.f, -25)})
    x.push_back(v);
  for (auto& c : all_backends()) {
    auto be = c.make();
    for (zof::DType t : {zof::DType::BF16, zof::DType::F16}) {
      Device dev(*be);
      float* d = dev.put(x);
      auto* y = static_cast<uint16_t*>(be->alloc(x.size() * 2));
      be->cast(d, y, t, int64_t(x.size()));
      std::vector<uint16_t> got(x.size());
      be->copy_to_host(got.data(), y, got.size() * 2, nullptr);
      be->synchronize(nullptr);
      be->free(y);
      size_t bad = 0;
      for (size_t i = 0; i < x.size(); ++i)
        bad += got[i] != (t == zof::DType::BF16 ? zof::f32_to_bf16(x[i]) : zof::f32_to_f16(x[i]));
      EXPECT_EQ(bad, 0u) << c.label << " " << zof::dtype_name(t);
    }
  }
}

// The bf16 copies are the fp32 copies rounded to nearest even, bit for bit; theta's update is the
// same as with fp32 copies. With update terms, a sub-range, both signs and the Rademacher z.
TEST(Ops, ZoPassBf16CopiesAreTheFp32CopiesRounded) {
  const int64_t total = 5000, first = 133, n = 3001;
  const std::vector<float> theta0 = uniform(size_t(total), -0.1f, 0.1f, 47);
  std::vector<zof::ZOUpdateTerm> upd;
  for (int j = 0; j < 3; ++j) {
    zof::ZKey k{77, 4, uint32_t(j)};
    upd.push_back({k, 1e-3f * float(j + 1)});
  }
  for (uint32_t dist : {zof::kZGaussian, zof::kZRademacher}) {
    zof::ZKey cur{77, 5, 0};
    cur.dist = dist;
    for (auto& c : all_backends()) {
      auto be = c.make();
      Device dev(*be);
      float* th32 = dev.put(theta0);
      float* th16 = dev.put(theta0);
      float *p32 = dev.output(size_t(n)), *m32 = dev.output(size_t(n));
      auto* p16 = static_cast<uint16_t*>(be->alloc(size_t(n) * 2));
      auto* m16 = static_cast<uint16_t*>(be->alloc(size_t(n) * 2));
      be->zo_pass(th32 + first, n, 9, first, upd.data(), 3, 1e-4f, &cur, 1e-3f, p32, m32);
      be->zo_pass(th16 + first, n, 9, first, upd.data(), 3, 1e-4f, &cur, 1e-3f, p16, m16,
                  zof::DType::BF16);
      std::vector<uint16_t> hp(static_cast<size_t>(n)), hm(static_cast<size_t>(n));
      be->copy_to_host(hp.data(), p16, hp.size() * 2, nullptr);
      be->copy_to_host(hm.data(), m16, hm.size() * 2, nullptr);
      be->synchronize(nullptr);
      be->free(p16);
      be->free(m16);
      const std::vector<float> fp = dev.get(p32, size_t(n)), fm = dev.get(m32, size_t(n));
      size_t bad = 0, moved = 0;
      for (int64_t i = 0; i < n; ++i) {
        bad += hp[i] != zof::f32_to_bf16(fp[i]) || hm[i] != zof::f32_to_bf16(fm[i]);
        moved += hp[i] != hm[i];  // eps z survives the rounding in most entries
      }
      EXPECT_EQ(bad, 0u) << c.label;
      EXPECT_GT(moved, size_t(n) / 2) << c.label;
      EXPECT_TRUE(bit_identical(dev.get(th32, size_t(total)), dev.get(th16, size_t(total))))
          << c.label << ": the update does not depend on the copies' type";
    }
  }
}

// ---- the CPU backend's results do not depend on its thread count -------------------------------

TEST(Ops, CpuThreadCountIndependence) {
  auto one = zof::make_cpu_backend(1), two = zof::make_cpu_backend(2);
  auto same = [&](const std::string& what, const std::function<std::vector<float>(Backend&)>& run) {
    EXPECT_TRUE(bit_identical(run(*one), run(*two))) << what;
  };
  // Sizes above the backend's serial threshold, so the two-thread backend really splits them.
  const int64_t n = 100003, rows = 64, dim = 1000;
  auto x = uniform(size_t(n), -8, 8, 25), y = uniform(size_t(n), -2, 2, 26);
  auto w = uniform(size_t(dim), 0.5f, 1.5f, 27), b = uniform(size_t(dim), -1, 1, 28);
  auto xr = uniform(size_t(rows * dim), -2, 2, 29);
  same("silu_mul", [&](Backend& be) { return run_silu_mul(be, x, y); });
  same("gelu_tanh", [&](Backend& be) { return run_in_place(be, &Backend::gelu_tanh, x); });
  same("gelu_erf", [&](Backend& be) { return run_in_place(be, &Backend::gelu_erf, x); });
  same("relu", [&](Backend& be) { return run_in_place(be, &Backend::relu, x); });
  same("add", [&](Backend& be) { return run_add(be, y, x); });
  same("rms_norm", [&](Backend& be) { return run_rms_norm(be, xr, w, rows, dim, 1e-6f); });
  same("layer_norm", [&](Backend& be) { return run_layer_norm(be, xr, w, b, rows, dim, 1e-5f); });
  std::vector<int32_t> pos(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) pos[r] = int32_t(r * 37);
  same("rope", [&](Backend& be) { return run_rope(be, xr, pos, rows, 10, 100, 10000.0f); });
  AttnShape s{2, 100, 100, 4, 2, 64, 0};
  auto q = uniform(size_t(s.B * s.Tq * s.H * s.D), -2, 2, 30);
  auto k = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -2, 2, 31);
  auto v = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -1, 1, 32);
  same("attention", [&](Backend& be) { return run_attention(be, q, k, v, {}, s); });
  same("attention bf16", [&](Backend& be) {
    return run_attention(be, q, k, v, {}, s, 0, 0.f, 0.f, zof::DType::BF16);
  });
  std::vector<int32_t> ids(200), targets(16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7 % 50);
  auto table = uniform(50 * 768, -1, 1, 33);
  same("embedding", [&](Backend& be) { return run_embedding(be, ids, table, {}, 768, false); });
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = int32_t(i * 997 % 5000);
  auto logits = uniform(16 * 5000, -10, 10, 34);
  same("cross_entropy", [&](Backend& be) { return run_cross_entropy(be, logits, targets, 5000); });
  // The products run as blocks chosen from the shape alone, each on one thread (cpu_matmul.cpp):
  // oneDNN's own threads split K on some CPUs (its AVX2 kernels at M=7, K=1000 gave other bits
  // on 2 threads than on 1 when the whole product was its to split).
  struct Shape {
    int64_t M, N, K;
  };
  for (Shape sh : {Shape{128, 256, 512}, Shape{1, 2048, 4096}, Shape{7, 33, 1000}}) {
    auto a = uniform(size_t(sh.M * sh.K), -1, 1, 35), wm = uniform(size_t(sh.N * sh.K), -1, 1, 36);
    auto bias = uniform(size_t(sh.N), -1, 1, 37);
    same("matmul M=" + std::to_string(sh.M) + " N=" + std::to_string(sh.N) + " K=" + std::to_string(sh.K),
         [&](Backend& be) { return run_matmul(be, a, wm, bias, sh.M, sh.N, sh.K); });
    // The bf16 products too: data-parallel ranks run fewer threads than one process.
    same("bf16 matmul M=" + std::to_string(sh.M) + " N=" + std::to_string(sh.N) +
             " K=" + std::to_string(sh.K),
         [&](Backend& be) { return run_matmul_bf16(be, a, to_bf16(wm), bias, sh.M, sh.N, sh.K); });
  }
}

// The bf16 products on 1, 2, 3 and 8 threads: the same bits. The CPU backend runs them as
// blocks of rows and columns on single-threaded primitives, the blocks chosen from the shape
// alone (cpu_matmul.cpp): oneDNN's AMX kernels sum in an order that depends on the shape they
// are given and on the threads they split K over, so neither may follow the thread count
// (this test failed on an AMX machine when the row blocks did).
// And bf16 attention where a thread's items of a kv head end at odd keys (H/Hkv = 3).
TEST(Ops, CpuThreadCountIndependenceBf16Blocks) {
  std::vector<std::pair<int, std::unique_ptr<Backend>>> bes;
  for (int t : {1, 2, 3, 8}) bes.emplace_back(t, zof::make_cpu_backend(t));
  auto same = [&](const std::string& what, const std::function<std::vector<float>(Backend&)>& run) {
    const std::vector<float> want = run(*bes[0].second);
    for (size_t i = 1; i < bes.size(); ++i)
      EXPECT_TRUE(bit_identical(want, run(*bes[i].second)))
          << what << ", " << bes[i].first << " threads";
  };
  const int64_t M = 1000, N = 96, K = 200;
  auto x = uniform(size_t(M * K), -1, 1, 75), w = uniform(size_t(N * K), -1, 1, 76);
  auto bias = uniform(size_t(N), -1, 1, 77);
  same("bf16 matmul M=1000",
       [&](Backend& be) { return run_matmul_bf16(be, x, to_bf16(w), bias, M, N, K); });
  same("bf16 matmul M=1000, no bias",
       [&](Backend& be) { return run_matmul_bf16(be, x, to_bf16(w), {}, M, N, K); });
  // A deep product (K past oneDNN's K blocking) and a wide one, as real models' MLPs are.
  const int64_t M2 = 600, N2 = 200, K2 = 2304;
  auto x2 = uniform(size_t(M2 * K2), -1, 1, 81), w2 = uniform(size_t(N2 * K2), -1, 1, 82);
  same("bf16 matmul M=600 N=200 K=2304",
       [&](Backend& be) { return run_matmul_bf16(be, x2, to_bf16(w2), {}, M2, N2, K2); });
  same("bf16 matmul M=600 N=2304 K=200",
       [&](Backend& be) { return run_matmul_bf16(be, x2, to_bf16(w2), {}, M2, K2, N2); });
  AttnShape s{3, 50, 50, 9, 3, 64, 0};
  auto q = uniform(size_t(s.B * s.Tq * s.H * s.D), -2, 2, 78);
  auto k = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -2, 2, 79);
  auto v = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -1, 1, 80);
  same("attention bf16 H/Hkv=3", [&](Backend& be) {
    return run_attention(be, q, k, v, {}, s, 0, 0.f, 0.f, zof::DType::BF16);
  });
}

#if ZOF_WITH_DNNL
// The CPU matmul lays its weights out itself for oneDNN's brgemm kernels (cpu_matmul.cpp,
// lay_out_strip): bf16 as BA16a64b2a, fp32 as BA16a64b. Both its versions (AVX-512 and the
// portable loops) must write the bytes oneDNN's own reorder writes, padding included, on shapes
// with a short last strip, K past and short of a block, a lone column and a lone K. oneDNN's
// reorder runs on any CPU, so this holds on every machine, whatever its kernels read.
TEST(Ops, CpuMatmulLaysOutWeightsAsOneDnnReorders) {
  using tag = dnnl::memory::format_tag;
#if defined(__AVX512F__) && defined(__AVX512BW__)  // as src/cpu/cpu_matmul.cpp is built
  constexpr bool kVectorBuild = true;
#else
  constexpr bool kVectorBuild = false;
#endif
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::mt19937 rng(91);
  struct Shape {
    int64_t cols, K;
  };
  for (zof::DType t : {zof::DType::BF16, zof::DType::F32}) {
    const bool bf = t == zof::DType::BF16;
    const size_t es = bf ? 2 : 4;
    const int64_t D = bf ? 32 : 16;
    for (Shape sh : {Shape{100, 70}, Shape{64, 32}, Shape{192, 576}, Shape{1, 1}, Shape{130, 17},
                     Shape{65, 33}, Shape{256, 1536}}) {
      // Every bit pattern but NaNs' (a reorder may quiet them): random halves of fp32 values.
      std::vector<uint32_t> w(size_t(sh.cols * sh.K) * es / 4 + 1);
      for (auto& v : w) v = rng() & 0xbfffbfffu;
      const dnnl::memory::desc plain({sh.K, sh.cols}, bf ? dnnl::memory::data_type::bf16
                                                        : dnnl::memory::data_type::f32,
                                     dnnl::memory::dims{1, sh.K});
      const dnnl::memory::desc laid({sh.K, sh.cols}, plain.data_type(),
                                    bf ? tag::BA16a64b2a : tag::BA16a64b);
      dnnl::memory from(plain, engine, w.data()), to(laid, engine);
      std::memset(to.get_data_handle(), 0x5a, laid.get_size());
      dnnl::reorder(from, to).execute(stream, from, to);
      stream.wait();
      const int64_t strips = (sh.cols + 63) / 64;
      const size_t strip_bytes = size_t((sh.K + D - 1) / D * D * 64) * es;
      ASSERT_EQ(laid.get_size(), size_t(strips) * strip_bytes);
      for (bool portable : {false, true}) {
        std::vector<char> mine(laid.get_size(), 0x3c);
        for (int64_t st = 0; st < strips; ++st)
          zof::cpu::lay_out_strip(w.data(), t, sh.cols, sh.K, st,
                                  mine.data() + size_t(st) * strip_bytes, portable);
        EXPECT_EQ(0, std::memcmp(mine.data(), to.get_data_handle(), mine.size()))
            << (bf ? "bf16" : "fp32") << " cols=" << sh.cols << " K=" << sh.K
            << (portable ? " portable" : kVectorBuild ? " AVX-512" : " (no AVX-512 build)");
      }
    }
  }
}

// Weights too large to lay out (Matmul's bound) go to the same dense blocks plain, and oneDNN's
// kernels copy them into the layout zof would have written: the same bits, so the bound (a
// matter of memory) never changes a result. On AVX2 both are the plain path.
TEST(Ops, CpuMatmulLaidOutWeightsGiveThePlainWeightsBits) {
  struct Shape {
    int64_t M, N, K;
  };
  for (int threads : {1, 2})
    for (Shape sh : {Shape{200, 4097, 40}, Shape{130, 576, 576}, Shape{65, 100, 33}}) {
      zof::cpu::Matmul laid(threads), plain(threads, 0);
      auto x = uniform(size_t(sh.M * sh.K), -1, 1, 92);
      auto w = uniform(size_t(sh.N * sh.K), -1, 1, 93), bias = uniform(size_t(sh.N), -1, 1, 94);
      const std::vector<uint16_t> wb = to_bf16(w);
      for (zof::DType t : {zof::DType::BF16, zof::DType::F32}) {
        const void* wt = t == zof::DType::BF16 ? (const void*)wb.data() : (const void*)w.data();
        std::vector<float> a(size_t(sh.M * sh.N)), b(a.size());
        laid.run(x.data(), wt, t, bias.data(), a.data(), sh.M, sh.N, sh.K);
        plain.run(x.data(), wt, t, bias.data(), b.data(), sh.M, sh.N, sh.K);
        EXPECT_TRUE(bit_identical(a, b)) << zof::dtype_name(t) << " M=" << sh.M << " N=" << sh.N
                                         << " K=" << sh.K << ", " << threads << " threads";
      }
    }
}
#endif

// Gemma's ops on 1, 2, 3 and 8 threads: the same bits. Every attention item (up to 16 rows of
// one kv head) and every elementwise block runs on one thread, whatever the schedule.
TEST(Ops, CpuThreadCountIndependenceGemma) {
  std::vector<std::pair<int, std::unique_ptr<Backend>>> bes;
  for (int t : {1, 2, 3, 8}) bes.emplace_back(t, zof::make_cpu_backend(t));
  auto same = [&](const std::string& what, const std::function<std::vector<float>(Backend&)>& run) {
    const std::vector<float> want = run(*bes[0].second);
    for (size_t i = 1; i < bes.size(); ++i)
      EXPECT_TRUE(bit_identical(want, run(*bes[i].second)))
          << what << ", " << bes[i].first << " threads";
  };
  // Sizes above the backend's serial threshold, so the backends really split them.
  const int64_t n = 100003, rows = 64, dim = 1000;
  auto x = uniform(size_t(n), -8, 8, 67), y = uniform(size_t(n), -2, 2, 68);
  auto logits = uniform(size_t(n), -100, 100, 69);
  auto w = uniform(size_t(dim), -0.5f, 0.5f, 70), xr = uniform(size_t(rows * dim), -2, 2, 71);
  same("gelu_tanh_mul", [&](Backend& be) { return run_gelu_tanh_mul(be, x, y); });
  same("softcap 30", [&](Backend& be) { return run_softcap(be, logits, 30.0f); });
  same("mul_scalar", [&](Backend& be) { return run_mul_scalar(be, x, 48.0f); });
  same("rms_norm w_offset=1",
       [&](Backend& be) { return run_rms_norm(be, xr, w, rows, dim, 1e-6f, 1.0f); });
  // The tiled path (70 positions, 4 query heads per kv head) and decoding (one row at a time).
  for (AttnShape s : {AttnShape{2, 70, 70, 8, 2, 64, 0}, AttnShape{4, 1, 300, 8, 2, 64, 299}}) {
    auto q = uniform(size_t(s.B * s.Tq * s.H * s.D), -4, 4, 72);
    auto k = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -2, 2, 73);
    auto v = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -1, 1, 74);
    const std::vector<uint8_t> mask = attention_mask(kRightPad, s);
    for (int64_t window : {0, 5, 100})
      for (float cap : {0.0f, 50.0f})
        same("attention Tq=" + std::to_string(s.Tq) + " window=" + std::to_string(window) +
                 " softcap=" + std::to_string(cap),
             [&](Backend& be) { return run_attention(be, q, k, v, mask, s, window, cap); });
  }
}

}  // namespace
