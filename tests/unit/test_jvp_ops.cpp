// The tangent rule of every op of the JVP walk (jvp.h) against a central finite difference of
// the float64 primal: (f(x + h dx) - f(x - h dx)) / 2h with h = 1e-6, whose own error is about
// 1e-10 relative. The float64 tangent must agree to 1e-8, the fp32 one (inputs rounded to fp32)
// to 1e-5. Inputs are random, with GQA, masked keys, a query that sees no key, and odd sizes.
#include <cmath>
#include <functional>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "zof/backend.h"
#include "zof/config.h"
#include "zof/error.h"
#include "cpu/jvp_ops.h"
#include "zo/jvp.h"

namespace {

using Vec = std::vector<double>;
using Inputs = std::vector<Vec>;

std::vector<float> to_f32(const Vec& v) { return std::vector<float>(v.begin(), v.end()); }

Vec randn(std::mt19937_64& rng, size_t n, double scale = 1.0, double shift = 0.0) {
  std::normal_distribution<double> nd(0.0, 1.0);
  Vec v(n);
  for (auto& x : v) x = shift + scale * nd(rng);
  return v;
}

// An op under test: its float64 primal as a function of the differentiable inputs, and its
// tangent in float64 and in fp32 (inputs and tangents rounded to fp32).
struct Op {
  std::function<Vec(const Inputs&)> primal;
  std::function<Vec(const Inputs& x, const Inputs& dx)> tangent64;
  std::function<Vec(const std::vector<std::vector<float>>& x,
                    const std::vector<std::vector<float>>& dx)>
      tangent32;
};

struct Errors {
  double f64 = 0, f32 = 0, scale = 0;
};

// Max |tangent - finite difference| over the outputs, relative to max |finite difference|.
Errors check(const Op& op, const Inputs& x, std::mt19937_64& rng) {
  const double h = 1e-6;
  Inputs dx, xp = x, xm = x;
  for (size_t i = 0; i < x.size(); ++i) {
    dx.push_back(randn(rng, x[i].size()));
    for (size_t e = 0; e < x[i].size(); ++e) {
      xp[i][e] += h * dx[i][e];
      xm[i][e] -= h * dx[i][e];
    }
  }
  const Vec fp = op.primal(xp), fm = op.primal(xm);
  Vec fd(fp.size());
  Errors err;
  for (size_t e = 0; e < fd.size(); ++e) {
    fd[e] = (fp[e] - fm[e]) / (2 * h);
    err.scale = std::max(err.scale, std::fabs(fd[e]));
  }
  const Vec t64 = op.tangent64(x, dx);
  std::vector<std::vector<float>> x32, dx32;
  for (size_t i = 0; i < x.size(); ++i) {
    x32.push_back(to_f32(x[i]));
    dx32.push_back(to_f32(dx[i]));
  }
  const Vec t32 = op.tangent32(x32, dx32);
  EXPECT_EQ(t64.size(), fd.size());
  EXPECT_EQ(t32.size(), fd.size());
  for (size_t e = 0; e < fd.size() && e < t64.size() && e < t32.size(); ++e) {
    err.f64 = std::max(err.f64, std::fabs(t64[e] - fd[e]));
    err.f32 = std::max(err.f32, std::fabs(t32[e] - fd[e]));
    if (!std::isfinite(t32[e])) err.f32 = INFINITY;
  }
  err.f64 /= err.scale;
  err.f32 /= err.scale;
  return err;
}

#define EXPECT_TANGENT_OK(e, what)                                            \
  do {                                                                        \
    EXPECT_GT((e).scale, 1e-3) << what << ": the output barely moves";        \
    EXPECT_LT((e).f64, 1e-8) << what << " (float64)";                         \
    EXPECT_LT((e).f32, 1e-5) << what << " (fp32)";                            \
    std::printf("  %-28s rel err f64 %.2e  f32 %.2e\n", what, (e).f64, (e).f32); \
  } while (0)

template <class T>
Vec as_vec(const std::vector<T>& v) {
  return Vec(v.begin(), v.end());
}

TEST(JvpOps, Matmul) {
  std::mt19937_64 rng(1);
  const int64_t M = 5, N = 7, K = 9;
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y(M * N);
    zof::jvp::matmul_jvp<T>(x[0].data(), dx[0].data(), x[1].data(), dx[1].data(), dx[2].data(),
                            y.data(), M, N, K);
    return as_vec(y);
  };
  Op op{[&](const Inputs& x) {
          Vec y(M * N);
          zof::jvp::matmul<double>(x[0].data(), x[1].data(), x[2].data(), y.data(), M, N, K);
          return y;
        },
        tangent, tangent};
  auto e = check(op, {randn(rng, M * K), randn(rng, N * K), randn(rng, N)}, rng);
  EXPECT_TANGENT_OK(e, "matmul x W^T + b");

