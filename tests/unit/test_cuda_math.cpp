// The CUDA kernels' per-element arithmetic (src/cuda/op_math.h) run on the CPU against the
// reference backend: activations, RMSNorm and LayerNorm row math with Welford merged as the
// kernel's warp butterfly merges it, RoPE angles and rotation, the online softmax of the
// attention kernels replayed block by block, the cross-entropy from (max, sum of exp), and the
// tangent kernels (forward-mode AD) against jvp_ops.h's float64 loops.
// CI has no GPU; this is where the math of the CUDA backend is checked there.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cuda/op_math.h"
#include "zof/backend.h"
#include "zof/config.h"
#include "cuda/cuda_backend.h"
#include "zof/error.h"
#include "cpu/jvp_ops.h"

namespace {

namespace om = zof::opmath;

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |got - want| / max |want| under tol, no NaN or inf on either side.
::testing::AssertionResult close(const std::vector<float>& want, const std::vector<float>& got,
                                 double tol) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << "size mismatch";
  double scale = 0, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i]) || !std::isfinite(got[i]))
      return ::testing::AssertionFailure() << "non-finite at " << i << ": " << got[i] << " vs " << want[i];
    scale = std::max(scale, std::fabs(double(want[i])));
    const double e = std::fabs(double(got[i]) - double(want[i]));
    if (e > err) err = e, worst = i;
  }
  const double rel = err / std::max(scale, 1e-30);
  if (rel <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << rel << " > " << tol << " at " << worst
                                       << ": " << got[worst] << " vs " << want[worst];
}

// The tolerance of the GPU conformance test (fp32); the formulas must meet it on the CPU too.
constexpr double kTol = 1e-5;

