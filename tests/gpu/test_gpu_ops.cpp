// Op conformance on the GPU: every op of the CUDA backend against the scalar reference backend on
// the shapes of tests/unit/test_ops.cpp (fp32: relative error under 1e-5, never a NaN), the
// hand-computed cases, aliasing, run-to-run determinism, memory and streams; a bf16 walk's
// attention (Backend::attention, DType::BF16) against the reference's (1e-2); z and the ZO
// update bit for bit against
// the host implementation; the tangent (JVP) kernels against the host loops.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <random>

#include "gpu/gpu_test.h"
#include "cpu/cpu_zo.h"
#include "zof/backend.h"
#include "zof/config.h"
#include "cuda/cuda_backend.h"
#include "zof/error.h"
#include "util/philox.h"

namespace {

using zof::Backend;
using zof::gpu_test::close;
using zof::gpu_test::uniform;

constexpr double kTol = 1e-5;     // fp32 against the double reference
constexpr double kTolBf16 = 1e-2;  // bf16 storage (8 bits of mantissa), fp32 math
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::unique_ptr<zof::CudaBackend> gpu() { return zof::make_cuda_backend(0); }

// Device buffers of one backend, freed together; outputs start as NaN.
class Device {
 public:
  explicit Device(Backend& be) : be_(be) {}
  ~Device() {
    be_.synchronize(nullptr);
    for (void* p : ptrs_) be_.free(p);
  }
  template <class T>
  T* put(const std::vector<T>& host) {
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

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- fp32 runs: host in, host out -----------------------------------------------------------

std::vector<float> run_matmul(Backend& be, const std::vector<float>& x, const std::vector<float>& w,
                              const std::vector<float>& bias, int64_t M, int64_t N, int64_t K) {
  Device dev(be);
  float* y = dev.output(size_t(M * N));
  be.matmul(dev.put(x), dev.put(w), dev.put(bias), y, M, N, K);
  return dev.get(y, size_t(M * N));
}
std::vector<float> run_rms_norm(Backend& be, const std::vector<float>& x, const std::vector<float>& w,
                                int64_t rows, int64_t dim, float eps) {
  Device dev(be);
  float* y = dev.output(x.size());
  be.rms_norm(dev.put(x), dev.put(w), y, rows, dim, eps);
  return dev.get(y, x.size());
}
// Gemma's RMSNorm: the weight is w + w_offset.
std::vector<float> run_rms_norm_offset(Backend& be, const std::vector<float>& x,
                                       const std::vector<float>& w, int64_t rows, int64_t dim,
                                       float eps, float w_offset) {
  Device dev(be);
  float* y = dev.output(x.size());
  be.rms_norm(dev.put(x), dev.put(w), y, rows, dim, eps, w_offset);
  return dev.get(y, x.size());
}
std::vector<float> run_layer_norm(Backend& be, const std::vector<float>& x, const std::vector<float>& w,
                                  const std::vector<float>& b, int64_t rows, int64_t dim, float eps) {
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
std::vector<float> run_attention(Backend& be, const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, const std::vector<uint8_t>& mask,
                                 const AttnShape& s) {
  Device dev(be);
  const size_t n = size_t(s.B * s.Tq * s.H * s.D);
  float* out = dev.output(n);
  be.attention(dev.put(q), dev.put(k), dev.put(v), out, dev.put(mask), s.B, s.Tq, s.Tk, s.H, s.Hkv,
               s.D, s.q_offset, 1.0f / std::sqrt(float(s.D)));
  return dev.get(out, n);
}
// Gemma's variants: a sliding window (0: none) and soft-capped scores (0: none); scale
// 1/sqrt(D) unless given.
std::vector<float> run_attention_gemma(Backend& be, const std::vector<float>& q,
                                       const std::vector<float>& k, const std::vector<float>& v,
                                       const std::vector<uint8_t>& mask, const AttnShape& s,
                                       int64_t window, float softcap, float scale = 0.0f) {
  Device dev(be);
  const size_t n = size_t(s.B * s.Tq * s.H * s.D);
  float* out = dev.output(n);
  be.attention(dev.put(q), dev.put(k), dev.put(v), out, dev.put(mask), s.B, s.Tq, s.Tk, s.H, s.Hkv,
               s.D, s.q_offset, scale > 0.0f ? scale : 1.0f / std::sqrt(float(s.D)), window,
               softcap);
  return dev.get(out, n);
}
std::vector<float> run_silu_mul(Backend& be, const std::vector<float>& gate, const std::vector<float>& up) {
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
std::vector<float> run_embedding(Backend& be, const std::vector<int32_t>& ids, const std::vector<float>& table,
                                 const std::vector<float>& out0, int64_t dim, bool accumulate) {
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

// The reference against the GPU, and the GPU against itself (a second run is bit-identical).
void conform(const std::string& what, const std::function<std::vector<float>(Backend&)>& run,
             double tol = kTol) {
  auto ref = zof::make_reference_backend();
  auto be = gpu();
  const std::vector<float> want = run(*ref), got = run(*be);
  EXPECT_TRUE(close(want, got, tol)) << what;
  EXPECT_TRUE(bit_identical(got, run(*be))) << what << ": two runs differ";
}

// ---- memory and streams --------------------------------------------------------------------------

TEST(GpuOps, MemoryAndStreams) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  EXPECT_EQ(be->name(), "cuda:0");
  EXPECT_GT(be->free_memory(), size_t(1) << 30);
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(100000)}) {
    void* d = be->alloc(bytes);
    void* h = be->alloc_host_pinned(bytes);
    ASSERT_NE(d, nullptr);
    ASSERT_NE(h, nullptr);
    be->free(d);
    be->free_host_pinned(h);
  }
  // Two streams ordered by an event: upload on one, copy and download on the other.
  const size_t n = size_t(1) << 22;
  zof::Stream* s1 = be->create_stream();
  zof::Stream* s2 = be->create_stream();
  zof::Event* e = be->create_event();
  auto src = uniform(n, -1, 1, 1);
  float* h_in = static_cast<float*>(be->alloc_host_pinned(n * 4));
  float* h_out = static_cast<float*>(be->alloc_host_pinned(n * 4));
  std::memcpy(h_in, src.data(), n * 4);
  float* d1 = static_cast<float*>(be->alloc(n * 4));
  float* d2 = static_cast<float*>(be->alloc(n * 4));
  be->copy_to_device(d1, h_in, n * 4, s1);
  be->record(e, s1);
  be->wait(s2, e);
  be->copy_device(d2, d1, n * 4, s2);
  be->copy_to_host(h_out, d2, n * 4, s2);
  be->synchronize(s2);
  EXPECT_EQ(0, std::memcmp(h_out, src.data(), n * 4));
  // Ops on a non-default stream.
  std::vector<float> ones(n, 1.0f);
  be->copy_to_device(d2, ones.data(), n * 4, s1);
  be->add(d2, d1, int64_t(n), s1);
  be->copy_to_host(h_out, d2, n * 4, s1);
  be->synchronize(s1);
  for (size_t i = 0; i < n; i += 4097) ASSERT_EQ(h_out[i], src[i] + 1.0f);
  be->free(d1);
  be->free(d2);
  be->free_host_pinned(h_in);
  be->free_host_pinned(h_out);
}

TEST(GpuOps, OutOfMemoryIsAnError) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  EXPECT_THROW(be->alloc(size_t(1) << 50), zof::Error);
  void* p = be->alloc(1024);  // still usable afterwards
  be->free(p);
  EXPECT_THROW(zof::make_cuda_backend(zof::cuda_device_count()), zof::Error);
  const zof::CudaDeviceInfo info = zof::cuda_device_info(0);
  EXPECT_GE(info.cc_major, 8);
  EXPECT_GT(info.bf16_dense_tflops, 0.0);
}

// ---- hand-computed values -------------------------------------------------------------------------

TEST(GpuOpsHand, MatmulNormsRope) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  EXPECT_EQ(run_matmul(*be, {1, 2, 3, 4}, {5, 6, 7, 8}, {0.5f, -1.0f}, 2, 2, 2),
            (std::vector<float>{17.5f, 22.0f, 39.5f, 52.0f}));
  EXPECT_EQ(run_matmul(*be, {1, 2, 3, 4}, {5, 6, 7, 8}, {}, 2, 2, 2),
            (std::vector<float>{17.0f, 23.0f, 39.0f, 53.0f}));
  EXPECT_EQ(run_matmul(*be, {}, {}, {1.0f, 2.0f}, 2, 2, 0), (std::vector<float>{1, 2, 1, 2}));
  EXPECT_TRUE(close({float(3 / std::sqrt(12.5)), float(8 / std::sqrt(12.5))},
                    run_rms_norm(*be, {3, 4}, {1, 2}, 1, 2, 0.0f), 1e-6));
  EXPECT_TRUE(close({-1.0f, 11.0f}, run_layer_norm(*be, {1, 3}, {1, 1}, {0, 10}, 1, 2, 0.0f), 1e-6));
  const std::vector<float> x = {1, 2, 3, 4, -1, 0.5f, 2, -3};
  EXPECT_EQ(run_rope(*be, x, {0, 0}, 2, 1, 4, 100.0f), x);
}

TEST(GpuOpsHand, Attention) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  AttnShape one{1, 1, 1, 1, 1, 3, 0};
  EXPECT_EQ(run_attention(*be, {5, -2, 1}, {0.3f, 7, -1}, {1, 2, 3}, {}, one), (std::vector<float>{1, 2, 3}));
  AttnShape row{1, 1, 3, 1, 1, 1, 2};
  EXPECT_TRUE(close({14.0f}, run_attention(*be, {1}, {0, float(std::log(2.0)), float(std::log(3.0))},
                                           {6, 12, 18}, {}, row), 1e-6));
  AttnShape causal{1, 2, 2, 1, 1, 2, 0};
  EXPECT_EQ(run_attention(*be, {1, 1, 1, 1}, {1, 1, 1, 1}, {10, 20, 30, 40}, {0, 1}, causal),
            (std::vector<float>{0, 0, 30, 40}));
  EXPECT_TRUE(close({10, 20, 20, 30}, run_attention(*be, {1, 1, 1, 1}, {1, 1, 1, 1}, {10, 20, 30, 40}, {}, causal), 1e-6));
}

