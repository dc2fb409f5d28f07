// The compute dtypes on the GPU (Backend::matmul with bf16 weights, Backend::cast, Backend::zo_pass
// with bf16 copies) against the host backends: the bf16-weight product against the reference
// backend's (x rounded to bf16, the bf16 products accumulated), each element within 1e-5 of
// sum_k |x_k w_k| (fp32 sums in another order); casts bit for bit against zof::f32_to_bf16 and
// zof::f32_to_f16, NaNs, infinities and ties included; the ZO pass's bf16 and fp32 copies and
// its updated weights bit for bit against the CPU backend's, with up to kMaxZOTerms (128) update
// terms (which no longer travel in the kernel's argument block), over sub-ranges, and queued back
// to back on one stream with different terms each time. Also compute_info(), and the raw
// all-bf16 GEMM block_bench's anchor times.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cuda/matmul.cuh"
#include "gpu/gpu_test.h"
#include "zof/backend.h"
#include "cuda/cuda_backend.h"
#include "zof/dtype.h"
#include "zof/error.h"
#include "util/philox.h"

namespace {

using zof::Backend;
using zof::DType;
using zof::gpu_test::uniform;

std::unique_ptr<zof::CudaBackend> gpu() { return zof::make_cuda_backend(0); }

// Buffers of one backend (device memory, or host memory for the host backends), freed together.
class Buffers {
 public:
  explicit Buffers(Backend& be) : be_(be) {}
  ~Buffers() {
    be_.synchronize(nullptr);
    for (void* p : ptrs_) be_.free(p);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  template <class T>
  T* put(const std::vector<T>& host) {
    if (host.empty()) return nullptr;
    void* d = be_.alloc(host.size() * sizeof(T));
    ptrs_.push_back(d);
    be_.copy_to_device(d, host.data(), host.size() * sizeof(T), nullptr);
    return static_cast<T*>(d);
  }
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

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
// The first index where a and b differ, for the failure message.
template <class T>
std::string first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return "first difference at [" + std::to_string(i) + "]";
  return "no difference";
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- compute_info ---------------------------------------------------------------------------

TEST(GpuDtypes, ComputeInfo) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  const zof::CudaDeviceInfo dev = zof::cuda_device_info(0);
  const Backend::ComputeInfo c = be->compute_info();
  EXPECT_EQ(c.bf16_fast, dev.cc_major >= 8);
  EXPECT_NE(c.isa.find(dev.name), std::string::npos) << c.isa;
  EXPECT_NE(c.isa.find("(sm_" + std::to_string(dev.cc_major) + std::to_string(dev.cc_minor) + ")"),
            std::string::npos)
      << c.isa;
}

// ---- matmul with bf16 weights ----------------------------------------------------------------

struct Shape {
  int64_t M, N, K;
};

// y = x w^T + bias on `be` with weights w16 (bf16 bits) at element offset w_off of the uploaded
// buffer; everything else fp32. On stream s (the default when null).
std::vector<float> run_matmul_bf16(Backend& be, const std::vector<float>& x,
                                   const std::vector<uint16_t>& w16, size_t w_off,
                                   const std::vector<float>& bias, const Shape& s) {
  Buffers buf(be);
  float* y = buf.put(std::vector<float>(size_t(s.M * s.N), std::numeric_limits<float>::quiet_NaN()));
  be.matmul(buf.put(x), buf.put(w16) + w_off, DType::BF16, buf.put(bias), y, s.M, s.N, s.K);
  return buf.get(y, size_t(s.M * s.N));
}

// sum_k |bf16(x)_ik| |w_jk| + |bias_j|: what an fp32 sum of those products may be off by, in
// units of its rounding.
std::vector<double> product_scale(const std::vector<float>& x, const std::vector<uint16_t>& w16,
                                  size_t w_off, const std::vector<float>& bias, const Shape& s) {
  std::vector<double> scale(size_t(s.M * s.N));
  std::vector<float> xr(x.size()), w(size_t(s.N * s.K));
  for (size_t i = 0; i < x.size(); ++i) xr[i] = std::fabs(zof::bf16_to_f32(zof::f32_to_bf16(x[i])));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::fabs(zof::bf16_to_f32(w16[w_off + i]));
  for (int64_t m = 0; m < s.M; ++m)
    for (int64_t n = 0; n < s.N; ++n) {
      double acc = bias.empty() ? 0.0 : std::fabs(double(bias[size_t(n)]));
      for (int64_t k = 0; k < s.K; ++k) acc += double(xr[size_t(m * s.K + k)]) * w[size_t(n * s.K + k)];
      scale[size_t(m * s.N + n)] = acc;
    }
  return scale;
}

// |got - want| <= tol * scale, element by element, never a NaN.
::testing::AssertionResult within_scale(const std::vector<float>& want, const std::vector<float>& got,
                                        const std::vector<double>& scale, double tol) {
  if (want.size() != got.size() || want.size() != scale.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i]) || !std::isfinite(got[i]))
      return ::testing::AssertionFailure() << "[" << i << "]: " << got[i] << " vs " << want[i];
    const double r = std::fabs(double(got[i]) - double(want[i])) / std::max(scale[i], 1e-30);
    if (r > worst) worst = r, at = i;
  }
  if (worst <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "error " << worst << " x sum|x||w| > " << tol << " at ["
                                       << at << "]: " << got[at] << " vs " << want[at];
}