TEST(CudaMath, Activations) {
  auto ref = zof::make_reference_backend();
  for (auto [lo, hi] : {std::pair{-8.0f, 8.0f}, std::pair{-200.0f, 200.0f}}) {
    const size_t n = 20001;
    auto x = uniform(n, lo, hi, 1), up = uniform(n, -3, 3, 2);
    std::vector<float> want(n), got(n);
    ref->silu_mul(x.data(), up.data(), want.data(), int64_t(n));
    for (size_t i = 0; i < n; ++i) got[i] = om::silu_mul(x[i], up[i]);
    EXPECT_TRUE(close(want, got, 1e-6)) << "silu_mul " << lo;
    for (auto [op, fn, name] :
         {std::tuple{&zof::Backend::gelu_tanh, &om::gelu_tanh, "gelu_tanh"},
          std::tuple{&zof::Backend::gelu_erf, &om::gelu_erf, "gelu_erf"},
          std::tuple{&zof::Backend::relu, &om::relu, "relu"}}) {
      want = x;
      ((*ref).*op)(want.data(), int64_t(n), nullptr);
      for (size_t i = 0; i < n; ++i) got[i] = fn(x[i]);
      EXPECT_TRUE(close(want, got, 1e-6)) << name << " " << lo;
    }
  }
  EXPECT_TRUE(std::isnan(om::relu(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(om::silu_mul(-1000.0f, 1.0f), 0.0f);
  EXPECT_EQ(om::gelu_tanh(-1000.0f), 0.0f);
  EXPECT_EQ(om::gelu_erf(1000.0f), 1000.0f);
}

// Welford states of 256 threads over strided slices, merged by the kernel's butterfly
// (xor 16..1 within each warp, then the warp leaders the same way).
om::Welford block_welford(const float* x, int64_t dim, int threads) {
  std::vector<om::Welford> t(threads);
  for (int th = 0; th < threads; ++th)
    for (int64_t i = th; i < dim; i += threads) om::welford_push(t[th], x[i]);
  auto butterfly = [](std::vector<om::Welford>& lanes) {
    for (int o = 16; o > 0; o >>= 1) {
      std::vector<om::Welford> next(lanes.size());
      for (size_t l = 0; l < lanes.size(); ++l) next[l] = om::welford_merge(lanes[l], lanes[l ^ o]);
      lanes = next;
    }
  };
  std::vector<om::Welford> leaders(32);
  for (int w = 0; w < threads / 32; ++w) {
    std::vector<om::Welford> lanes(t.begin() + w * 32, t.begin() + w * 32 + 32);
    butterfly(lanes);
    leaders[w] = lanes[0];
  }
  butterfly(leaders);
  return leaders[0];
}

TEST(CudaMath, Norms) {
  auto ref = zof::make_reference_backend();
  for (int64_t dim : {1, 7, 64, 768, 1001, 5120}) {
    const int64_t rows = 3;
    auto x = uniform(size_t(rows * dim), -2, 2, 4);
    auto w = uniform(size_t(dim), 0.5f, 1.5f, 5), b = uniform(size_t(dim), -1, 1, 6);
    for (float shift : {0.0f, 30.0f}) {  // a large mean: the variance must not cancel
      auto xs = x;
      for (auto& a : xs) a += shift;
      std::vector<float> want(xs.size()), got(xs.size());
      const int threads = dim >= 256 ? 256 : int((dim + 31) / 32 * 32);
      ref->layer_norm(xs.data(), w.data(), b.data(), want.data(), rows, dim, 1e-5f);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xs.data() + r * dim;
        const om::Welford st = block_welford(xr, dim, threads);
        EXPECT_EQ(st.n, float(dim));
        const float inv = om::layer_norm_inv(st, 1e-5f);
        for (int64_t i = 0; i < dim; ++i) got[r * dim + i] = (xr[i] - st.mean) * inv * w[i] + b[i];
      }
      EXPECT_TRUE(close(want, got, kTol)) << "layer_norm dim=" << dim << " shift=" << shift;
      ref->rms_norm(xs.data(), w.data(), want.data(), rows, dim, 1e-6f);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xs.data() + r * dim;
        float ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
        const float inv = om::rms_inv(ss, dim, 1e-6f);
        for (int64_t i = 0; i < dim; ++i) got[r * dim + i] = xr[i] * inv * w[i];
      }
      EXPECT_TRUE(close(want, got, kTol)) << "rms_norm dim=" << dim << " shift=" << shift;
    }
  }
}

TEST(CudaMath, WelfordMergeEqualsOnePass) {
  auto x = uniform(1000, 29, 31, 7);
  om::Welford all, a, b;
  for (size_t i = 0; i < x.size(); ++i) {
    om::welford_push(all, x[i]);
    om::welford_push(i < 300 ? a : b, x[i]);
  }
  const om::Welford m = om::welford_merge(a, b);
  EXPECT_EQ(m.n, all.n);
  EXPECT_NEAR(m.mean, all.mean, 1e-5);
  EXPECT_NEAR(m.m2 / m.n, all.m2 / all.n, 1e-5);
  const om::Welford empty;
  EXPECT_EQ(om::welford_merge(empty, a).mean, a.mean);
  EXPECT_EQ(om::welford_merge(a, empty).m2, a.m2);
}

TEST(CudaMath, Rope) {
  auto ref = zof::make_reference_backend();
  std::mt19937 rng(8);
  for (int64_t head_dim : {2, 64, 80, 128}) {
    for (float theta : {10000.0f, 500000.0f}) {
      const int64_t rows = 40, heads = 3, half = head_dim / 2;
      auto x = uniform(size_t(rows * heads * head_dim), -1, 1, 9);
      std::vector<int32_t> pos(rows);
      for (auto& p : pos) p = int32_t(rng() % 8192);
      auto want = x, got = x;
      const std::vector<float> inv = zof::rope_default_inv_freq(theta, head_dim);
      ref->rope(want.data(), pos.data(), rows, heads, head_dim, head_dim, inv.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < half; ++i) {
          const float angle = om::rope_angle(pos[r], om::rope_inv_freq(i, head_dim, theta));
          const float c = std::cos(angle), s = std::sin(angle);
          for (int64_t h = 0; h < heads; ++h) {
            float* lo = got.data() + (r * heads + h) * head_dim + i;
            om::rope_rotate(lo[0], lo[half], c, s);
          }
        }
      EXPECT_TRUE(close(want, got, kTol)) << "head_dim=" << head_dim << " theta=" << theta;
    }
  }
}

// The generic attention kernel's walk for one (batch, kv head): keys in blocks of 32, each
// block's scores, its max, softmax_advance, the probabilities and the rescaled outputs.
std::vector<float> attention_online(const std::vector<float>& q, const std::vector<float>& k,
                                    const std::vector<float>& v, const std::vector<uint8_t>& mask,
                                    int64_t Tq, int64_t Tk, int64_t D, int64_t q_offset,
                                    float scale, int64_t block) {
  std::vector<float> out(size_t(Tq * D));
  for (int64_t i = 0; i < Tq; ++i) {
    float m = -INFINITY, l = 0;
    std::vector<float> o(D, 0.0f);
    const int64_t lim = std::min(Tk - 1, q_offset + i);
    for (int64_t j0 = 0; j0 <= lim; j0 += block) {
      std::vector<float> s(block, -INFINITY);
      float bmax = -INFINITY;
      for (int64_t jj = 0; jj < block && j0 + jj <= lim; ++jj) {
        const int64_t j = j0 + jj;
        if (!mask.empty() && !mask[j]) continue;
        float dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[i * D + d] * scale * k[j * D + d];
        s[jj] = dot;
        bmax = std::max(bmax, dot);
      }
      if (bmax == -INFINITY) continue;
      const om::SoftmaxStep st = om::softmax_advance(m, bmax);
      float sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - st.shift));
      l = l * st.correction + sum;
      for (int64_t d = 0; d < D; ++d) {
        o[d] *= st.correction;
        for (int64_t jj = 0; jj < block && j0 + jj <= lim; ++jj) o[d] += s[jj] * v[(j0 + jj) * D + d];
      }
    }
    const float inv = om::softmax_inv_sum(l);
    for (int64_t d = 0; d < D; ++d) out[i * D + d] = o[d] * inv;
  }
  return out;
}