TEST(GpuOpsHand, PointwiseAndLoss) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  EXPECT_EQ(run_in_place(*be, &Backend::relu, {-1, 2, 0}), (std::vector<float>{0, 2, 0}));
  EXPECT_TRUE(std::isnan(run_in_place(*be, &Backend::relu, {kNaN})[0]));
  EXPECT_EQ(run_add(*be, {1, 2}, {10, 20}), (std::vector<float>{11, 22}));
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};
  EXPECT_EQ(run_embedding(*be, {2, 0, 2}, table, {}, 2, false), (std::vector<float>{20, 21, 0, 1, 20, 21}));
  EXPECT_EQ(run_embedding(*be, {1}, table, {5, 6}, 2, true), (std::vector<float>{15, 17}));
  const int64_t V = 1000;
  auto nll = run_cross_entropy(*be, std::vector<float>(3 * V, 2.5f), {0, -100, int32_t(V - 1)}, V);
  EXPECT_TRUE(close({float(std::log(double(V))), 0.0f, float(std::log(double(V)))}, nll, 1e-6));
  EXPECT_EQ(nll[1], 0.0f);
  nll = run_cross_entropy(*be, {0, float(std::log(2.0)), float(std::log(3.0)), 1000, -1000, 0}, {2, 1}, 3);
  EXPECT_TRUE(close({float(std::log(2.0)), 2000.0f}, nll, 1e-6));
}

// Gemma's variants by hand: RMSNorm's offset weight, the sliding window (prefill and decode),
// soft-capped scores, GeGLU, the scalar multiply and the softcap op.
TEST(GpuOpsHand, GemmaVariants) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  // w + 1 = {1, 2}.
  EXPECT_TRUE(close({float(3 / std::sqrt(12.5)), float(8 / std::sqrt(12.5))},
                    run_rms_norm_offset(*be, {3, 4}, {0, 1}, 1, 2, 0.0f, 1.0f), 1e-6));
  // Equal scores: window 1 gives each query its own value, window 2 the mean of two.
  const AttnShape causal{1, 3, 3, 1, 1, 2, 0};
  const std::vector<float> ones(6, 1.0f), v = {10, 20, 30, 40, 50, 60};
  EXPECT_EQ(run_attention_gemma(*be, ones, ones, v, {}, causal, 1, 0.0f), v);
  EXPECT_TRUE(close({10, 20, 20, 30, 40, 50},
                    run_attention_gemma(*be, ones, ones, v, {}, causal, 2, 0.0f), 1e-6));
  // Decode at position 3 with window 2: keys 2 and 3; with key 3 masked, key 2 alone.
  const AttnShape decode{1, 1, 4, 1, 1, 1, 3};
  EXPECT_TRUE(close({3.5f}, run_attention_gemma(*be, {1}, {0, 0, 0, 0}, {1, 2, 3, 4}, {}, decode,
                                                2, 0.0f), 1e-6));
  EXPECT_TRUE(close({3.0f}, run_attention_gemma(*be, {1}, {0, 0, 0, 0}, {1, 2, 3, 4},
                                                {1, 1, 1, 0}, decode, 2, 0.0f), 1e-6));
  // Softcap 1 on the scores {0, 2} (scale 1): weights of 0 and tanh(2).
  const AttnShape row{1, 1, 2, 1, 1, 1, 1};
  const double e = std::exp(std::tanh(2.0));
  EXPECT_TRUE(close({float((6.0 + 12.0 * e) / (1.0 + e))},
                    run_attention_gemma(*be, {1}, {0, 2}, {6, 12}, {}, row, 0, 1.0f, 1.0f), 1e-6));
  // GeGLU: gelu_tanh(0) = 0, gelu_tanh(1000) = 1000, gelu_tanh(-1000) = -0.
  EXPECT_EQ(run_gelu_tanh_mul(*be, {0, 1000, -1000}, {5, 2, 3}), (std::vector<float>{0, 2000, 0}));
  EXPECT_EQ(run_mul_scalar(*be, {1, 2, -3, 0}, 2.5f), (std::vector<float>{2.5f, 5, -7.5f, 0}));
  EXPECT_TRUE(close({0, 30, -30, float(30 * std::tanh(0.1))},
                    run_softcap(*be, {0, 1000, -1000, 3}, 30.0f), 1e-6));
}