constexpr double kTolProducts = 1e-5;

TEST(GpuDtypes, MatmulBf16WeightsEqualReference) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto ref = zof::make_reference_backend();
  for (Shape s : {Shape{1, 1, 1}, Shape{1, 17, 33}, Shape{2, 3, 5}, Shape{7, 5, 3}, Shape{16, 16, 16},
                  Shape{33, 65, 127}, Shape{1, 300, 1000}, Shape{64, 48, 768}, Shape{100, 130, 70},
                  Shape{3, 7, 0}, Shape{257, 1031, 2048}, Shape{4, 4096, 4096}}) {
    for (bool has_bias : {false, true}) {
      // x is not rounded here: the backend rounds it (an fp32 x would be off by ~2^-9).
      const auto x = uniform(size_t(s.M * s.K), -1, 1, 1);
      const auto w16 = zof::gpu_test::to_bf16(uniform(size_t(s.N * s.K), -1, 1, 2));
      const auto bias = has_bias ? uniform(size_t(s.N), -1, 1, 3) : std::vector<float>{};
      const std::string what = "M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) +
                               " K=" + std::to_string(s.K) + (has_bias ? " +bias" : "");
      const auto want = run_matmul_bf16(*ref, x, w16, 0, bias, s);
      const auto got = run_matmul_bf16(*be, x, w16, 0, bias, s);
      EXPECT_TRUE(within_scale(want, got, product_scale(x, w16, 0, bias, s), kTolProducts)) << what;
      EXPECT_TRUE(same_bits(got, run_matmul_bf16(*be, x, w16, 0, bias, s))) << what << ": two runs differ";
    }
  }
  // A weight slice a whole number of rows in (a fused qkv's k or v rows).
  const Shape s{10, 64, 64};
  const auto x = uniform(size_t(s.M * s.K), -1, 1, 4);
  const auto w16 = zof::gpu_test::to_bf16(uniform(size_t(3 * s.N * s.K), -1, 1, 5));
  const size_t off = size_t(s.N * s.K);
  EXPECT_TRUE(within_scale(run_matmul_bf16(*ref, x, w16, off, {}, s), run_matmul_bf16(*be, x, w16, off, {}, s),
                           product_scale(x, w16, off, {}, s), kTolProducts))
      << "weight slice";
  // Only fp32 and bf16 weights.
  Buffers buf(*be);
  float* d = buf.put(std::vector<float>(16, 1.0f));
  EXPECT_THROW(be->matmul(d, d, DType::F16, nullptr, d + 8, 2, 2, 2), zof::Error);
}

// cuBLASLt's all-bf16 GEMM (cuda::Matmul, GemmType::BF16: x, w, bias and y bf16), which
// block_bench times as the raw tensor-core rate beside the backend's products: the reference's
// product of the same bf16 values, within the fp32 sums' rounding (1e-5 of sum |x||w|) and one
// bf16 rounding of y (2^-8 of |y|).
TEST(GpuDtypes, RawBf16GemmOfTheBenchAnchor) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto ref = zof::make_reference_backend();
  zof::cuda::Matmul raw;
  Buffers buf(*be);
  void* workspace = be->alloc(zof::cuda::Matmul::kWorkspaceBytes);
  for (Shape s : {Shape{1, 17, 33}, Shape{64, 48, 768}, Shape{257, 1031, 2048}}) {
    for (bool has_bias : {false, true}) {
      const auto x16 = zof::gpu_test::to_bf16(uniform(size_t(s.M * s.K), -1, 1, 11));
      const auto w16 = zof::gpu_test::to_bf16(uniform(size_t(s.N * s.K), -1, 1, 12));
      const auto b16 = has_bias ? zof::gpu_test::to_bf16(uniform(size_t(s.N), -1, 1, 13))
                                : std::vector<uint16_t>{};
      const auto x = zof::gpu_test::from_bf16(x16), bias = zof::gpu_test::from_bf16(b16);
      const auto want = run_matmul_bf16(*ref, x, w16, 0, bias, s);
      uint16_t* y = buf.put(std::vector<uint16_t>(size_t(s.M * s.N), 0x7fc0));
      raw.run(zof::cuda::GemmType::BF16, buf.put(x16), buf.put(w16), buf.put(b16), y, s.M, s.N,
              s.K, workspace, cudaStream_t(be->native_stream(nullptr)));
      const auto got = zof::gpu_test::from_bf16(buf.get(y, size_t(s.M * s.N)));
      const auto scale = product_scale(x, w16, 0, bias, s);
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i])) << i;
        const double tol = kTolProducts * scale[i] + std::ldexp(std::fabs(double(want[i])), -8);
        worst = std::max(worst, std::fabs(double(got[i]) - double(want[i])) / tol);
      }
      EXPECT_LE(worst, 1.0) << "M=" << s.M << " N=" << s.N << " K=" << s.K
                            << (has_bias ? " +bias" : "");
    }
  }
  be->synchronize(nullptr);
  be->free(workspace);
}