  // A null tangent is zero: with dw = db = 0 only dx W^T remains.
  Vec x = randn(rng, M * K), w = randn(rng, N * K), dx = randn(rng, M * K), zero(N * K, 0.0);
  Vec a(M * N), b(M * N);
  zof::jvp::matmul_jvp<double>(x.data(), dx.data(), w.data(), nullptr, nullptr, a.data(), M, N, K);
  zof::jvp::matmul_jvp<double>(x.data(), dx.data(), w.data(), zero.data(), zero.data(), b.data(), M,
                               N, K);
  EXPECT_EQ(a, b);
}

TEST(JvpOps, RmsNorm) {
  std::mt19937_64 rng(2);
  const int64_t rows = 3, dim = 11;
  const float eps = 1e-5f;
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y(rows * dim);
    zof::jvp::rms_norm_jvp<T>(x[0].data(), dx[0].data(), x[1].data(), dx[1].data(), y.data(), rows,
                              dim, eps);
    return as_vec(y);
  };
  Op op{[&](const Inputs& x) {
          Vec y(rows * dim);
          zof::jvp::rms_norm<double>(x[0].data(), x[1].data(), y.data(), rows, dim, eps);
          return y;
        },
        tangent, tangent};
  auto e = check(op, {randn(rng, rows * dim), randn(rng, dim, 0.1, 1.0)}, rng);
  EXPECT_TANGENT_OK(e, "rms_norm");
}

// Gemma's RMSNorm, y = x r (w + 1): the weights are offsets around 0, and dw enters as it does
// without the offset.
TEST(JvpOps, RmsNormGemmaOffset) {
  std::mt19937_64 rng(11);
  const int64_t rows = 3, dim = 11;
  const float eps = 1e-6f;
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y(rows * dim);
    zof::jvp::rms_norm_jvp<T>(x[0].data(), dx[0].data(), x[1].data(), dx[1].data(), y.data(), rows,
                              dim, eps, 1.0f);
    return as_vec(y);
  };
  Op op{[&](const Inputs& x) {
          Vec y(rows * dim);
          zof::jvp::rms_norm<double>(x[0].data(), x[1].data(), y.data(), rows, dim, eps, 1.0f);
          return y;
        },
        tangent, tangent};
  const Vec x = randn(rng, rows * dim), w = randn(rng, dim, 0.3);
  auto e = check(op, {x, w}, rng);
  EXPECT_TANGENT_OK(e, "rms_norm w_offset=1");
  // In float64, w_offset 1 is the plain rule at w + 1, exactly.
  Vec w1 = w, dx = randn(rng, rows * dim), dw = randn(rng, dim), a(rows * dim), b(rows * dim);
  for (auto& v : w1) v += 1.0;
  zof::jvp::rms_norm_jvp<double>(x.data(), dx.data(), w.data(), dw.data(), a.data(), rows, dim, eps,
                                 1.0f);
  zof::jvp::rms_norm_jvp<double>(x.data(), dx.data(), w1.data(), dw.data(), b.data(), rows, dim,
                                 eps);
  EXPECT_EQ(a, b);
}