// ---- random inputs against the reference (the shapes of tests/unit/test_ops.cpp, and larger) -----

TEST(GpuOpsConform, Matmul) {
  ZOF_REQUIRE_GPU();
  struct Shape {
    int64_t M, N, K;
  };
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 17, 33}, Shape{2, 3, 5}, Shape{7, 5, 3}, Shape{16, 16, 16},
                  Shape{33, 65, 127}, Shape{1, 300, 1000}, Shape{64, 48, 768}, Shape{100, 130, 70},
                  Shape{3, 7, 0}, Shape{257, 1031, 2048}}) {
    for (bool has_bias : {false, true}) {
      auto x = uniform(size_t(s.M * s.K), -1, 1, 1), w = uniform(size_t(s.N * s.K), -1, 1, 2);
      auto bias = has_bias ? uniform(size_t(s.N), -1, 1, 3) : std::vector<float>{};
      conform("matmul M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" +
                  std::to_string(s.K) + (has_bias ? " +bias" : ""),
              [&](Backend& be) { return run_matmul(be, x, w, bias, s.M, s.N, s.K); });
    }
  }
  // A weight slice at a 4-byte offset (GPT-2's fused qkv rows), which restricts cuBLASLt.
  auto x = uniform(10 * 33, -1, 1, 4), w = uniform(3 * 33 * 33 + 1, -1, 1, 5);
  std::vector<float> w_slice(w.begin() + 1, w.begin() + 1 + 33 * 33);
  auto ref = zof::make_reference_backend();
  auto want = run_matmul(*ref, x, w_slice, {}, 10, 33, 33);
  auto be = gpu();
  Device dev(*be);
  float* y = dev.output(330);
  be->matmul(dev.put(x), dev.put(w) + 1, nullptr, y, 10, 33, 33);
  EXPECT_TRUE(close(want, dev.get(y, 330), kTol)) << "unaligned weight";
}

TEST(GpuOpsConform, Norms) {
  ZOF_REQUIRE_GPU();
  for (int64_t rows : {1, 3, 17, 300}) {
    for (int64_t dim : {1, 7, 64, 768, 1001, 5120}) {
      const std::string what = " rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
      auto x = uniform(size_t(rows * dim), -2, 2, 4);
      auto shifted = x;
      for (auto& a : shifted) a += 30.0f;
      auto w = uniform(size_t(dim), 0.5f, 1.5f, 5), b = uniform(size_t(dim), -1, 1, 6);
      conform("rms_norm" + what, [&](Backend& be) { return run_rms_norm(be, x, w, rows, dim, 1e-6f); });
      conform("layer_norm" + what, [&](Backend& be) { return run_layer_norm(be, x, w, b, rows, dim, 1e-5f); });
      conform("layer_norm shifted" + what,
              [&](Backend& be) { return run_layer_norm(be, shifted, w, b, rows, dim, 1e-5f); });
    }
  }
}

TEST(GpuOpsConform, Rope) {
  ZOF_REQUIRE_GPU();
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
                      " head_dim=" + std::to_string(head_dim),
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
struct AttnCase {
  AttnShape s;
  Mask mask;
  const char* what;
};
const std::vector<AttnCase>& attention_cases() {
  static const std::vector<AttnCase> cases = {
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
      {{1, 300, 300, 8, 2, 128, 0}, kRightPad, "D=128, GQA, 5 key blocks"},
      {{1, 40, 40, 2, 1, 256, 0}, kNone, "D=256 (opt-in shared memory)"},
  };
  return cases;
}
void attention_inputs(const AttnCase& c, std::vector<float>& q, std::vector<float>& k,
                      std::vector<float>& v, std::vector<uint8_t>& mask) {
  const AttnShape& s = c.s;
  q = uniform(size_t(s.B * s.Tq * s.H * s.D), -2, 2, 9);
  k = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -2, 2, 10);
  v = uniform(size_t(s.B * s.Tk * s.Hkv * s.D), -1, 1, 11);
  mask.clear();
  if (c.mask == kNone) return;
  mask.assign(size_t(s.B * s.Tk), 1);
  std::mt19937 rng(12);
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t pad = b % 2 == 1 ? s.Tk / 3 + 1 : 0;
    for (int64_t j = 0; j < s.Tk; ++j) {
      if (c.mask == kRightPad && j >= s.Tk - pad) mask[b * s.Tk + j] = 0;
      if (c.mask == kLeftPad && j < pad) mask[b * s.Tk + j] = 0;
      if (c.mask == kRandom && rng() % 4 == 0) mask[b * s.Tk + j] = 0;
    }
  }
}

TEST(GpuOpsConform, Attention) {
  ZOF_REQUIRE_GPU();
  for (const AttnCase& c : attention_cases()) {
    std::vector<float> q, k, v;
    std::vector<uint8_t> mask;
    attention_inputs(c, q, k, v, mask);
    conform(std::string("attention ") + c.what,
            [&](Backend& be) { return run_attention(be, q, k, v, mask, c.s); });
  }
}