TEST(CudaMath, OnlineSoftmaxAttention) {
  auto ref = zof::make_reference_backend();
  struct Case {
    int64_t Tq, Tk, D, q_offset;
    int mask;  // 0 none, 1 left padding (early queries see no key), 2 random
  };
  for (Case c : {Case{1, 1, 8, 0, 0}, Case{70, 70, 64, 0, 0}, Case{5, 100, 16, 95, 2},
                 Case{40, 40, 5, 0, 1}, Case{3, 200, 128, 197, 1}}) {
    auto q = uniform(size_t(c.Tq * c.D), -2, 2, 10), k = uniform(size_t(c.Tk * c.D), -2, 2, 11);
    auto v = uniform(size_t(c.Tk * c.D), -1, 1, 12);
    std::vector<uint8_t> mask;
    if (c.mask) {
      mask.assign(size_t(c.Tk), 1);
      std::mt19937 rng(13);
      for (int64_t j = 0; j < c.Tk; ++j)
        mask[j] = c.mask == 1 ? j >= c.Tk / 3 : rng() % 4 != 0;
    }
    std::vector<float> want(q.size());
    const float scale = 1.0f / std::sqrt(float(c.D));
    ref->attention(q.data(), k.data(), v.data(), want.data(), mask.empty() ? nullptr : mask.data(),
                   1, c.Tq, c.Tk, 1, 1, c.D, c.q_offset, scale);
    for (int64_t block : {32, 64}) {  // the generic and the tensor-core kernel's key blocks
      auto got = attention_online(q, k, v, mask, c.Tq, c.Tk, c.D, c.q_offset, scale, block);
      EXPECT_TRUE(close(want, got, kTol)) << "Tq=" << c.Tq << " Tk=" << c.Tk << " D=" << c.D
                                          << " block=" << block;
    }
  }
}

TEST(CudaMath, SoftmaxMergeOfTwoHalves) {
  auto s = uniform(300, -20, 20, 14);
  auto state = [&](size_t b, size_t e) {
    om::SoftmaxState st;
    for (size_t i = b; i < e; ++i) st.m = std::max(st.m, s[i]);
    for (size_t i = b; i < e; ++i) st.l += std::exp(s[i] - st.m);
    return st;
  };
  float fa = 0, fb = 0;
  const om::SoftmaxState all = state(0, 300), merged = om::softmax_merge(state(0, 123), state(123, 300), fa, fb);
  EXPECT_EQ(merged.m, all.m);
  EXPECT_NEAR(merged.l, all.l, 1e-5 * all.l);
  const om::SoftmaxState empty;  // a split that saw only masked keys
  const om::SoftmaxState with_empty = om::softmax_merge(empty, all, fa, fb);
  EXPECT_EQ(fa, 0.0f);
  EXPECT_EQ(with_empty.l, all.l);
  const om::SoftmaxState none = om::softmax_merge(empty, empty, fa, fb);
  EXPECT_EQ(none.l, 0.0f);
  EXPECT_EQ(om::softmax_inv_sum(none.l), 0.0f);
}