TEST(JvpOps, LayerNorm) {
  std::mt19937_64 rng(3);
  const int64_t rows = 4, dim = 13;
  const float eps = 1e-5f;
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y(rows * dim);
    zof::jvp::layer_norm_jvp<T>(x[0].data(), dx[0].data(), x[1].data(), dx[1].data(),
                                dx[2].data(), y.data(), rows, dim, eps);
    return as_vec(y);
  };
  Op op{[&](const Inputs& x) {
          Vec y(rows * dim);
          zof::jvp::layer_norm<double>(x[0].data(), x[1].data(), x[2].data(), y.data(), rows, dim,
                                       eps);
          return y;
        },
        tangent, tangent};
  // Rows with an offset: the mean matters.
  auto e = check(op, {randn(rng, rows * dim, 1.0, 0.7), randn(rng, dim, 0.1, 1.0), randn(rng, dim, 0.1)},
                 rng);
  EXPECT_TANGENT_OK(e, "layer_norm");
}

TEST(JvpOps, Rope) {
  std::mt19937_64 rng(4);
  const int64_t rows = 5, heads = 3, hd = 6;
  const std::vector<int32_t> pos{0, 1, 7, 40, 113};
  // Partial rotary: the first 4 of 6 dims rotate, with a table of 2.
  const int64_t rd = 4;
  const std::vector<float> inv = zof::rope_default_inv_freq(10000.f, rd);
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y = dx[0];
    zof::jvp::rope<T>(y.data(), pos.data(), rows, heads, hd, rd, inv.data());  // linear
    return as_vec(y);
  };
  Op op{[&](const Inputs& x) {
          Vec y = x[0];
          zof::jvp::rope<double>(y.data(), pos.data(), rows, heads, hd, rd, inv.data());
          return y;
        },
        tangent, tangent};
  auto e = check(op, {randn(rng, rows * heads * hd)}, rng);
  EXPECT_TANGENT_OK(e, "rope");
}

struct AttnCase {
  int64_t B, S, H, Hkv, D;
  std::vector<uint8_t> mask;  // (B, S) or empty
  const char* name;
  int64_t window = 0;    // Gemma's sliding window (0: none)
  double softcap = 0.0;  // Gemma 2's score cap (0: none)
};

TEST(JvpOps, Attention) {
  std::mt19937_64 rng(5);
  std::vector<AttnCase> cases;
  // GQA (3 query heads per kv head), odd D, a padded row.
  AttnCase gqa{2, 7, 6, 2, 5, {}, "attention GQA, padded"};
  gqa.mask.assign(2 * 7, 1);
  for (int t = 4; t < 7; ++t) gqa.mask[7 + t] = 0;
  cases.push_back(gqa);
  // Key 0 of row 1 masked: its first query sees no key (zero output, zero tangent).
  AttnCase hole{2, 5, 4, 4, 3, {}, "attention MHA, masked key 0"};
  hole.mask.assign(2 * 5, 1);
  hole.mask[5 + 0] = 0;
  hole.mask[5 + 2] = 0;
  cases.push_back(hole);
  cases.push_back(AttnCase{1, 9, 2, 1, 8, {}, "attention MQA, no mask"});
  for (const auto& c : cases) {
    const double scale = 1.0 / std::sqrt(double(c.D));
    const int64_t nq = c.B * c.S * c.H * c.D, nk = c.B * c.S * c.Hkv * c.D;
    const uint8_t* mask = c.mask.empty() ? nullptr : c.mask.data();
    auto tangent = [&](auto&& x, auto&& dx) {
      using T = typename std::decay_t<decltype(x[0])>::value_type;
      std::vector<T> y(nq);
      zof::jvp::attention_jvp<T>(x[0].data(), dx[0].data(), x[1].data(), dx[1].data(), x[2].data(),
                                 dx[2].data(), y.data(), mask, c.B, c.S, c.H, c.Hkv, c.D, scale);
      return as_vec(y);
    };
    Op op{[&](const Inputs& x) {
            Vec y(nq);
            zof::jvp::attention<double>(x[0].data(), x[1].data(), x[2].data(), y.data(), mask, c.B,
                                        c.S, c.H, c.Hkv, c.D, scale);
            return y;
          },
          tangent, tangent};
    // Scores of order 1-3 so that the softmax is far from uniform.
    auto e = check(op, {randn(rng, nq, 1.5), randn(rng, nk, 1.5), randn(rng, nk)}, rng);
    EXPECT_TANGENT_OK(e, c.name);
  }
  // The query that sees no key: zero output, zero tangent.
  const auto& c = cases[1];
  Vec q = randn(rng, c.B * c.S * c.H * c.D), k = randn(rng, c.B * c.S * c.Hkv * c.D),
      v = randn(rng, c.B * c.S * c.Hkv * c.D), o(q.size()), d(q.size());
  zof::jvp::attention<double>(q.data(), k.data(), v.data(), o.data(), c.mask.data(), c.B, c.S, c.H,
                              c.Hkv, c.D, 0.5);
  zof::jvp::attention_jvp<double>(q.data(), q.data(), k.data(), k.data(), v.data(), v.data(),
                                  d.data(), c.mask.data(), c.B, c.S, c.H, c.Hkv, c.D, 0.5);
  const int64_t first = (1 * c.S + 0) * c.H * c.D;  // row 1, position 0, all heads
  for (int64_t i = 0; i < c.H * c.D; ++i) {
    EXPECT_EQ(o[first + i], 0.0);
    EXPECT_EQ(d[first + i], 0.0);
  }
}