TEST(GpuOpsConform, PointwiseEmbeddingLoss) {
  ZOF_REQUIRE_GPU();
  for (int64_t n : {1, 15, 1000, 4097, 70001, 1 << 22}) {
    const std::string what = " n=" + std::to_string(n);
    auto x = uniform(size_t(n), -8, 8, 13), y = uniform(size_t(n), -3, 3, 14);
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
  for (int64_t rows : {1, 4, 9}) {
    for (int64_t V : {1, 2, 17, 1000, 50257, 152064}) {
      auto logits = uniform(size_t(rows * V), -10, 10, 19);
      std::vector<int32_t> targets(static_cast<size_t>(rows));
      std::mt19937 rng(20);
      for (auto& t : targets) t = int32_t(rng() % V);
      if (rows > 1) targets[1] = -100;
      conform("cross_entropy rows=" + std::to_string(rows) + " vocab=" + std::to_string(V),
              [&](Backend& be) { return run_cross_entropy(be, logits, targets, V); });
    }
  }
}

TEST(GpuOps, Aliasing) {
  ZOF_REQUIRE_GPU();
  const int64_t rows = 5, dim = 300;
  auto x = uniform(size_t(rows * dim), -2, 2, 21), w = uniform(size_t(dim), 0.5f, 1.5f, 22);
  auto b = uniform(size_t(dim), -1, 1, 23), up = uniform(size_t(rows * dim), -2, 2, 24);
  auto be = gpu();
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

// Gemma's RMSNorm (weights stored as offsets from 1) and its pointwise ops against the reference.
TEST(GpuOpsConform, GemmaNormAndPointwise) {
  ZOF_REQUIRE_GPU();
  for (int64_t rows : {1, 3, 17, 300}) {
    for (int64_t dim : {1, 7, 64, 768, 1001, 5120}) {
      const std::string what = " rows=" + std::to_string(rows) + " dim=" + std::to_string(dim);
      auto x = uniform(size_t(rows * dim), -2, 2, 4);
      auto w = uniform(size_t(dim), -0.5f, 0.5f, 5);
      conform("rms_norm w_offset=1" + what,
              [&](Backend& be) { return run_rms_norm_offset(be, x, w, rows, dim, 1e-6f, 1.0f); });
    }
  }
  for (int64_t n : {1, 15, 1000, 4097, 70001, 1 << 22}) {
    const std::string what = " n=" + std::to_string(n);
    auto x = uniform(size_t(n), -8, 8, 13), y = uniform(size_t(n), -3, 3, 14);
    auto wide = uniform(size_t(n), -200, 200, 15);
    conform("gelu_tanh_mul" + what, [&](Backend& be) { return run_gelu_tanh_mul(be, x, y); });
    conform("gelu_tanh_mul wide" + what, [&](Backend& be) { return run_gelu_tanh_mul(be, wide, y); });
    conform("mul_scalar sqrt(2048)" + what,
            [&](Backend& be) { return run_mul_scalar(be, x, 45.254833995939045f); });
    conform("mul_scalar -0.3" + what, [&](Backend& be) { return run_mul_scalar(be, wide, -0.3f); });
    conform("softcap 30 wide" + what, [&](Backend& be) { return run_softcap(be, wide, 30.0f); });
    conform("softcap 2.5" + what, [&](Backend& be) { return run_softcap(be, x, 2.5f); });
  }
}

TEST(GpuOps, GemmaAliasing) {
  ZOF_REQUIRE_GPU();
  const size_t n = 1500;
  auto x = uniform(n, -4, 4, 25), up = uniform(n, -2, 2, 26);
  auto be = gpu();
  const auto want = run_gelu_tanh_mul(*be, x, up);
  {
    Device dev(*be);
    float* g = dev.put(x);
    be->gelu_tanh_mul(g, dev.put(up), g, int64_t(n));
    EXPECT_TRUE(bit_identical(dev.get(g, n), want)) << "gelu_tanh_mul out == gate";
  }
  {
    Device dev(*be);
    float* u = dev.put(up);
    be->gelu_tanh_mul(dev.put(x), u, u, int64_t(n));
    EXPECT_TRUE(bit_identical(dev.get(u, n), want)) << "gelu_tanh_mul out == up";
  }
  {
    Device dev(*be);
    float* d = dev.put(x);
    be->softcap(d, d, 2.5f, int64_t(n));
    EXPECT_TRUE(bit_identical(dev.get(d, n), run_softcap(*be, x, 2.5f))) << "softcap y == x";
  }
}

// Gemma's attention variants (Gemma 2: window 4096 and softcap 50; here windows short enough to
// cut into the test sequences) on every attention shape, and decode cases whose window starts
// in a later key block of the generic kernel.
struct AttnVariant {
  int64_t window;
  float softcap;
  const char* what;
};
const std::vector<AttnVariant>& attention_variants() {
  static const std::vector<AttnVariant> variants = {
      {3, 0.0f, "window 3"},
      {0, 2.5f, "softcap 2.5"},
      {3, 2.5f, "window 3, softcap 2.5"},
      {1, 0.0f, "window 1 (itself only)"},
      {40, 50.0f, "window 40 (across key blocks), softcap 50"},
  };
  return variants;
}

TEST(GpuOpsConform, AttentionGemmaVariants) {
  ZOF_REQUIRE_GPU();
  std::vector<AttnCase> cases = attention_cases();
  cases.push_back({{2, 1, 40, 8, 2, 32, 39}, kNone, "decode one token, GQA, late window"});
  cases.push_back({{2, 5, 100, 4, 2, 64, 95}, kLeftPad, "decode 5 tokens, GQA, left padding"});
  cases.push_back({{2, 3, 70, 4, 4, 16, 60}, kRandom, "Tq<Tk, MHA, random mask"});
  auto be = gpu();
  for (const AttnCase& c : cases) {
    std::vector<float> q, k, v;
    std::vector<uint8_t> mask;
    attention_inputs(c, q, k, v, mask);
    for (const AttnVariant& a : attention_variants())
      conform(std::string("attention ") + a.what + ", " + c.what, [&](Backend& b) {
        return run_attention_gemma(b, q, k, v, mask, c.s, a.window, a.softcap);
      });
    // A window that holds every key a query could see is no window.
    const int64_t all = c.s.q_offset + c.s.Tq + 5;
    EXPECT_TRUE(close(run_attention(*be, q, k, v, mask, c.s),
                      run_attention_gemma(*be, q, k, v, mask, c.s, all, 0.0f), 1e-6))
        << "attention, a window over every key, " << c.what;
  }
}

// ---- bf16 walks ------------------------------------------------------------------------------------------

// The training walk's bf16 attention (Backend::attention with DType::BF16: fp32 in and out, the
// inputs rounded into the stream's scratch, the tensor-core kernel, its bf16 out widened)
// against the reference's bf16 semantics, with and without a window and soft-cap (the generic
// kernel then): within kTolBf16 (the CPU's own bf16 kernel meets 4e-3 of it; the CUDA kernel
// also rounds out to bf16).
TEST(GpuOpsBf16, AttentionOfABf16Walk) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto ref = zof::make_reference_backend();
  std::vector<AttnCase> cases = attention_cases();
  cases.push_back({{2, 200, 200, 8, 2, 128, 0}, kRandom, "D=128 GQA, masked"});
  cases.push_back({{2, 200, 200, 8, 8, 128, 0}, kRandom, "D=128 MHA, masked"});
  cases.push_back({{1, 1000, 1000, 4, 1, 64, 0}, kNone, "D=64 MQA, 16 key blocks"});
  cases.push_back({{2, 5, 300, 4, 2, 128, 295}, kLeftPad, "D=128 q_offset"});
  for (const AttnCase& c : cases) {
    std::vector<float> q, k, v;
    std::vector<uint8_t> mask;
    attention_inputs(c, q, k, v, mask);
    const AttnShape& s = c.s;
    const size_t n = size_t(s.B * s.Tq * s.H * s.D);
    for (auto [window, cap] : {std::pair<int64_t, float>{0, 0.f}, {5, 0.f}, {0, 50.f}}) {
      auto run = [&](Backend& b) {
        Device dev(b);
        float* out = dev.output(n);
        b.attention(dev.put(q), dev.put(k), dev.put(v), out, dev.put(mask), s.B, s.Tq, s.Tk, s.H,
                    s.Hkv, s.D, s.q_offset, 1.0f / std::sqrt(float(s.D)), window, cap,
                    zof::DType::BF16);
        return dev.get(out, n);
      };
      EXPECT_TRUE(close(run(*ref), run(*be), kTolBf16))
          << "attention bf16 " << c.what << " window " << window << " cap " << cap;
    }
  }
}

// ---- zeroth-order passes: z and the update bit for bit -------------------------------------------------

TEST(GpuZO, ZEqualsHostBitForBit) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  // theta = 0, eps = 1: plus = fmaf(1, z, 0) = z exactly, minus = -z.
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(4), int64_t(1001), int64_t(1) << 22, (int64_t(1) << 22) + 3}) {
    for (uint32_t tensor : {0u, 7u, 123456u}) {
      const zof::ZKey key{0x1234567890abcdefull, 42, 3};
      Device dev(*be);
      float* theta = dev.put(std::vector<float>(size_t(n), 0.0f));
      float* plus = dev.output(size_t(n));
      float* minus = dev.output(size_t(n));
      be->zo_pass(theta, n, tensor, 0, nullptr, 0, 0.0f, &key, 1.0f, plus, minus);
      const auto zp = dev.get(plus, size_t(n)), zm = dev.get(minus, size_t(n));
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want[i] = zof::z_element(key, tensor, uint64_t(i));
      EXPECT_TRUE(bit_identical(want, zp)) << "z n=" << n << " tensor=" << tensor;
      for (auto& z : want) z = -z;
      EXPECT_TRUE(bit_identical(want, zm)) << "-z n=" << n;
    }
  }
}