TEST(CudaMath, CrossEntropy) {
  auto ref = zof::make_reference_backend();
  for (int64_t vocab : {1, 2, 17, 1000, 50257}) {
    const int64_t rows = 4;
    auto logits = uniform(size_t(rows * vocab), -10, 10, 15);
    logits[0] = 1000.0f;  // row 0 confident in token 0: a tiny loss keeps its digits
    std::vector<int32_t> targets = {0, int32_t(vocab - 1), -100, int32_t(vocab / 2)};
    std::vector<float> want(rows), got(rows);
    ref->cross_entropy(logits.data(), targets.data(), want.data(), rows, vocab);
    for (int64_t r = 0; r < rows; ++r) {
      const float* lr = logits.data() + r * vocab;
      if (targets[r] < 0) {
        got[r] = 0;
        continue;
      }
      float mx = -INFINITY, rest = 0, at_max = 0;
      for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, lr[j]);
      for (int64_t j = 0; j < vocab; ++j) om::ce_accumulate(lr[j], mx, rest, at_max);
      got[r] = om::ce_nll(mx, rest, at_max, lr[targets[r]]);
    }
    EXPECT_TRUE(close(want, got, kTol)) << "vocab=" << vocab;
    EXPECT_EQ(got[2], 0.0f);
  }
}

// ---- tangent kernels (src/cuda/jvp.cu), replayed on the CPU against jvp_ops.h in float64 ----

std::vector<float> f32(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }
std::vector<double> f64(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

TEST(CudaMath, TangentPointwise) {
  // Wide inputs: the tails (|x| > 10, g < -88) must stay finite and right.
  auto x = uniform(4000, -12, 12, 40), dx = uniform(4000, -1, 1, 41), up = uniform(4000, -2, 2, 42),
       dup = uniform(4000, -1, 1, 43);
  for (float t : {-200.f, -90.f, -30.f, -10.5f, 0.f, 10.5f, 30.f, 200.f}) {
    x.push_back(t);
    dx.push_back(0.75f);
    up.push_back(1.5f);
    dup.push_back(-0.5f);
  }
  const size_t n = x.size();
  using zof::Activation;
  for (auto [act, name] : {std::pair{Activation::GeluTanh, "gelu_tanh"},
                           std::pair{Activation::GeluErf, "gelu_erf"},
                           std::pair{Activation::ReLU, "relu"}}) {
    std::vector<double> want(n);
    zof::jvp::activation_jvp<double>(act, f64(x).data(), f64(dx).data(), want.data(), (int64_t)n);
    std::vector<float> got(n);
    for (size_t i = 0; i < n; ++i) {
      const float slope = act == Activation::GeluTanh  ? om::gelu_tanh_slope(x[i])
                          : act == Activation::GeluErf ? om::gelu_erf_slope(x[i])
                                                       : om::relu_slope(x[i]);
      got[i] = slope * dx[i];
    }
    EXPECT_TRUE(close(f32(want), got, kTol)) << name;
  }
  std::vector<double> want(n);
  zof::jvp::silu_mul_jvp<double>(f64(x).data(), f64(dx).data(), f64(up).data(), f64(dup).data(),
                                 want.data(), (int64_t)n);
  std::vector<float> got(n);
  for (size_t i = 0; i < n; ++i) got[i] = om::silu_mul_jvp(x[i], dx[i], up[i], dup[i]);
  EXPECT_TRUE(close(f32(want), got, kTol)) << "silu_mul";
}

// The norm tangent kernels' row math: fp32 sums, then the op_math formulas per element.
TEST(CudaMath, TangentNorms) {
  for (int64_t dim : {1, 64, 288, 1000}) {
    const int64_t rows = 3;
    // An offset of 30 in the LayerNorm rows: the two-pass centred sums keep the variance.
    auto x = uniform(size_t(rows * dim), -2, 2, 50), xo = x, dx = uniform(size_t(rows * dim), -1, 1, 51);
    for (auto& v : xo) v += 30.f;
    auto w = uniform(size_t(dim), 0.5, 1.5, 52), dw = uniform(size_t(dim), -1, 1, 53),
         db = uniform(size_t(dim), -1, 1, 54);
    const float eps = 1e-5f;
    std::vector<double> want(x.size());
    zof::jvp::rms_norm_jvp<double>(f64(x).data(), f64(dx).data(), f64(w).data(), f64(dw).data(),
                                   want.data(), rows, dim, eps);
    std::vector<float> got(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * dim;
      const float* dr = dx.data() + r * dim;
      float ss = 0, sd = 0;
      for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i], sd += xr[i] * dr[i];
      const float inv = om::rms_inv(ss, dim, eps), dinv = om::rms_norm_dinv(inv, sd, dim);
      for (int64_t i = 0; i < dim; ++i)
        got[r * dim + i] = om::norm_jvp(xr[i], dr[i], inv, dinv, w[i], dw[i]);
    }
    EXPECT_TRUE(close(f32(want), got, kTol)) << "rms_norm_jvp dim=" << dim;

    zof::jvp::layer_norm_jvp<double>(f64(xo).data(), f64(dx).data(), f64(w).data(), f64(dw).data(),
                                     f64(db).data(), want.data(), rows, dim, eps);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = xo.data() + r * dim;
      const float* dr = dx.data() + r * dim;
      float sx = 0, sdx = 0;
      for (int64_t i = 0; i < dim; ++i) sx += xr[i], sdx += dr[i];
      const float mean = sx / float(dim), dmean = sdx / float(dim);
      float var = 0, cov = 0;
      for (int64_t i = 0; i < dim; ++i) {
        var += (xr[i] - mean) * (xr[i] - mean);
        cov += (xr[i] - mean) * (dr[i] - dmean);
      }
      const float inv = 1.0f / std::sqrt(var / float(dim) + eps);
      const float dinv = om::layer_norm_dinv(inv, cov, dim);
      for (int64_t i = 0; i < dim; ++i)
        got[r * dim + i] = om::norm_jvp(xr[i] - mean, dr[i] - dmean, inv, dinv, w[i], dw[i]) + db[i];
    }
    // dim 1: x - mean is 0 and the output tangent is db alone.
    EXPECT_TRUE(close(f32(want), got, kTol)) << "layer_norm_jvp dim=" << dim;
  }
}