// Gemma's attention: a sliding window, soft-capped scores (the tangent passes through the cap's
// 1 - tanh^2), and both with a key mask, where one query's whole window is padding.
TEST(JvpOps, AttentionGemma) {
  std::mt19937_64 rng(12);
  std::vector<AttnCase> cases;
  cases.push_back(AttnCase{2, 9, 6, 2, 5, {}, "attention window 3, GQA", 3, 0.0});
  cases.push_back(AttnCase{1, 20, 2, 1, 8, {}, "attention window 5, MQA S=20", 5, 0.0});
  // Scores of order 1-3 and beyond: the cap of 2.5 bends them, the cap of 50 hardly.
  AttnCase capped{2, 7, 4, 4, 4, {}, "attention cap 2.5, masked", 0, 2.5};
  capped.mask.assign(2 * 7, 1);
  capped.mask[7 + 2] = 0;
  cases.push_back(capped);
  cases.push_back(AttnCase{1, 9, 4, 2, 6, {}, "attention cap 50", 0, 50.0});
  // Window 2 and a cap; keys 3 and 4 of row 1 masked: its query 4 sees no key.
  AttnCase both{2, 8, 4, 2, 4, {}, "attention window 2 + cap 2.5", 2, 2.5};
  both.mask.assign(2 * 8, 1);
  both.mask[8 + 3] = 0;
  both.mask[8 + 4] = 0;
  cases.push_back(both);
  for (const auto& c : cases) {
    const double scale = 1.0 / std::sqrt(double(c.D));
    const int64_t nq = c.B * c.S * c.H * c.D, nk = c.B * c.S * c.Hkv * c.D;
    const uint8_t* mask = c.mask.empty() ? nullptr : c.mask.data();
    auto tangent = [&](auto&& x, auto&& dx) {
      using T = typename std::decay_t<decltype(x[0])>::value_type;
      std::vector<T> y(nq);
      zof::jvp::attention_jvp<T>(x[0].data(), dx[0].data(), x[1].data(), dx[1].data(), x[2].data(),
                                 dx[2].data(), y.data(), mask, c.B, c.S, c.H, c.Hkv, c.D, scale,
                                 c.window, c.softcap);
      return as_vec(y);
    };
    Op op{[&](const Inputs& x) {
            Vec y(nq);
            zof::jvp::attention<double>(x[0].data(), x[1].data(), x[2].data(), y.data(), mask, c.B,
                                        c.S, c.H, c.Hkv, c.D, scale, c.window, c.softcap);
            return y;
          },
          tangent, tangent};
    const Vec q = randn(rng, nq, 2.0), k = randn(rng, nk, 1.5), v = randn(rng, nk);
    auto e = check(op, {q, k, v}, rng);
    EXPECT_TANGENT_OK(e, c.name);
    // The primal differentiated here is the backends' forward op: jvp::attention in fp32 against
    // the reference backend's attention. Both accumulate in double and round once: measured
    // identical bits on these cases; 1e-6 of the largest output (a few fp32 roundings) allows
    // another summation order and still fails a cap off by 0.1% (measured 4.6e-6 at cap 50).
    const std::vector<float> q32 = to_f32(q), k32 = to_f32(k), v32 = to_f32(v);
    std::vector<float> mine(nq), theirs(nq);
    zof::jvp::attention<float>(q32.data(), k32.data(), v32.data(), mine.data(), mask, c.B, c.S, c.H,
                               c.Hkv, c.D, double(float(scale)), c.window, c.softcap);
    zof::make_reference_backend()->attention(q32.data(), k32.data(), v32.data(), theirs.data(),
                                             mask, c.B, c.S, c.S, c.H, c.Hkv, c.D, 0, float(scale),
                                             c.window, float(c.softcap));
    double err = 0, big = 0;
    for (int64_t i = 0; i < nq; ++i) {
      err = std::max(err, std::fabs(double(mine[i]) - double(theirs[i])));
      big = std::max(big, std::fabs(double(theirs[i])));
    }
    EXPECT_LT(err, 1e-6 * big) << c.name << ": jvp::attention is not the backends' attention";
  }
  // The blind query (row 1, position 4 of the last case): zero output, zero tangent; its
  // neighbours at positions 3 and 5 see one key each and move.
  const auto& c = cases.back();
  const int64_t nq = c.B * c.S * c.H * c.D, nk = c.B * c.S * c.Hkv * c.D;
  Vec q = randn(rng, nq), k = randn(rng, nk), v = randn(rng, nk), o(nq), d(nq);
  zof::jvp::attention<double>(q.data(), k.data(), v.data(), o.data(), c.mask.data(), c.B, c.S, c.H,
                              c.Hkv, c.D, 0.5, c.window, c.softcap);
  zof::jvp::attention_jvp<double>(q.data(), q.data(), k.data(), k.data(), v.data(), v.data(),
                                  d.data(), c.mask.data(), c.B, c.S, c.H, c.Hkv, c.D, 0.5, c.window,
                                  c.softcap);
  for (int64_t pos : {3, 4, 5}) {
    const int64_t at = (1 * c.S + pos) * c.H * c.D;
    int64_t zeros = 0;
    for (int64_t i = 0; i < c.H * c.D; ++i) zeros += (o[at + i] == 0.0) + (d[at + i] == 0.0);
    EXPECT_EQ(zeros, pos == 4 ? 2 * c.H * c.D : 0) << "position " << pos;
  }
  // A window of S keys or more is no window: the same output and tangent, bit for bit.
  Vec o0(nq), d0(nq);
  zof::jvp::attention<double>(q.data(), k.data(), v.data(), o0.data(), c.mask.data(), c.B, c.S, c.H,
                              c.Hkv, c.D, 0.5, 0, c.softcap);
  zof::jvp::attention_jvp<double>(q.data(), q.data(), k.data(), k.data(), v.data(), v.data(),
                                  d0.data(), c.mask.data(), c.B, c.S, c.H, c.Hkv, c.D, 0.5, 0,
                                  c.softcap);
  for (int64_t window : {c.S, c.S + 7}) {
    zof::jvp::attention<double>(q.data(), k.data(), v.data(), o.data(), c.mask.data(), c.B, c.S,
                                c.H, c.Hkv, c.D, 0.5, window, c.softcap);
    zof::jvp::attention_jvp<double>(q.data(), q.data(), k.data(), k.data(), v.data(), v.data(),
                                    d.data(), c.mask.data(), c.B, c.S, c.H, c.Hkv, c.D, 0.5, window,
                                    c.softcap);
    EXPECT_EQ(o, o0) << "window " << window;
    EXPECT_EQ(d, d0) << "window " << window;
  }
}