TEST(GpuZO, FusedUpdateAndPerturbationEqualHost) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  for (int64_t n : {int64_t(5), int64_t(1000003)}) {
    for (int n_update : {0, 1, 3}) {
      auto theta0 = uniform(size_t(n), -0.1f, 0.1f, 40);
      std::vector<zof::ZOUpdateTerm> upd;
      for (int j = 0; j < n_update; ++j)
        upd.push_back({zof::ZKey{99, 5, uint32_t(j)}, 1e-4f * float(j + 1) * (j % 2 ? -1.f : 1.f)});
      const zof::ZKey cur{99, 6, 1};
      const float lr_wd = n_update ? 3e-6f : 0.0f, eps = 1e-3f;
      auto th_host = theta0;
      std::vector<float> plus_host(static_cast<size_t>(n)), minus_host(static_cast<size_t>(n));
      zof::cpu::zo_pass(th_host.data(), n, 17, 0, upd.data(), n_update, lr_wd, &cur, eps,
                        plus_host.data(), minus_host.data());
      Device dev(*be);
      float* th = dev.put(theta0);
      float* plus = dev.output(size_t(n));
      float* minus = dev.output(size_t(n));
      be->zo_pass(th, n, 17, 0, upd.data(), n_update, lr_wd, &cur, eps, plus, minus);
      EXPECT_TRUE(bit_identical(th_host, dev.get(th, size_t(n)))) << "theta n=" << n << " upd=" << n_update;
      EXPECT_TRUE(bit_identical(plus_host, dev.get(plus, size_t(n)))) << "plus";
      EXPECT_TRUE(bit_identical(minus_host, dev.get(minus, size_t(n)))) << "minus";
      // Update only (flush): no perturbed copies.
      auto th2_host = theta0;
      zof::cpu::zo_pass(th2_host.data(), n, 17, 0, upd.data(), n_update, lr_wd, nullptr, 0.f, nullptr, nullptr);
      float* th2 = dev.put(theta0);
      be->zo_pass(th2, n, 17, 0, upd.data(), n_update, lr_wd, nullptr, 0.f, nullptr, nullptr);
      EXPECT_TRUE(bit_identical(th2_host, dev.get(th2, size_t(n)))) << "update only";
    }
  }
}

// The options of the ZO step on the device, bit for bit against the host: a sub-range at an odd
// first element, Rademacher z, Sparse MeZO's mask (update and perturbation), and the momentum
// and Adam updates through optimizer state.
TEST(GpuZO, SubRangeRademacherMaskAndOptimizerStateEqualHost) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  const int64_t total = 300007;
  for (auto [first, n] : {std::pair<int64_t, int64_t>{0, total}, {3, 1001}, {129, 200000}}) {
    for (uint32_t dist : {zof::kZGaussian, zof::kZRademacher}) {
      for (float mask : {std::numeric_limits<float>::infinity(), 0.05f}) {
        const auto theta0 = uniform(size_t(total), -0.1f, 0.1f, 41);
        std::vector<zof::ZOUpdateTerm> upd;
        for (int j = 0; j < 2; ++j) {
          zof::ZKey k{7, 4, uint32_t(j)};
          k.dist = dist;
          k.mask = mask;
          upd.push_back({k, 2e-3f * float(j + 1)});
        }
        zof::ZKey cur{7, 5, 0};
        cur.dist = dist;
        cur.mask = mask;
        const std::string what = "first=" + std::to_string(first) + " n=" + std::to_string(n) +
                                 " dist=" + std::to_string(dist) + " mask=" + std::to_string(mask);
        // The fused SGD pass.
        auto th_host = theta0;
        std::vector<float> ph(static_cast<size_t>(n)), mh(static_cast<size_t>(n));
        zof::cpu::zo_pass(th_host.data() + first, n, 9, first, upd.data(), 2, 1e-5f, &cur, 1e-3f,
                          ph.data(), mh.data());
        Device dev(*be);
        float* th = dev.put(theta0);
        float* plus = dev.output(size_t(n));
        float* minus = dev.output(size_t(n));
        be->zo_pass(th + first, n, 9, first, upd.data(), 2, 1e-5f, &cur, 1e-3f, plus, minus);
        EXPECT_TRUE(bit_identical(th_host, dev.get(th, size_t(total)))) << "theta " << what;
        EXPECT_TRUE(bit_identical(ph, dev.get(plus, size_t(n)))) << "plus " << what;
        EXPECT_TRUE(bit_identical(mh, dev.get(minus, size_t(n)))) << "minus " << what;
        // Momentum and Adam through state (two updates, so the state carries over).
        for (int kind : {zof::ZOOptimizer::Momentum, zof::ZOOptimizer::Adam}) {
          zof::ZOOptimizer o;
          o.kind = kind;
          o.lr = 1e-3f;
          o.wd = 0.01f;
          o.bc1 = 10.f;
          o.bc2 = 1000.f;
          auto t_host = theta0;
          std::vector<float> m_host(size_t(total), 0.f), v_host(size_t(total), 0.f);
          float* t_dev = dev.put(theta0);
          float* m_dev = dev.put(m_host);
          float* v_dev = dev.put(v_host);
          for (int rep = 0; rep < 2; ++rep) {
            zof::cpu::zo_update_state(t_host.data() + first, m_host.data() + first,
                                      v_host.data() + first, n, 9, first, upd.data(), 2, o);
            be->zo_update_state(t_dev + first, m_dev + first, v_dev + first, n, 9, first,
                                upd.data(), 2, o, nullptr);
          }
          EXPECT_TRUE(bit_identical(t_host, dev.get(t_dev, size_t(total)))) << kind << " " << what;
          EXPECT_TRUE(bit_identical(m_host, dev.get(m_dev, size_t(total)))) << kind << " " << what;
          EXPECT_TRUE(bit_identical(v_host, dev.get(v_dev, size_t(total)))) << kind << " " << what;
        }
      }
    }
  }
}