// The attention tangent kernel's two passes for each query, in fp32: pass 1 the online max, sum
// and sum of e ds; pass 2 each key's terms with its final weight.
std::vector<float> attention_jvp_two_pass(const std::vector<float>& q, const std::vector<float>& dq,
                                          const std::vector<float>& k, const std::vector<float>& dk,
                                          const std::vector<float>& v, const std::vector<float>& dv,
                                          const std::vector<uint8_t>& mask, int64_t B, int64_t S,
                                          int64_t H, int64_t Hkv, int64_t D, float scale) {
  std::vector<float> out(q.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t hk = h / (H / Hkv), qo = ((b * S + i) * H + h) * D;
        auto score = [&](int64_t j, float& sc, float& ds) {
          const int64_t ko = ((b * S + j) * Hkv + hk) * D;
          sc = 0, ds = 0;
          for (int64_t d = 0; d < D; ++d) {
            sc += q[qo + d] * scale * k[ko + d];
            ds += dq[qo + d] * scale * k[ko + d] + q[qo + d] * scale * dk[ko + d];
          }
        };
        float m = om::neg_inf(), l = 0, sds = 0;
        for (int64_t j = 0; j <= i; ++j) {
          if (!mask.empty() && !mask[b * S + j]) continue;
          float sc, ds;
          score(j, sc, ds);
          const om::SoftmaxStep st = om::softmax_advance(m, sc);
          const float e = std::exp(sc - st.shift);
          l = l * st.correction + e;
          sds = sds * st.correction + e * ds;
        }
        std::vector<float> acc(D, 0.0f);
        const float inv = om::softmax_inv_sum(l);
        if (inv > 0)
          for (int64_t j = 0; j <= i; ++j) {
            if (!mask.empty() && !mask[b * S + j]) continue;
            float sc, ds;
            score(j, sc, ds);
            const float p = std::exp(sc - m) * inv;
            const int64_t vo = ((b * S + j) * Hkv + hk) * D;
            for (int64_t d = 0; d < D; ++d) acc[d] += om::attn_jvp_term(p, ds, sds * inv, v[vo + d], dv[vo + d]);
          }
        for (int64_t d = 0; d < D; ++d) out[qo + d] = acc[d];
      }
  return out;
}