// Products of growing and shrinking sizes queued back to back on one stream, with no wait in
// between: the bf16 copy of x (one scratch per stream) grows while earlier products may still
// read the old one, and is reused by each product after the previous one was queued.
TEST(GpuDtypes, MatmulBf16QueuedOnOneStream) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto ref = zof::make_reference_backend();
  zof::Stream* st = be->create_stream();
  const std::vector<Shape> shapes = {{8, 64, 64},     {300, 256, 1024}, {2, 32, 16},
                                     {1024, 512, 2048}, {5, 128, 96},    {2048, 64, 1536}};
  std::vector<std::vector<float>> xs, biases, want;
  std::vector<std::vector<uint16_t>> ws;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    xs.push_back(uniform(size_t(s.M * s.K), -2, 2, uint32_t(10 + i)));
    ws.push_back(zof::gpu_test::to_bf16(uniform(size_t(s.N * s.K), -1, 1, uint32_t(20 + i))));
    biases.push_back(i % 2 ? uniform(size_t(s.N), -1, 1, uint32_t(30 + i)) : std::vector<float>{});
    want.push_back(run_matmul_bf16(*ref, xs[i], ws[i], 0, biases[i], s));
  }
  Buffers buf(*be);
  std::vector<float*> ys;
  std::vector<const float*> dx, db;
  std::vector<const uint16_t*> dw;
  for (size_t i = 0; i < shapes.size(); ++i) {  // uploads first, then only the products queued
    ys.push_back(buf.put(std::vector<float>(size_t(shapes[i].M * shapes[i].N), 0.f)));
    dx.push_back(buf.put(xs[i]));
    dw.push_back(buf.put(ws[i]));
    db.push_back(buf.put(biases[i]));
  }
  be->synchronize(nullptr);
  for (int rep = 0; rep < 2; ++rep)
    for (size_t i = 0; i < shapes.size(); ++i)
      be->matmul(dx[i], dw[i], DType::BF16, db[i], ys[i], shapes[i].M, shapes[i].N, shapes[i].K, st);
  be->synchronize(st);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    EXPECT_TRUE(within_scale(want[i], buf.get(ys[i], size_t(s.M * s.N)),
                             product_scale(xs[i], ws[i], 0, biases[i], s), kTolProducts))
        << "product " << i;
  }
}

// ---- casts ----------------------------------------------------------------------------------

// Every kind of fp32 value: signed zeros, subnormals, the largest finite (which rounds to inf in
// bf16), infinities, NaNs with and without payloads and of both signs, exact bf16 and fp16 ties
// (round to even, up and down), values just off the ties, and random bit patterns.
std::vector<float> cast_inputs() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00800000u,
      0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0x7f800000u, 0xff800000u,
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fbfffffu, 0x7fffffffu,
      0xffffffffu, 0x7fa00000u, 0x7f80ffffu, 0x3f808000u, 0x3f818000u, 0xbf808000u,
      0xbf818000u, 0x3f808001u, 0x3f817fffu, 0x00008000u, 0x00018000u, 0x3f800000u,
      // fp16: 65504 (max), 65519.99, 65520 (ties to inf), 2^-14, 2^-24, 2^-25 (ties to 0),
      // 1 + 2^-11 (tie, to even 1), 1 + 3 * 2^-11 (tie, up)
      0x477fe000u, 0x477fefffu, 0x477ff000u, 0x38800000u, 0x33800000u, 0x33000000u,
      0x33000001u, 0x3f801000u, 0x3f803000u, 0x387fe000u, 0x387ff000u};
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) bits.push_back(uint32_t(rng()));
  for (int i = 0; i < 20000; ++i) bits.push_back((uint32_t(rng()) & 0xffff0000u) | 0x8000u);  // bf16 ties
  for (int i = 0; i < 20000; ++i) {  // fp16 ties over the normal fp16 range (exponents 113..142)
    const uint32_t e = 113 + uint32_t(rng() % 30), m = uint32_t(rng()) & 0x7fe000u;
    bits.push_back((uint32_t(rng()) & 0x80000000u) | e << 23 | m | 0x1000u);
  }
  std::vector<float> x;
  for (uint32_t u : bits) x.push_back(from_bits(u));
  return x;
}