// LOZO's low-rank z on the device (philox.h's z_lowrank_group, each group of 4 from its
// factors' Philox blocks) against the host pass (its factor tables), bit for bit: a matrix of an
// odd width at sub-ranges that cut rows, ranks 1, 2 and 8, update terms under another V (step
// 3 of rank_every 2 against step 5), with a mask, and through momentum state.
TEST(GpuZO, LowRankEqualsHost) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  const int64_t cols = 301, total = 1003 * cols;
  for (uint32_t rank : {1u, 2u, 8u}) {
    for (auto [first, n] : {std::pair<int64_t, int64_t>{0, total}, {3, 1001}, {129, 200000}}) {
      const auto theta0 = uniform(size_t(total), -0.1f, 0.1f, 43);
      auto key = [&](uint32_t step, uint32_t q) {
        zof::ZKey k{7, step, q};
        k.rank = rank, k.rank_every = 2, k.cols = (uint32_t)cols, k.mask = 0.09f;
        return k;
      };
      std::vector<zof::ZOUpdateTerm> upd{{key(3, 0), 2e-3f}, {key(3, 1), -1e-3f}};
      const zof::ZKey cur = key(5, 0);
      const std::string what = "rank " + std::to_string(rank) + " first=" +
                               std::to_string(first) + " n=" + std::to_string(n);
      auto th_host = theta0;
      std::vector<float> ph(static_cast<size_t>(n)), mh(static_cast<size_t>(n));
      zof::cpu::zo_pass(th_host.data() + first, n, 9, first, upd.data(), 2, 1e-5f, &cur, 1e-3f,
                        ph.data(), mh.data());
      Device dev(*be);
      float* th = dev.put(theta0);
      float* plus = dev.output(size_t(n));
      float* minus = dev.output(size_t(n));
      be->zo_pass(th + first, n, 9, first, upd.data(), 2, 1e-5f, &cur, 1e-3f, plus, minus);
      EXPECT_TRUE(bit_identical(th_host, dev.get(th, size_t(total)))) << "theta " << what;
      EXPECT_TRUE(bit_identical(ph, dev.get(plus, size_t(n)))) << "plus " << what;
      EXPECT_TRUE(bit_identical(mh, dev.get(minus, size_t(n)))) << "minus " << what;
      zof::ZOOptimizer o;
      o.kind = zof::ZOOptimizer::Momentum;
      o.lr = 1e-3f, o.wd = 0.01f;
      auto t_host = theta0;
      std::vector<float> m_host(size_t(total), 0.f);
      float* t_dev = dev.put(theta0);
      float* m_dev = dev.put(m_host);
      zof::cpu::zo_update_state(t_host.data() + first, m_host.data() + first, nullptr, n, 9,
                                first, upd.data(), 2, o);
      be->zo_update_state(t_dev + first, m_dev + first, nullptr, n, 9, first, upd.data(), 2, o,
                          nullptr);
      EXPECT_TRUE(bit_identical(t_host, dev.get(t_dev, size_t(total)))) << "momentum " << what;
      EXPECT_TRUE(bit_identical(m_host, dev.get(m_dev, size_t(total)))) << "momentum " << what;
    }
  }
}

// The token-table rows a batch reads, perturbed in one launch, bit for bit against the host.
TEST(GpuZO, RowPassEqualsHost) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto host = zof::make_cpu_backend(1);
  for (int64_t width : {1, 7, 64, 4099}) {
    const int64_t n_table = 300;
    const auto table = uniform(size_t(n_table * width), -0.2f, 0.2f, 120);
    std::vector<int32_t> rows;
    for (int32_t r = 0; r < n_table; r += 3) rows.push_back((r * 7) % n_table);
    const int64_t n = (int64_t)rows.size();
    zof::ZKey key{5, 9, 1};
    key.mask = 0.15f;
    std::vector<float> hp(size_t(n * width)), hm(hp.size());
    host->zo_rows(zof::Theta(table.data()), width, rows.data(), n, 12, key, 1e-3f, hp.data(), hm.data());
    Device dev(*be);
    float *p = dev.output(hp.size()), *m = dev.output(hm.size());
    be->zo_rows(dev.put(table), width, dev.put(rows), n, 12, key, 1e-3f, p, m);
    EXPECT_TRUE(bit_identical(hp, dev.get(p, hp.size()))) << "width " << width;
    EXPECT_TRUE(bit_identical(hm, dev.get(m, hm.size()))) << "width " << width;
  }
}

// The online softmax over vocabulary chunks on the device equals the host's fold.
TEST(GpuOps, CrossEntropyChunkEqualsHost) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  const int64_t rows = 37, vocab = 50257, chunk = 1344;
  const auto logits = uniform(size_t(rows * vocab), -30.f, 30.f, 42);
  std::vector<int32_t> targets(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) targets[r] = int32_t((r * 7919) % vocab);
  targets[5] = -100;
  std::vector<float> init(3 * size_t(rows), 0.f);
  for (int64_t r = 0; r < rows; ++r) init[r] = -std::numeric_limits<float>::infinity();
  auto host = zof::make_cpu_backend(1);
  std::vector<float> st_host = init;
  Device dev(*be);
  float* st = dev.put(init);
  const int32_t* tg = dev.put(targets);
  for (int64_t v0 = 0; v0 < vocab; v0 += chunk) {
    const int64_t nv = std::min(chunk, vocab - v0);
    std::vector<float> part(size_t(rows * nv));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(logits.begin() + r * vocab + v0, nv, part.begin() + r * nv);
    host->cross_entropy_chunk(part.data(), targets.data(), rows, nv, v0, st_host.data(),
                              st_host.data() + rows, st_host.data() + 2 * rows);
    be->cross_entropy_chunk(dev.put(part), tg, rows, nv, v0, st, st + rows, st + 2 * rows);
  }
  const auto got = dev.get(st, 3 * size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    EXPECT_EQ(got[r], st_host[r]) << "max, row " << r;                  // exact: a max
    EXPECT_EQ(got[2 * rows + r], st_host[2 * rows + r]) << "target, row " << r;  // a copy
    // The sums differ in order (a block reduction against a SIMD loop): fp32 tolerance.
    EXPECT_NEAR(got[rows + r], st_host[rows + r], 1e-5 * st_host[rows + r]) << "sum, row " << r;
  }
}