TEST(JvpOps, SiluMul) {
  std::mt19937_64 rng(6);
  const int64_t n = 37;
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y(n);
    zof::jvp::silu_mul_jvp<T>(x[0].data(), dx[0].data(), x[1].data(), dx[1].data(), y.data(), n);
    return as_vec(y);
  };
  Op op{[&](const Inputs& x) {
          Vec y(n);
          zof::jvp::silu_mul<double>(x[0].data(), x[1].data(), y.data(), n);
          return y;
        },
        tangent, tangent};
  auto e = check(op, {randn(rng, n, 3.0), randn(rng, n)}, rng);
  EXPECT_TANGENT_OK(e, "silu_mul");
}

// Gemma's GeGLU, gelu_tanh(gate) * up: both tangents, then each alone (a null tangent is zero)
// against the difference along that input only.
TEST(JvpOps, GeluTanhMul) {
  std::mt19937_64 rng(13);
  const int64_t n = 37;
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y(n);
    zof::jvp::gelu_tanh_mul_jvp<T>(x[0].data(), dx[0].data(), x[1].data(), dx[1].data(), y.data(),
                                   n);
    return as_vec(y);
  };
  Op op{[&](const Inputs& x) {
          Vec y(n);
          zof::jvp::gelu_tanh_mul<double>(x[0].data(), x[1].data(), y.data(), n);
          return y;
        },
        tangent, tangent};
  const Vec gate = randn(rng, n, 3.0), up = randn(rng, n);
  auto e = check(op, {gate, up}, rng);
  EXPECT_TANGENT_OK(e, "gelu_tanh_mul");

  // dup null: the gate moves, up stays.
  auto only_gate = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    const std::vector<T> u(up.begin(), up.end());
    std::vector<T> y(n);
    zof::jvp::gelu_tanh_mul_jvp<T>(x[0].data(), dx[0].data(), u.data(), nullptr, y.data(), n);
    return as_vec(y);
  };
  Op gate_op{[&](const Inputs& x) {
               Vec y(n);
               zof::jvp::gelu_tanh_mul<double>(x[0].data(), up.data(), y.data(), n);
               return y;
             },
             only_gate, only_gate};
  e = check(gate_op, {gate}, rng);
  EXPECT_TANGENT_OK(e, "gelu_tanh_mul, dup null");

  // dgate null: up moves, the gate stays.
  auto only_up = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    const std::vector<T> g(gate.begin(), gate.end());
    std::vector<T> y(n);
    zof::jvp::gelu_tanh_mul_jvp<T>(g.data(), nullptr, x[0].data(), dx[0].data(), y.data(), n);
    return as_vec(y);
  };
  Op up_op{[&](const Inputs& x) {
             Vec y(n);
             zof::jvp::gelu_tanh_mul<double>(gate.data(), x[0].data(), y.data(), n);
             return y;
           },
           only_up, only_up};
  e = check(up_op, {up}, rng);
  EXPECT_TANGENT_OK(e, "gelu_tanh_mul, dgate null");

  // The primal is the activation times up.
  Vec g(n), y(n);
  zof::jvp::activation<double>(zof::Activation::GeluTanh, gate.data(), g.data(), n);
  zof::jvp::gelu_tanh_mul<double>(gate.data(), up.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_DOUBLE_EQ(y[i], g[i] * up[i]);
}