TEST(GpuDtypes, CastEqualsHostBitForBit) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  const auto x = cast_inputs();
  const size_t n = x.size();
  std::vector<uint16_t> want_bf16(n), want_f16(n);
  for (size_t i = 0; i < n; ++i) {
    want_bf16[i] = zof::f32_to_bf16(x[i]);
    want_f16[i] = zof::f32_to_f16(x[i]);
  }
  Buffers buf(*be);
  const float* dx = buf.put(x);
  uint16_t* d16 = buf.put(std::vector<uint16_t>(n, 0x1234));
  be->cast(dx, d16, DType::BF16, int64_t(n));
  const auto got_bf16 = buf.get(d16, n);
  EXPECT_TRUE(same_bits(want_bf16, got_bf16)) << "bf16: " << first_difference(want_bf16, got_bf16);
  be->cast(dx, d16, DType::F16, int64_t(n));
  const auto got_f16 = buf.get(d16, n);
  EXPECT_TRUE(same_bits(want_f16, got_f16)) << "f16: " << first_difference(want_f16, got_f16);
  float* d32 = buf.put(std::vector<float>(n, 0.f));
  be->cast(dx, d32, DType::F32, int64_t(n));
  const auto got_f32 = buf.get(d32, n);
  EXPECT_TRUE(same_bits(x, got_f32)) << "f32: " << first_difference(x, got_f32);
  // A sub-range at an odd offset, on another stream; n = 0 writes nothing.
  zof::Stream* st = be->create_stream();
  uint16_t* e16 = buf.put(std::vector<uint16_t>(n, 0x1234));
  be->cast(dx + 3, e16 + 1, DType::BF16, int64_t(n - 7), st);
  be->cast(dx, e16, DType::BF16, 0, st);
  be->synchronize(st);
  std::vector<uint16_t> want_sub(n, 0x1234);
  for (size_t i = 0; i + 7 < n; ++i) want_sub[i + 1] = want_bf16[i + 3];
  const auto got_sub = buf.get(e16, n);
  EXPECT_TRUE(same_bits(want_sub, got_sub)) << "sub-range: " << first_difference(want_sub, got_sub);
  // widen gives back every bf16 value exactly.
  be->cast(dx, d16, DType::BF16, int64_t(n));
  be->widen(d16, DType::BF16, d32, int64_t(n));
  std::vector<float> want_wide(n);
  for (size_t i = 0; i < n; ++i) want_wide[i] = zof::bf16_to_f32(want_bf16[i]);
  const auto got_wide = buf.get(d32, n);
  EXPECT_TRUE(same_bits(want_wide, got_wide)) << "widen: " << first_difference(want_wide, got_wide);
}

// A bf16 master's stochastic rounding (--master bf16): the kernel gives the CPU backend's bits
// (philox.h's), whole and over sub-ranges at odd offsets, on another stream.
TEST(GpuDtypes, RoundBf16StochasticEqualsHostBitForBit) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto cpu = zof::make_cpu_backend(1);
  std::vector<float> x = cast_inputs();
  for (float& v : x)
    if (std::isnan(v)) v = 0.25f;  // a NaN stays NaN, but its payload is not compared here
  const int64_t n = int64_t(x.size());
  zof::ZKey key;
  key.seed = 0xABCDEF0123ull, key.step = 41;
  zof::Stream* st = be->create_stream();
  for (int64_t first : {int64_t(0), int64_t(1), int64_t(3), int64_t(5)}) {
    const int64_t m = n - first - 1;
    std::vector<float> want(x.begin() + first, x.begin() + first + m);
    cpu->round_bf16_stochastic(want.data(), m, 9, first, key);
    Buffers buf(*be);
    float* d = buf.put(std::vector<float>(x.begin() + first, x.begin() + first + m));
    be->round_bf16_stochastic(d, m, 9, first, key, st);
    be->synchronize(st);
    const auto got = buf.get(d, size_t(m));
    EXPECT_TRUE(same_bits(want, got)) << "from " << first << ": " << first_difference(want, got);
  }
}

// ---- the ZO pass with bf16 copies -------------------------------------------------------------

std::vector<zof::ZOUpdateTerm> update_terms(int n_update, uint32_t step, uint32_t dist, float mask) {
  std::vector<zof::ZOUpdateTerm> upd;
  for (int j = 0; j < n_update; ++j) {
    zof::ZKey k{0x5eed0000ull + uint64_t(step), step, uint32_t(j)};
    k.dist = dist;
    k.mask = mask;
    upd.push_back({k, 1e-4f * float(j % 7 + 1) * (j % 2 ? -1.f : 1.f)});
  }
  return upd;
}