// ---- tangents: the CUDA kernels of src/cuda/jvp.cu against the host loops (the host backends',
// jvp_ops.h, double accumulation), on the shapes of the JVP walk and their edges ----------------

TEST(GpuJvp, TangentOpsEqualHost) {
  ZOF_REQUIRE_GPU();
  for (int64_t dim : {1, 64, 288, 4096}) {
    const int64_t rows = 5;
    const auto x = uniform(size_t(rows * dim), -2.f, 2.f, 80), dx = uniform(size_t(rows * dim), -1.f, 1.f, 81);
    auto xo = x;
    for (auto& v : xo) v += 30.f;  // LayerNorm rows far from zero mean
    const auto w = uniform(size_t(dim), 0.5f, 1.5f, 82), dw = uniform(size_t(dim), -1.f, 1.f, 83),
               db = uniform(size_t(dim), -1.f, 1.f, 84);
    conform("rms_norm_jvp dim=" + std::to_string(dim), [&](Backend& be) {
      Device dev(be);
      float* y = dev.output(x.size());
      be.rms_norm_jvp(dev.put(x), dev.put(dx), dev.put(w), dev.put(dw), y, rows, dim, 1e-5f);
      return dev.get(y, x.size());
    });
    conform("rms_norm_jvp, null dw, dim=" + std::to_string(dim), [&](Backend& be) {
      Device dev(be);
      float* y = dev.output(x.size());
      be.rms_norm_jvp(dev.put(x), dev.put(dx), dev.put(w), nullptr, y, rows, dim, 1e-5f);
      return dev.get(y, x.size());
    });
    conform("layer_norm_jvp dim=" + std::to_string(dim), [&](Backend& be) {
      Device dev(be);
      float* y = dev.output(x.size());
      be.layer_norm_jvp(dev.put(xo), dev.put(dx), dev.put(w), dev.put(dw), dev.put(db), y, rows,
                        dim, 1e-5f);
      return dev.get(y, x.size());
    });
  }
  struct Case {
    int64_t B, S, H, Hkv, D;
    bool mask;
  };
  for (Case c : {Case{1, 1, 1, 1, 8, false}, Case{2, 100, 8, 2, 64, true},
                 Case{1, 300, 4, 4, 128, false}, Case{2, 33, 6, 3, 5, true},
                 Case{1, 64, 2, 1, 256, false}}) {
    const size_t nq = size_t(c.B * c.S * c.H * c.D), nk = size_t(c.B * c.S * c.Hkv * c.D);
    const auto q = uniform(nq, -2.f, 2.f, 90), dq = uniform(nq, -1.f, 1.f, 91),
               k = uniform(nk, -2.f, 2.f, 92), dk = uniform(nk, -1.f, 1.f, 93),
               v = uniform(nk, -1.f, 1.f, 94), dv = uniform(nk, -1.f, 1.f, 95);
    std::vector<uint8_t> mask;
    if (c.mask) {  // row 1 is right-padded, its key 0 masked too (its first query sees nothing)
      mask.assign(size_t(c.B * c.S), 1);
      for (int64_t j = c.S + c.S / 2; j < 2 * c.S; ++j) mask[j] = 0;
      mask[c.S] = 0;
    }
    const float scale = 1.0f / std::sqrt(float(c.D));
    const std::string what = "attention_jvp S=" + std::to_string(c.S) + " H=" + std::to_string(c.H) +
                             " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D);
    conform(what, [&](Backend& be) {
      Device dev(be);
      float* out = dev.output(nq);
      be.attention_jvp(dev.put(q), dev.put(dq), dev.put(k), dev.put(dk), dev.put(v), dev.put(dv),
                       out, dev.put(mask), c.B, c.S, c.H, c.Hkv, c.D, scale);
      return dev.get(out, nq);
    });
    conform(what + ", null dk dv", [&](Backend& be) {
      Device dev(be);
      float* out = dev.output(nq);
      be.attention_jvp(dev.put(q), dev.put(dq), dev.put(k), nullptr, dev.put(v), nullptr, out,
                       dev.put(mask), c.B, c.S, c.H, c.Hkv, c.D, scale);
      return dev.get(out, nq);
    });
  }
  auto gpu_be = gpu();
  {
    Device dev(*gpu_be);
    const std::vector<float> one(512 * 8, 1.0f);
    EXPECT_THROW(gpu_be->attention_jvp(dev.put(one), dev.put(one), dev.put(one), nullptr,
                                       dev.put(one), nullptr, dev.output(one.size()), nullptr, 1, 1,
                                       8, 8, 512, 0.1f),
                 zof::Error);  // head_dim 512: refused with an error, never a bad launch
  }
  // Pointwise, with tails: |x| > 10 (GELU's slope saturates), g < -88 (silu's e^-g overflows).
  auto g = uniform(100000, -12.f, 12.f, 96);
  for (float t : {-200.f, -90.f, -10.5f, 0.f, 10.5f, 200.f}) g.push_back(t);
  const size_t n = g.size();
  const auto dg = uniform(n, -1.f, 1.f, 97), up = uniform(n, -2.f, 2.f, 98), dup = uniform(n, -1.f, 1.f, 99);
  conform("silu_mul_jvp", [&](Backend& be) {
    Device dev(be);
    float* out = dev.output(n);
    be.silu_mul_jvp(dev.put(g), dev.put(dg), dev.put(up), dev.put(dup), out, int64_t(n));
    return dev.get(out, n);
  });
  using JvpOp = void (Backend::*)(const float*, const float*, float*, int64_t, zof::Stream*);
  for (auto [op, name] : {std::pair<JvpOp, const char*>{&Backend::gelu_tanh_jvp, "gelu_tanh_jvp"},
                          std::pair<JvpOp, const char*>{&Backend::gelu_erf_jvp, "gelu_erf_jvp"},
                          std::pair<JvpOp, const char*>{&Backend::relu_jvp, "relu_jvp"}})
    conform(name, [&, op = op](Backend& be) {
      Device dev(be);
      float* out = dev.output(n);
      (be.*op)(dev.put(g), dev.put(dg), out, int64_t(n), nullptr);
      return dev.get(out, n);
    });
  for (int64_t vocab : {2, 513, 50257}) {
    const int64_t rows = 7;
    const auto lg = uniform(size_t(rows * vocab), -20.f, 20.f, 100),
               dl = uniform(size_t(rows * vocab), -1.f, 1.f, 101);
    std::vector<int32_t> tg(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) tg[r] = int32_t((r * 7919) % vocab);
    tg[3] = -100;
    conform("cross_entropy_jvp vocab=" + std::to_string(vocab), [&](Backend& be) {
      Device dev(be);
      float* out = dev.output(size_t(rows));
      be.cross_entropy_jvp(dev.put(lg), dev.put(dl), dev.put(tg), out, rows, vocab);
      return dev.get(out, size_t(rows));
    });
  }
}