// cap tanh(x / cap): Gemma 2's final cap of 30 over logits up to +-100 (flat in the tails), and a
// small cap where every input bends. A null dx gives a zero tangent. With outputs near 30 the
// difference quotient itself carries ~1e-16 * 30 / h = 3e-9 of rounding: measured 1.9e-9 in
// float64, inside the common 1e-8.
TEST(JvpOps, Softcap) {
  std::mt19937_64 rng(14);
  const int64_t n = 41;
  for (auto [cap, spread, name] : {std::tuple{30.0, 40.0, "softcap 30, logits to +-100"},
                                   std::tuple{2.5, 3.0, "softcap 2.5"}}) {
    auto tangent = [&, cap = cap](auto&& x, auto&& dx) {
      using T = typename std::decay_t<decltype(x[0])>::value_type;
      std::vector<T> y(n);
      zof::jvp::softcap_jvp<T>(x[0].data(), dx[0].data(), y.data(), cap, n);
      return as_vec(y);
    };
    Op op{[&, cap = cap](const Inputs& x) {
            Vec y(n);
            zof::jvp::softcap<double>(x[0].data(), y.data(), cap, n);
            return y;
          },
          tangent, tangent};
    Vec x = randn(rng, n, spread);
    x[0] = 100.0;
    x[1] = -100.0;
    auto e = check(op, {x}, rng);
    EXPECT_TANGENT_OK(e, name);
  }
  Vec x = randn(rng, n, 40.0), d(n, 1.0);
  zof::jvp::softcap_jvp<double>(x.data(), nullptr, d.data(), 30.0, n);
  EXPECT_EQ(d, Vec(n, 0.0));
}