// One zo_pass over elements [first, first + n) of a tensor of `total` elements, on the host
// backend and on the GPU, compared bit for bit: theta (all of it) and both copies.
void expect_zo_pass_equal(Backend& host, Backend& be, int64_t total, int64_t first, int64_t n,
                          int n_update, bool has_cur, DType copy_t, uint32_t dist, float mask,
                          bool with_minus = true, bool bf16_master = false) {
  const std::string what = "total=" + std::to_string(total) + " first=" + std::to_string(first) +
                           " n=" + std::to_string(n) + " terms=" + std::to_string(n_update) +
                           (has_cur ? " +cur" : " update only") + " copies=" +
                           zof::dtype_name(copy_t) + " dist=" + std::to_string(dist) +
                           " mask=" + std::to_string(mask) + (with_minus ? "" : " no minus") +
                           (bf16_master ? " bf16 master" : "");
  const zof::ZKey round_key{0xC0FFEEull, 11, 0};
  const zof::ZKey* round = bf16_master ? &round_key : nullptr;
  const auto theta0 = uniform(size_t(total), -0.1f, 0.1f, 50);
  const auto upd = update_terms(n_update, 11, dist, mask);
  zof::ZKey cur{0x5eed0000ull, 12, 3};
  cur.dist = dist;
  cur.mask = mask;
  const float lr_wd = n_update ? 3e-6f : 0.f, eps = 1e-3f;
  const size_t bytes = size_t(n) * zof::dtype_size(copy_t);
  // Host: copies as raw bytes of copy_t.
  auto th_host = theta0;
  std::vector<uint8_t> ph(bytes, 0xab), mh(bytes, 0xab);
  host.zo_pass(th_host.data() + first, n, 9, first, upd.data(), n_update, lr_wd, round,
               has_cur ? &cur : nullptr, eps, ph.data(), with_minus ? mh.data() : nullptr, copy_t);
  // Device.
  Buffers buf(be);
  float* th = buf.put(theta0);
  uint8_t* p = buf.put(std::vector<uint8_t>(bytes, 0xab));
  uint8_t* m = buf.put(std::vector<uint8_t>(bytes, 0xab));
  be.zo_pass(th + first, n, 9, first, upd.data(), n_update, lr_wd, round,
             has_cur ? &cur : nullptr, eps, p, with_minus ? m : nullptr, copy_t);
  const auto th_dev = buf.get(th, size_t(total));
  EXPECT_TRUE(same_bits(th_host, th_dev)) << "theta " << what << ": " << first_difference(th_host, th_dev);
  const auto pd = buf.get(p, bytes), md = buf.get(m, bytes);
  EXPECT_TRUE(same_bits(ph, pd)) << "plus " << what << ": " << first_difference(ph, pd);
  EXPECT_TRUE(same_bits(mh, md)) << "minus " << what << ": " << first_difference(mh, md);
}

TEST(GpuDtypes, ZOPassBf16CopiesEqualHost) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto host = zof::make_cpu_backend(1);
  const float inf = std::numeric_limits<float>::infinity();
  // Whole tensors: with and without update terms, up to the most a pass takes (128 terms: the
  // 4 KB that no longer fits a kernel's argument block), fp32 and bf16 copies.
  for (int64_t n : {int64_t(5), int64_t(4099), int64_t(1000003)}) {
    for (int n_update : {0, 1, 3, 45, 128}) {
      if (n > 100000 && n_update > 45) continue;  // the host's z for 128 terms: keep it quick
      for (DType copy_t : {DType::BF16, DType::F32})
        expect_zo_pass_equal(*host, *be, n, 0, n, n_update, true, copy_t, zof::kZGaussian, inf);
    }
  }
  // Sub-ranges at odd first elements, Rademacher z and Sparse MeZO's mask, plus only, update only.
  const int64_t total = 300007;
  for (auto [first, n] : {std::pair<int64_t, int64_t>{3, 1001}, {129, 200000}, {total - 6, 6}}) {
    for (int n_update : {0, 2, 45}) {
      expect_zo_pass_equal(*host, *be, total, first, n, n_update, true, DType::BF16, zof::kZGaussian, inf);
      expect_zo_pass_equal(*host, *be, total, first, n, n_update, true, DType::BF16, zof::kZRademacher, 0.05f);
    }
    expect_zo_pass_equal(*host, *be, total, first, n, 45, true, DType::BF16, zof::kZGaussian, 0.05f, false);
    expect_zo_pass_equal(*host, *be, total, first, n, 45, false, DType::BF16, zof::kZGaussian, inf);
    // A bf16 master: the update rounded stochastically in the same pass.
    for (DType copy_t : {DType::BF16, DType::F32}) {
      expect_zo_pass_equal(*host, *be, total, first, n, 3, true, copy_t, zof::kZGaussian, inf,
                           true, true);
      expect_zo_pass_equal(*host, *be, total, first, n, 3, false, copy_t, zof::kZGaussian, 0.05f,
                           true, true);
    }
  }
  // Copies of other types are refused.
  Buffers buf(*be);
  float* th = buf.put(std::vector<float>(8, 0.f));
  const zof::ZKey key{1, 2, 3};
  EXPECT_THROW(be->zo_pass(th, 8, 0, 0, nullptr, 0, 0.f, &key, 1e-3f, th, nullptr, DType::F16), zof::Error);
  // More terms than a pass takes: an error, not a launch.
  const auto many = update_terms(129, 1, zof::kZGaussian, inf);
  EXPECT_THROW(be->zo_pass(th, 8, 0, 0, many.data(), 129, 0.f, nullptr, 0.f, nullptr, nullptr), zof::Error);
}