TEST(CudaMath, TangentAttentionTwoPass) {
  struct Case {
    int64_t B, S, H, Hkv, D;
    int mask;  // 0 none, 1 row 1's first keys masked (its first queries see no key), 2 random
  };
  for (Case c : {Case{1, 1, 1, 1, 8, 0}, Case{2, 40, 6, 2, 64, 1}, Case{1, 70, 4, 1, 5, 2},
                 Case{1, 9, 2, 2, 128, 0}}) {
    const size_t nq = size_t(c.B * c.S * c.H * c.D), nk = size_t(c.B * c.S * c.Hkv * c.D);
    auto q = uniform(nq, -2, 2, 60), dq = uniform(nq, -1, 1, 61), k = uniform(nk, -2, 2, 62),
         dk = uniform(nk, -1, 1, 63), v = uniform(nk, -1, 1, 64), dv = uniform(nk, -1, 1, 65);
    std::vector<uint8_t> mask;
    if (c.mask) {
      mask.assign(size_t(c.B * c.S), 1);
      std::mt19937 rng(66);
      for (int64_t j = 0; j < c.B * c.S; ++j)
        mask[j] = c.mask == 1 ? !(j >= c.S && j < c.S + 3) : rng() % 4 != 0;
    }
    const float scale = 1.0f / std::sqrt(float(c.D));
    std::vector<double> want(nq);
    zof::jvp::attention_jvp<double>(f64(q).data(), f64(dq).data(), f64(k).data(), f64(dk).data(),
                                    f64(v).data(), f64(dv).data(), want.data(),
                                    mask.empty() ? nullptr : mask.data(), c.B, c.S, c.H, c.Hkv,
                                    c.D, double(scale));
    const auto got = attention_jvp_two_pass(q, dq, k, dk, v, dv, mask, c.B, c.S, c.H, c.Hkv, c.D, scale);
    EXPECT_TRUE(close(f32(want), got, kTol)) << "S=" << c.S << " H=" << c.H << " Hkv=" << c.Hkv
                                             << " D=" << c.D << " mask=" << c.mask;
    if (c.mask == 1) {  // row 1's first query sees no key: a zero tangent, not NaN
      for (int64_t d = 0; d < c.H * c.D; ++d) EXPECT_EQ(got[size_t(c.S * c.H * c.D + d)], 0.0f);
    }
  }
}

TEST(CudaMath, TangentCrossEntropy) {
  for (int64_t vocab : {2, 300, 32000}) {
    const int64_t rows = 3;
    auto lg = uniform(size_t(rows * vocab), -8, 8, 70), dl = uniform(size_t(rows * vocab), -1, 1, 71);
    const std::vector<int32_t> targets{1, -1, int32_t(vocab - 1)};
    std::vector<double> want(rows);
    zof::jvp::cross_entropy_jvp<double>(f64(lg).data(), f64(dl).data(), targets.data(), want.data(),
                                        rows, vocab);
    std::vector<float> got(rows, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] < 0) continue;
      const float* x = lg.data() + r * vocab;
      const float* d = dl.data() + r * vocab;
      const float mx = *std::max_element(x, x + vocab);
      float sum = 0, dot = 0;
      for (int64_t j = 0; j < vocab; ++j) {
        const float e = std::exp(x[j] - mx);
        sum += e;
        dot += e * d[j];
      }
      got[r] = om::ce_jvp(sum, dot, d[targets[r]]);
    }
    EXPECT_TRUE(close(f32(want), got, kTol)) << "vocab=" << vocab;
    EXPECT_EQ(got[1], 0.0f);
  }
}

// Without a GPU (or a CUDA build) the query answers 0 and the factory says what to do.
TEST(CudaMath, DeviceQueryNeverThrows) {
  const int n = zof::cuda_device_count();
#if !defined(ZOF_WITH_CUDA)
  EXPECT_EQ(n, 0);  // a build without the backend sees no device, whatever the machine holds
#endif
  // Every counted device can be described, and the count's bound is exact.
  for (int d = 0; d < n; ++d) {
    const zof::CudaDeviceInfo info = zof::cuda_device_info(d);
    EXPECT_EQ(info.device, d);
    EXPECT_GT(info.sm_count, 0) << info.name;
    EXPECT_GT(info.total_memory, 0u) << info.name;
  }
  EXPECT_THROW(zof::cuda_device_info(n), zof::Error);
  EXPECT_THROW(zof::cuda_device_info(-1), zof::Error);
  if (n == 0) {
    EXPECT_THROW(zof::make_cuda_backend(0), zof::Error);
  }
  EXPECT_THROW(zof::make_cuda_backend(n), zof::Error);
}

}  // namespace