TEST(JvpOps, Activations) {
  std::mt19937_64 rng(7);
  const int64_t n = 41;
  for (auto [act, name] : {std::pair{zof::Activation::ReLU, "relu"},
                           std::pair{zof::Activation::GeluTanh, "gelu_tanh"},
                           std::pair{zof::Activation::GeluErf, "gelu_erf"}}) {
    auto tangent = [&, act = act](auto&& x, auto&& dx) {
      using T = typename std::decay_t<decltype(x[0])>::value_type;
      std::vector<T> y(n);
      zof::jvp::activation_jvp<T>(act, x[0].data(), dx[0].data(), y.data(), n);
      return as_vec(y);
    };
    Op op{[&, act = act](const Inputs& x) {
            Vec y(n);
            zof::jvp::activation<double>(act, x[0].data(), y.data(), n);
            return y;
          },
          tangent, tangent};
    Vec x = randn(rng, n, 2.5);
    for (auto& v : x)
      if (std::fabs(v) < 1e-2) v += 0.05;  // ReLU's kink: keep the difference on one side
    auto e = check(op, {x}, rng);
    EXPECT_TANGENT_OK(e, name);
  }
}

TEST(JvpOps, EmbeddingWithPositions) {
  std::mt19937_64 rng(8);
  const int64_t V = 11, P = 6, dim = 5;
  const std::vector<int32_t> ids{3, 0, 10, 3, 7}, pos{0, 1, 2, 3, 4};
  const int64_t n = (int64_t)ids.size();
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y(n * dim);
    zof::jvp::embedding<T>(ids.data(), dx[0].data(), y.data(), n, dim, false);
    zof::jvp::embedding<T>(pos.data(), dx[1].data(), y.data(), n, dim, true);
    return as_vec(y);
  };
  Op op{[&](const Inputs& x) {
          Vec y(n * dim);
          zof::jvp::embedding<double>(ids.data(), x[0].data(), y.data(), n, dim, false);
          zof::jvp::embedding<double>(pos.data(), x[1].data(), y.data(), n, dim, true);
          return y;
        },
        tangent, tangent};
  auto e = check(op, {randn(rng, V * dim), randn(rng, P * dim)}, rng);
  EXPECT_TANGENT_OK(e, "embedding + positions");
}