// A bf16 master held in 2 bytes (the kernels read and store bf16 theta): the fused pass at odd
// sub-ranges with bf16 and fp32 copies, the momentum and Adam updates through state, and the
// token-table rows, each bit for bit as the host's.
TEST(GpuDtypes, Bf16MasterHeldInTwoBytesEqualsHost) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto host = zof::make_cpu_backend(1);
  const int64_t total = 300007;
  std::vector<uint16_t> theta0(static_cast<size_t>(total));
  const auto wide = uniform(size_t(total), -0.1f, 0.1f, 70);
  for (size_t i = 0; i < theta0.size(); ++i) theta0[i] = zof::f32_to_bf16(wide[i]);
  const zof::ZKey round{0xC0FFEEull, 11, 0};
  zof::ZKey cur{0x5eed0000ull, 12, 3};
  cur.mask = 0.05f;
  const auto upd = update_terms(3, 11, zof::kZGaussian, 0.05f);
  for (auto [first, n] : {std::pair<int64_t, int64_t>{3, 1001}, {129, 200000}, {total - 6, 6}}) {
    for (DType copy_t : {DType::BF16, DType::F32}) {
      const size_t bytes = size_t(n) * zof::dtype_size(copy_t);
      auto th_host = theta0;
      std::vector<uint8_t> ph(bytes, 0xab), mh(bytes, 0xab);
      host->zo_pass(zof::Theta(th_host.data() + first, DType::BF16), n, 9, first, upd.data(), 3,
                    3e-6f, &round, &cur, 1e-3f, ph.data(), mh.data(), copy_t);
      Buffers buf(*be);
      uint16_t* th = buf.put(theta0);
      uint8_t* p = buf.put(std::vector<uint8_t>(bytes, 0xab));
      uint8_t* m = buf.put(std::vector<uint8_t>(bytes, 0xab));
      be->zo_pass(zof::Theta(th + first, DType::BF16), n, 9, first, upd.data(), 3, 3e-6f, &round,
                  &cur, 1e-3f, p, m, copy_t);
      EXPECT_TRUE(same_bits(th_host, buf.get(th, size_t(total)))) << "theta at " << first;
      EXPECT_TRUE(same_bits(ph, buf.get(p, bytes))) << "plus at " << first;
      EXPECT_TRUE(same_bits(mh, buf.get(m, bytes))) << "minus at " << first;
      EXPECT_FALSE(same_bits(th_host, theta0)) << "the update moved nothing";
    }
    for (int kind : {zof::ZOOptimizer::Momentum, zof::ZOOptimizer::Adam}) {
      zof::ZOOptimizer o;
      o.kind = kind, o.lr = 1e-3f, o.wd = 0.01f, o.bc1 = 2.f, o.bc2 = 3.f;
      const auto m0 = uniform(size_t(total), -1e-3f, 1e-3f, 71);
      const auto v0 = uniform(size_t(total), 0.f, 1e-5f, 72);
      auto th_host = theta0;
      auto mh = m0, vh = v0;
      host->zo_update_state(zof::Theta(th_host.data() + first, DType::BF16), mh.data() + first,
                            vh.data() + first, n, 9, first, upd.data(), 3, o, &round);
      Buffers buf(*be);
      uint16_t* th = buf.put(theta0);
      float* m = buf.put(m0);
      float* v = buf.put(v0);
      be->zo_update_state(zof::Theta(th + first, DType::BF16), m + first, v + first, n, 9, first,
                          upd.data(), 3, o, &round);
      EXPECT_TRUE(same_bits(th_host, buf.get(th, size_t(total)))) << "state theta at " << first;
      EXPECT_TRUE(same_bits(mh, buf.get(m, size_t(total)))) << "m at " << first;
      EXPECT_TRUE(same_bits(vh, buf.get(v, size_t(total)))) << "v at " << first;
    }
  }
  // Rows of a bf16 token table.
  const int64_t width = 67, n_rows = 5;
  const std::vector<int32_t> rows = {4, 0, 4000, 17, 4476};
  std::vector<float> ph(size_t(width * n_rows)), mh(ph.size());
  host->zo_rows(zof::Theta(theta0.data(), DType::BF16), width, rows.data(), n_rows, 12, cur, 1e-3f,
                ph.data(), mh.data());
  Buffers buf(*be);
  const uint16_t* table = buf.put(theta0);
  const int32_t* dr = buf.put(rows);
  float* p = buf.put(std::vector<float>(ph.size(), 0.f));
  float* m = buf.put(std::vector<float>(ph.size(), 0.f));
  be->zo_rows(zof::Theta(const_cast<uint16_t*>(table), DType::BF16), width, dr, n_rows, 12, cur,
              1e-3f, p, m);
  EXPECT_TRUE(same_bits(ph, buf.get(p, ph.size())));
  EXPECT_TRUE(same_bits(mh, buf.get(m, mh.size())));
  // widen: bf16 to fp32, exactly.
  float* w = buf.put(std::vector<float>(size_t(total), 0.f));
  be->widen(table, DType::BF16, w, total);
  const auto wd = buf.get(w, size_t(total));
  for (int64_t i = 0; i < total; ++i) ASSERT_EQ(wd[i], zof::bf16_to_f32(theta0[i])) << i;
}