// The tangents of Gemma's ops and variants against the host loops: RMSNorm with the offset
// weight, attention with a sliding window and soft-capped scores, GeGLU and the softcap op.
TEST(GpuJvp, GemmaTangentsEqualHost) {
  ZOF_REQUIRE_GPU();
  for (int64_t dim : {1, 64, 288, 4096}) {
    const int64_t rows = 5;
    const auto x = uniform(size_t(rows * dim), -2.f, 2.f, 80), dx = uniform(size_t(rows * dim), -1.f, 1.f, 81);
    const auto w = uniform(size_t(dim), -0.5f, 0.5f, 82), dw = uniform(size_t(dim), -1.f, 1.f, 83);
    for (bool with_dw : {true, false})
      conform(std::string("rms_norm_jvp w_offset=1") + (with_dw ? "" : ", null dw") + " dim=" +
                  std::to_string(dim),
              [&](Backend& be) {
                Device dev(be);
                float* y = dev.output(x.size());
                be.rms_norm_jvp(dev.put(x), dev.put(dx), dev.put(w), with_dw ? dev.put(dw) : nullptr,
                                y, rows, dim, 1e-6f, 1.0f);
                return dev.get(y, x.size());
              });
  }
  struct Case {
    int64_t B, S, H, Hkv, D;
    bool mask;
  };
  for (Case c : {Case{1, 1, 1, 1, 8, false}, Case{2, 100, 8, 2, 64, true},
                 Case{1, 300, 4, 4, 128, false}, Case{2, 33, 6, 3, 5, true},
                 Case{1, 64, 2, 1, 256, false}}) {
    const size_t nq = size_t(c.B * c.S * c.H * c.D), nk = size_t(c.B * c.S * c.Hkv * c.D);
    const auto q = uniform(nq, -2.f, 2.f, 90), dq = uniform(nq, -1.f, 1.f, 91),
               k = uniform(nk, -2.f, 2.f, 92), dk = uniform(nk, -1.f, 1.f, 93),
               v = uniform(nk, -1.f, 1.f, 94), dv = uniform(nk, -1.f, 1.f, 95);
    std::vector<uint8_t> mask;
    if (c.mask) {  // row 1 is right-padded, its key 0 masked too (its first query sees nothing)
      mask.assign(size_t(c.B * c.S), 1);
      for (int64_t j = c.S + c.S / 2; j < 2 * c.S; ++j) mask[j] = 0;
      mask[c.S] = 0;
    }
    const float scale = 1.0f / std::sqrt(float(c.D));
    for (const AttnVariant& a : attention_variants()) {
      const std::string what = std::string("attention_jvp ") + a.what + " S=" +
                               std::to_string(c.S) + " H=" + std::to_string(c.H) + " Hkv=" +
                               std::to_string(c.Hkv) + " D=" + std::to_string(c.D);
      conform(what, [&](Backend& be) {
        Device dev(be);
        float* out = dev.output(nq);
        be.attention_jvp(dev.put(q), dev.put(dq), dev.put(k), dev.put(dk), dev.put(v),
                         dev.put(dv), out, dev.put(mask), c.B, c.S, c.H, c.Hkv, c.D, scale,
                         a.window, a.softcap);
        return dev.get(out, nq);
      });
      conform(what + ", null dk dv", [&](Backend& be) {
        Device dev(be);
        float* out = dev.output(nq);
        be.attention_jvp(dev.put(q), dev.put(dq), dev.put(k), nullptr, dev.put(v), nullptr, out,
                         dev.put(mask), c.B, c.S, c.H, c.Hkv, c.D, scale, a.window, a.softcap);
        return dev.get(out, nq);
      });
    }
  }
  // Pointwise, with tails: |x| > 10 (GELU's slope saturates), far past the cap (tanh is +-1).
  auto g = uniform(100000, -12.f, 12.f, 96);
  for (float t : {-200.f, -90.f, -10.5f, 0.f, 10.5f, 200.f}) g.push_back(t);
  const size_t n = g.size();
  const auto dg = uniform(n, -1.f, 1.f, 97), up = uniform(n, -2.f, 2.f, 98), dup = uniform(n, -1.f, 1.f, 99);
  for (int nulls = 0; nulls < 3; ++nulls)  // both tangents, null dgate, null dup
    conform("gelu_tanh_mul_jvp" + std::string(nulls == 1 ? ", null dgate" : nulls == 2 ? ", null dup" : ""),
            [&](Backend& be) {
              Device dev(be);
              float* out = dev.output(n);
              be.gelu_tanh_mul_jvp(dev.put(g), nulls == 1 ? nullptr : dev.put(dg), dev.put(up),
                                   nulls == 2 ? nullptr : dev.put(dup), out, int64_t(n));
              return dev.get(out, n);
            });
  auto logits = uniform(100000, -100.f, 100.f, 102);
  for (float t : {-1e4f, -500.f, 0.f, 500.f, 1e4f}) logits.push_back(t);
  const auto dl = uniform(logits.size(), -1.f, 1.f, 103);
  for (float cap : {2.5f, 30.f})
    conform("softcap_jvp cap=" + std::to_string(cap), [&](Backend& be) {
      Device dev(be);
      float* out = dev.output(logits.size());
      be.softcap_jvp(dev.put(logits), dev.put(dl), out, cap, int64_t(logits.size()));
      return dev.get(out, logits.size());
    });
  auto be = gpu();
  {  // by hand: gelu_tanh'(0) = 1/2 and gelu_tanh(0) = 0; softcap'(0) = 1
    Device dev(*be);
    float* out = dev.output(1);
    be->gelu_tanh_mul_jvp(dev.put(std::vector<float>{0}), dev.put(std::vector<float>{2}),
                          dev.put(std::vector<float>{3}), dev.put(std::vector<float>{7}), out, 1);
    EXPECT_EQ(dev.get(out, 1), (std::vector<float>{3}));
    be->softcap_jvp(dev.put(std::vector<float>{0}), dev.put(std::vector<float>{-1.5f}), out, 30.f, 1);
    EXPECT_EQ(dev.get(out, 1), (std::vector<float>{-1.5f}));
  }
}

}  // namespace