TEST(JvpOps, CrossEntropyOverScoredTargets) {
  std::mt19937_64 rng(9);
  const int64_t rows = 6, vocab = 13;
  const std::vector<int32_t> targets{4, -1, 0, 12, -1, 7};
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> y(rows);
    zof::jvp::cross_entropy_jvp<T>(x[0].data(), dx[0].data(), targets.data(), y.data(), rows, vocab);
    // The mean over scored targets, as the loss is formed.
    double s = 0;
    for (auto v : y) s += double(v);
    Vec out = as_vec(y);
    out.push_back(s / 4);
    return out;
  };
  Op op{[&](const Inputs& x) {
          Vec y(rows);
          zof::jvp::cross_entropy<double>(x[0].data(), targets.data(), y.data(), rows, vocab);
          double s = 0;
          for (auto v : y) s += v;
          y.push_back(s / 4);
          return y;
        },
        tangent, tangent};
  auto e = check(op, {randn(rng, rows * vocab, 2.0)}, rng);
  EXPECT_TANGENT_OK(e, "cross_entropy (mean)");
  // Unscored rows have zero tangent.
  Vec l = randn(rng, rows * vocab), dl = randn(rng, rows * vocab), d(rows);
  zof::jvp::cross_entropy_jvp<double>(l.data(), dl.data(), targets.data(), d.data(), rows, vocab);
  EXPECT_EQ(d[1], 0.0);
  EXPECT_EQ(d[4], 0.0);
  EXPECT_NE(d[0], 0.0);
}

// A tied LM head: the same table (and its tangent) feeds the embedding and the logits, through
// RMSNorm; the composition of the rules, as the walk applies them.
TEST(JvpOps, TiedEmbeddingAndHead) {
  std::mt19937_64 rng(10);
  const int64_t V = 9, C = 6;
  const std::vector<int32_t> ids{1, 4, 8, 4}, targets{4, 8, 4, 2};
  const int64_t n = (int64_t)ids.size();
  const float eps = 1e-6f;
  auto tangent = [&](auto&& x, auto&& dx) {
    using T = typename std::decay_t<decltype(x[0])>::value_type;
    std::vector<T> h(n * C), dh(n * C), hn(n * C), dhn(n * C), lg(n * V), dlg(n * V), d(n);
    zof::jvp::embedding<T>(ids.data(), x[0].data(), h.data(), n, C, false);
    zof::jvp::embedding<T>(ids.data(), dx[0].data(), dh.data(), n, C, false);
    zof::jvp::rms_norm<T>(h.data(), x[1].data(), hn.data(), n, C, eps);
    zof::jvp::rms_norm_jvp<T>(h.data(), dh.data(), x[1].data(), dx[1].data(), dhn.data(), n, C, eps);
    zof::jvp::matmul<T>(hn.data(), x[0].data(), nullptr, lg.data(), n, V, C);
    zof::jvp::matmul_jvp<T>(hn.data(), dhn.data(), x[0].data(), dx[0].data(), nullptr, dlg.data(), n,
                            V, C);
    zof::jvp::cross_entropy_jvp<T>(lg.data(), dlg.data(), targets.data(), d.data(), n, V);
    return as_vec(d);
  };
  Op op{[&](const Inputs& x) {
          Vec h(n * C), hn(n * C), lg(n * V), nll(n);
          zof::jvp::embedding<double>(ids.data(), x[0].data(), h.data(), n, C, false);
          zof::jvp::rms_norm<double>(h.data(), x[1].data(), hn.data(), n, C, eps);
          zof::jvp::matmul<double>(hn.data(), x[0].data(), nullptr, lg.data(), n, V, C);
          zof::jvp::cross_entropy<double>(lg.data(), targets.data(), nll.data(), n, V);
          return nll;
        },
        tangent, tangent};
  auto e = check(op, {randn(rng, V * C), randn(rng, C, 0.1, 1.0)}, rng);
  EXPECT_TANGENT_OK(e, "tied embedding + LM head");
}

TEST(JvpOps, GradientsNeedScoredTokens) {
  zof::JVPSums s;
  s.sum_dir = {1.0, -2.0};
  EXPECT_THROW(s.gradients(), zof::Error);
  s.count = 4;
  EXPECT_EQ(s.gradients(), (std::vector<double>{0.25, -0.5}));
}

}  // namespace