// Many passes queued back to back on one stream, each with its own terms (counts 1..60, fresh
// keys and coefficients, the host array rewritten right after each call), behind a long product
// so that they pile up: every pass must read its own terms (the staging slots of the terms are
// reused only once their kernel is done). The momentum/Adam update through state likewise.
TEST(GpuDtypes, ZOPassesQueuedWithDifferentTermsEqualHost) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  auto host = zof::make_cpu_backend(1);
  const float inf = std::numeric_limits<float>::infinity();
  const int kPasses = 300;
  const int64_t kSlice = 4001;  // pass i updates elements [i * kSlice, (i + 1) * kSlice)
  const int64_t total = kPasses * kSlice;
  const auto theta0 = uniform(size_t(total), -0.1f, 0.1f, 60);
  const zof::ZKey cur{77, 3, 1};
  const float eps = 1e-3f;

  zof::Stream* st = be->create_stream();
  zof::Stream* busy = be->create_stream();
  zof::Event* ready = be->create_event();
  Buffers buf(*be);
  float* th = buf.put(theta0);
  uint16_t* plus = buf.put(std::vector<uint16_t>(size_t(total), 0));
  float* minus = buf.put(std::vector<float>(size_t(total), 0.f));
  // A long fp32 product on another stream, which st waits for before the passes run.
  const int64_t L = 4096;
  const float* a = buf.put(uniform(size_t(L * L), -1, 1, 61));
  float* c = buf.put(std::vector<float>(size_t(L * L), 0.f));
  be->synchronize(nullptr);
  be->matmul(a, a, nullptr, c, L, L, L, busy);
  be->matmul(a, a, nullptr, c, L, L, L, busy);
  be->record(ready, busy);
  be->wait(st, ready);

  auto th_host = theta0;
  std::vector<uint16_t> plus_host(static_cast<size_t>(total));
  std::vector<float> minus_host(static_cast<size_t>(total));
  std::vector<zof::ZOUpdateTerm> upd;
  for (int i = 0; i < kPasses; ++i) {
    const int n_update = 1 + (i * 37) % 60;
    upd = update_terms(n_update, uint32_t(100 + i), i % 3 ? zof::kZGaussian : zof::kZRademacher,
                       i % 5 ? inf : 0.08f);
    const int64_t first = int64_t(i) * kSlice;
    host->zo_pass(th_host.data() + first, kSlice, 4, first, upd.data(), n_update, 2e-6f, &cur, eps,
                  plus_host.data() + first, nullptr, DType::BF16);
    host->zo_pass(th_host.data() + first, kSlice, 4, first, nullptr, 0, 0.f, &cur, -eps,
                  minus_host.data() + first, nullptr, DType::F32);
    be->zo_pass(th + first, kSlice, 4, first, upd.data(), n_update, 2e-6f, &cur, eps, plus + first,
                nullptr, DType::BF16, st);
    be->zo_pass(th + first, kSlice, 4, first, nullptr, 0, 0.f, &cur, -eps, minus + first, nullptr,
                DType::F32, st);
    for (auto& t : upd) t.coef = std::numeric_limits<float>::quiet_NaN();  // the caller's array is free again
  }
  be->synchronize(st);
  const auto th_dev = buf.get(th, size_t(total));
  EXPECT_TRUE(same_bits(th_host, th_dev)) << "theta: " << first_difference(th_host, th_dev);
  const auto p_dev = buf.get(plus, size_t(total));
  EXPECT_TRUE(same_bits(plus_host, p_dev)) << "plus (bf16): " << first_difference(plus_host, p_dev);
  const auto m_dev = buf.get(minus, size_t(total));
  EXPECT_TRUE(same_bits(minus_host, m_dev)) << "minus (fp32): " << first_difference(minus_host, m_dev);

  // zo_update_state, queued likewise behind a long product, 45 terms and more.
  for (int kind : {zof::ZOOptimizer::Momentum, zof::ZOOptimizer::Adam}) {
    zof::ZOOptimizer o;
    o.kind = kind;
    o.lr = 1e-3f;
    o.wd = 0.01f;
    o.bc1 = 10.f;
    o.bc2 = 1000.f;
    auto t_host = theta0;
    std::vector<float> m_host(size_t(total), 0.f), v_host(size_t(total), 0.f);
    float* t_dev = buf.put(theta0);
    float* m_dev = buf.put(m_host);
    float* v_dev = buf.put(v_host);
    be->synchronize(nullptr);
    be->matmul(a, a, nullptr, c, L, L, L, busy);
    be->record(ready, busy);
    be->wait(st, ready);
    for (int i = 0; i < 40; ++i) {
      const int n_update = 45 + (i * 13) % 84;  // 45..128
      upd = update_terms(n_update, uint32_t(500 + i), zof::kZGaussian, inf);
      const int64_t first = int64_t(i % 7) * kSlice;  // overlapping passes: the order matters
      host->zo_update_state(t_host.data() + first, m_host.data() + first, v_host.data() + first,
                            kSlice, 4, first, upd.data(), n_update, o, nullptr);
      be->zo_update_state(t_dev + first, m_dev + first, v_dev + first, kSlice, 4, first, upd.data(),
                          n_update, o, nullptr, st);
      for (auto& t : upd) t.coef = std::numeric_limits<float>::quiet_NaN();
    }
    be->synchronize(st);
    EXPECT_TRUE(same_bits(t_host, buf.get(t_dev, size_t(total)))) << "theta, optimizer " << kind;
    EXPECT_TRUE(same_bits(m_host, buf.get(m_dev, size_t(total)))) << "m, optimizer " << kind;
    EXPECT_TRUE(same_bits(v_host, buf.get(v_dev, size_t(total)))) << "v, optimizer " << kind;
  }
}

// alloc() no longer waits for the device unless a free may still be pending: a buffer freed
// while a kernel queued before the free reads it, then allocated again (the pool hands the same
// block back) and written on another stream at once, must not change what that kernel read;
// likewise when the block goes to another backend on the same device.
TEST(GpuDtypes, AllocAfterPendingFreeIsSafeOnEveryStream) {
  ZOF_REQUIRE_GPU();
  auto be = gpu();
  zof::Stream* other = be->create_stream();
  const int64_t L = 4096;
  const auto a = uniform(size_t(L * L), -1, 1, 70);
  Buffers buf(*be);
  const float* da = buf.put(a);
  float* y = buf.put(std::vector<float>(size_t(L * L), 0.f));
  float* y2 = buf.put(std::vector<float>(size_t(L * L), 0.f));
  be->synchronize(nullptr);
  be->matmul(da, da, nullptr, y2, L, L, L);  // the expected product, no free involved
  const auto want = buf.get(y2, size_t(L * L));
  for (int rep = 0; rep < 3; ++rep) {
    float* b = static_cast<float*>(be->alloc(size_t(L * L) * sizeof(float)));
    be->copy_device(b, da, size_t(L * L) * sizeof(float), nullptr);
    be->matmul(b, b, nullptr, y, L, L, L);  // long, reads b
    be->free(b);                            // returned once the product is done
    float* b2 = static_cast<float*>(be->alloc(size_t(L * L) * sizeof(float)));
    std::vector<float> zeros(size_t(L * L), 0.f);
    be->copy_to_device(b2, zeros.data(), zeros.size() * sizeof(float), other);  // at once, elsewhere
    be->synchronize(other);
    be->free(b2);
    EXPECT_TRUE(same_bits(want, buf.get(y, size_t(L * L)))) << "rep " << rep;
  }
  // Two backends on one device share its pool: a block one frees may go to the other at once.
  auto be2 = gpu();
  zof::Stream* other2 = be2->create_stream();
  for (int rep = 0; rep < 3; ++rep) {
    float* b = static_cast<float*>(be->alloc(size_t(L * L) * sizeof(float)));
    be->copy_device(b, da, size_t(L * L) * sizeof(float), nullptr);
    be->matmul(b, b, nullptr, y, L, L, L);
    be->free(b);
    float* b2 = static_cast<float*>(be2->alloc(size_t(L * L) * sizeof(float)));
    std::vector<float> zeros(size_t(L * L), 0.f);
    be2->copy_to_device(b2, zeros.data(), zeros.size() * sizeof(float), other2);
    be2->synchronize(other2);
    be2->free(b2);
    EXPECT_TRUE(same_bits(want, buf.get(y, size_t(L * L)))) << "two backends, rep " << rep;
  }
}

}  // namespace
