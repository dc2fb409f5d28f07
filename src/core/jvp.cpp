// Forward-mode AD of the transformer forward (see jvp.h): each op's tangent rule as a plain host
// loop, then the walk over blocks that runs the primal once per layer (keeping that layer's
// intermediates) and the tangent of every direction from them.
#include "zof/jvp.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <type_traits>

#include "zof/error.h"

namespace zof {
namespace jvp {
namespace {
// Loops smaller than this many multiply-adds stay on one thread (OpenMP start-up costs more).
constexpr int64_t kMinParallelWork = 1 << 15;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();
}  // namespace

template <class T>
void matmul(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t N, int64_t K) {
#pragma omp parallel for schedule(static) if (M * N * K >= kMinParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    const T* xr = x + m * K;
    for (int64_t n = 0; n < N; ++n) {
      const T* wr = w + n * K;
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(xr[k]) * double(wr[k]);
      if (b) acc += double(b[n]);
      y[m * N + n] = T(acc);
    }
  }
}

template <class T>
void matmul_jvp(const T* x, const T* dx, const T* w, const T* dw, const T* db, T* dy, int64_t M,
                int64_t N, int64_t K) {
#pragma omp parallel for schedule(static) if (2 * M * N * K >= kMinParallelWork)
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = db ? double(db[n]) : 0.0;
      if (dx)
        for (int64_t k = 0; k < K; ++k) acc += double(dx[m * K + k]) * double(w[n * K + k]);
      if (dw)
        for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * double(dw[n * K + k]);
      dy[m * N + n] = T(acc);
    }
  }
}

template <class T>
void rms_norm(const T* x, const T* w, T* y, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * double(xr[i]);
    const double inv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = T(double(xr[i]) * inv * double(w[i]));
  }
}

template <class T>
void rms_norm_jvp(const T* x, const T* dx, const T* w, const T* dw, T* dy, int64_t rows,
                  int64_t dim, float eps) {
  // y = x r w with r = (mean(x^2) + eps)^-1/2, so dr = -r^3 mean(x dx).
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dxr = dx ? dx + r * dim : nullptr;
    double ss = 0.0, sd = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      ss += double(xr[i]) * double(xr[i]);
      if (dxr) sd += double(xr[i]) * double(dxr[i]);
    }
    const double inv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    const double dinv = -inv * inv * inv * sd / double(dim);
    for (int64_t i = 0; i < dim; ++i) {
      const double xi = xr[i], dxi = dxr ? double(dxr[i]) : 0.0;
      double d = (dxi * inv + xi * dinv) * double(w[i]);
      if (dw) d += xi * inv * double(dw[i]);
      dy[r * dim + i] = T(d);
    }
  }
}

template <class T>
void layer_norm(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    double mean = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean += double(xr[i]);
    mean /= double(dim);
    double var = 0.0;
    for (int64_t i = 0; i < dim; ++i) var += (double(xr[i]) - mean) * (double(xr[i]) - mean);
    var /= double(dim);
    const double inv = 1.0 / std::sqrt(var + double(eps));
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] = T((double(xr[i]) - mean) * inv * double(w[i]) + (b ? double(b[i]) : 0.0));
  }
}

template <class T>
void layer_norm_jvp(const T* x, const T* dx, const T* w, const T* dw, const T* db, T* dy,
                    int64_t rows, int64_t dim, float eps) {
  // xhat = (x - mu) r, r = (var + eps)^-1/2: dxhat = (dx - dmu) r + (x - mu) dr,
  // dr = -r^3 mean((x - mu)(dx - dmu)).
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dxr = dx ? dx + r * dim : nullptr;
    double mean = 0.0, dmean = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      mean += double(xr[i]);
      if (dxr) dmean += double(dxr[i]);
    }
    mean /= double(dim);
    dmean /= double(dim);
    double var = 0.0, cov = 0.0;
    for (int64_t i = 0; i < dim; ++i) {
      const double c = double(xr[i]) - mean;
      var += c * c;
      if (dxr) cov += c * (double(dxr[i]) - dmean);
    }
    var /= double(dim);
    cov /= double(dim);
    const double inv = 1.0 / std::sqrt(var + double(eps));
    const double dinv = -inv * inv * inv * cov;
    for (int64_t i = 0; i < dim; ++i) {
      const double c = double(xr[i]) - mean, dc = (dxr ? double(dxr[i]) : 0.0) - dmean;
      double d = (dc * inv + c * dinv) * double(w[i]);
      if (dw) d += c * inv * double(dw[i]);
      if (db) d += double(db[i]);
      dy[r * dim + i] = T(d);
    }
  }
}

template <class T>
void rope(T* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim, float theta) {
  ZOF_ASSERT(head_dim % 2 == 0);
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = float(1.0 / std::pow(double(theta), double(2 * i) / double(head_dim)));
#pragma omp parallel for schedule(static) if (rows * n_heads * head_dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(pos[r]) * inv_freq[i];
      const double c = float(std::cos(double(angle))), s = float(std::sin(double(angle)));
      for (int64_t h = 0; h < n_heads; ++h) {
        T* xh = x + (r * n_heads + h) * head_dim;
        const double a = xh[i], b = xh[i + half];
        xh[i] = T(a * c - b * s);
        xh[i + half] = T(b * c + a * s);
      }
    }
  }
}

namespace {
// e^x for x <= 0 (a softmax weight, x = score - max; -inf gives 0), to about 1 ulp, branch-free
// so that loops over keys vectorize (libm's exp is a call per element). x = k ln2 + r with
// |r| <= ln2/2, e^r by its Taylor series to r^13 (remainder < 2e-17), 2^k from the exponent bits.
inline double exp_nonpos(double x) {
  const bool zero = x < -708.0;  // below 2^-1022, or -inf (NaN goes through as NaN)
  x = zero ? 0.0 : x;
  const double shifter = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer
  const double k = (x * 1.4426950408889634 + shifter) - shifter;
  double r = std::fma(-k, 0.6931471805599453, x);  // ln2 split in two doubles
  r = std::fma(-k, 2.3190468138462996e-17, r);
  double p = std::fma(1.0 / 6227020800.0, r, 1.0 / 479001600.0);  // 1/13!, 1/12!
  p = std::fma(p, r, 1.0 / 39916800.0);
  p = std::fma(p, r, 1.0 / 3628800.0);
  p = std::fma(p, r, 1.0 / 362880.0);
  p = std::fma(p, r, 1.0 / 40320.0);
  p = std::fma(p, r, 1.0 / 5040.0);
  p = std::fma(p, r, 1.0 / 720.0);
  p = std::fma(p, r, 1.0 / 120.0);
  p = std::fma(p, r, 1.0 / 24.0);
  p = std::fma(p, r, 1.0 / 6.0);
  p = std::fma(p, r, 0.5);
  p = std::fma(p, r, 1.0);
  p = std::fma(p, r, 1.0);
  const double scale = std::bit_cast<double>(uint64_t(int64_t(k) + 1023) << 52);
  return zero ? 0.0 : p * scale;
}

constexpr int64_t kLanes = 8;  // keys per register block: one AVX-512 vector of doubles
inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Keys or values (B,S,Hkv,D) as (B,Hkv,D,Sp) in double, Sp = S padded with zeros to whole
// blocks: a kv head's d-th component over all keys is one contiguous row, so the loops over
// keys vectorize.
template <class T>
void heads_by_key(const T* x, int64_t B, int64_t S, int64_t Hkv, int64_t D, std::vector<double>& out) {
  const int64_t Sp = padded(S);
  out.assign(B * Hkv * D * Sp, 0.0);
#pragma omp parallel for schedule(static) if (B * S * Hkv * D >= kMinParallelWork)
  for (int64_t bh = 0; bh < B * Hkv; ++bh) {
    const int64_t b = bh / Hkv, hk = bh % Hkv;
    for (int64_t j = 0; j < S; ++j)
      for (int64_t d = 0; d < D; ++d)
        out[(bh * D + d) * Sp + j] = double(x[((b * S + j) * Hkv + hk) * D + d]);
  }
}

// out[j] (+)= sum_d a[d] rows[d * stride + j] for j < n, n a multiple of kLanes: kLanes
// accumulators stay in registers across d instead of a pass over out per d.
inline void dot_keys(const double* a, const double* rows, int64_t stride, int64_t D, int64_t n,
                     double* out, bool accumulate) {
  for (int64_t j0 = 0; j0 < n; j0 += kLanes) {
    double acc[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) acc[l] = accumulate ? out[j0 + l] : 0.0;
    for (int64_t d = 0; d < D; ++d) {
      const double ad = a[d];
      const double* r = rows + d * stride + j0;
      for (int64_t l = 0; l < kLanes; ++l) acc[l] += ad * r[l];
    }
    for (int64_t l = 0; l < kLanes; ++l) out[j0 + l] = acc[l];
  }
}

// 0 for a visible key, -inf for a masked one (B*S).
std::vector<double> key_bias(const uint8_t* key_mask, int64_t n) {
  std::vector<double> bias(n, 0.0);
  if (key_mask)
    for (int64_t i = 0; i < n; ++i) bias[i] = key_mask[i] ? 0.0 : kNegInf;
  return bias;
}

// Reductions over n keys (a multiple of kLanes) in kLanes partial sums: an in-order sum cannot
// be vectorized, and these sums are the attention's inner loops.
inline double dot_padded(const double* a, const double* b, int64_t n) {
  double acc[kLanes] = {};
  for (int64_t j0 = 0; j0 < n; j0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) acc[l] += a[j0 + l] * b[j0 + l];
  double s = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// Softmax weights p of the query qi (D, already scaled) against its n visible keys in kt (D
// rows of stride Sp), written for all padded(n) keys (0 past n); false when it sees no key.
inline bool softmax_row(const double* qi, const double* kt, const double* bias, int64_t n,
                        int64_t Sp, int64_t D, double* p) {
  const int64_t nr = padded(n);
  dot_keys(qi, kt, Sp, D, nr, p, false);
  for (int64_t j = 0; j < nr; ++j) p[j] += j < n ? bias[j] : kNegInf;
  double lane[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lane[l] = kNegInf;
  for (int64_t j0 = 0; j0 < nr; j0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] = lane[l] > p[j0 + l] ? lane[l] : p[j0 + l];
  double mx = kNegInf;
  for (int64_t l = 0; l < kLanes; ++l) mx = std::max(mx, lane[l]);
  if (mx == kNegInf) return false;
  for (int64_t l = 0; l < kLanes; ++l) lane[l] = 0.0;
  for (int64_t j0 = 0; j0 < nr; j0 += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) {
      p[j0 + l] = exp_nonpos(p[j0 + l] - mx);
      lane[l] += p[j0 + l];
    }
  double sum = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) sum += lane[l];
  const double inv = 1.0 / sum;
  for (int64_t j = 0; j < nr; ++j) p[j] *= inv;
  return true;
}
}  // namespace

template <class T>
void attention(const T* q, const T* k, const T* v, T* out, const uint8_t* key_mask, int64_t B,
               int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale) {
  ZOF_ASSERT(Hkv > 0 && H % Hkv == 0);
  const int64_t group = H / Hkv, items = B * S * H;
  std::vector<double> kt, vt;
  heads_by_key(k, B, S, Hkv, D, kt);
  heads_by_key(v, B, S, Hkv, D, vt);
  const std::vector<double> bias = key_bias(key_mask, B * S);
  const int64_t Sp = padded(S);
#pragma omp parallel if (items * S * D >= kMinParallelWork)
  {
    std::vector<double> p(std::max<int64_t>(Sp, 1)), qi(std::max<int64_t>(D, 1));
#pragma omp for schedule(dynamic, 16)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = item / (S * H), i = item / H % S, h = item % H, hk = h / group;
      const int64_t qo = ((b * S + i) * H + h) * D, kvo = (b * Hkv + hk) * D * Sp;
      const int64_t nr = padded(i + 1);
      for (int64_t d = 0; d < D; ++d) qi[d] = double(q[qo + d]) * scale;
      const bool sees =
          softmax_row(qi.data(), kt.data() + kvo, bias.data() + b * S, i + 1, Sp, D, p.data());
      for (int64_t d = 0; d < D; ++d)
        out[qo + d] = T(sees ? dot_padded(p.data(), vt.data() + kvo + d * Sp, nr) : 0.0);
    }
  }
}

template <class T>
void attention_jvp(const T* q, const T* dq, const T* k, const T* dk, const T* v, const T* dv,
                   T* dout, const uint8_t* key_mask, int64_t B, int64_t S, int64_t H, int64_t Hkv,
                   int64_t D, double scale) {
  ZOF_ASSERT(Hkv > 0 && H % Hkv == 0);
  const int64_t group = H / Hkv, items = B * S * H;
  std::vector<double> kt, vt, dkt, dvt;
  heads_by_key(k, B, S, Hkv, D, kt);
  heads_by_key(v, B, S, Hkv, D, vt);
  if (dk) heads_by_key(dk, B, S, Hkv, D, dkt);
  if (dv) heads_by_key(dv, B, S, Hkv, D, dvt);
  const std::vector<double> bias = key_bias(key_mask, B * S);
  const int64_t Sp = padded(S);
#pragma omp parallel if (4 * items * S * D >= kMinParallelWork)
  {
    std::vector<double> p(std::max<int64_t>(Sp, 1)), ds(std::max<int64_t>(Sp, 1));
    std::vector<double> qi(std::max<int64_t>(D, 1)), dqi(std::max<int64_t>(D, 1));
#pragma omp for schedule(dynamic, 16)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t b = item / (S * H), i = item / H % S, h = item % H, hk = h / group;
      const int64_t qo = ((b * S + i) * H + h) * D, kvo = (b * Hkv + hk) * D * Sp;
      const int64_t nr = padded(i + 1);
      for (int64_t d = 0; d < D; ++d) {
        qi[d] = double(q[qo + d]) * scale;
        dqi[d] = dq ? double(dq[qo + d]) * scale : 0.0;
      }
      if (!softmax_row(qi.data(), kt.data() + kvo, bias.data() + b * S, i + 1, Sp, D, p.data())) {
        for (int64_t d = 0; d < D; ++d) dout[qo + d] = T(0);
        continue;
      }
      // ds_j = dq.k_j + q.dk_j (scaled); hidden keys have p_j = 0 and drop out below.
      dot_keys(dqi.data(), kt.data() + kvo, Sp, D, nr, ds.data(), false);
      if (dk) dot_keys(qi.data(), dkt.data() + kvo, Sp, D, nr, ds.data(), true);
      const double sbar = dot_padded(p.data(), ds.data(), nr);  // sum_l p_l ds_l
      for (int64_t j = 0; j < nr; ++j) ds[j] = p[j] * (ds[j] - sbar);  // dp_j
      for (int64_t d = 0; d < D; ++d) {
        double acc = dot_padded(ds.data(), vt.data() + kvo + d * Sp, nr);
        if (dv) acc += dot_padded(p.data(), dvt.data() + kvo + d * Sp, nr);
        dout[qo + d] = T(acc);
      }
    }
  }
}

namespace {
// 1 / (1 + e^-g) from e^-|g| <= 1: no overflow, and the loop vectorizes.
inline double sigmoid(double g) {
  const double e = exp_nonpos(-std::fabs(g));
  return g >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

// max over a row of logits, and sums of e^(x - max) (times w when given), in kLanes partial
// sums so that the loop vectorizes.
template <class T>
double row_max(const T* x, int64_t n) {
  double mx = x[0];
  for (int64_t v = 1; v < n; ++v) mx = mx > double(x[v]) ? mx : double(x[v]);
  return mx;
}
template <class T>
void exp_sums(const T* x, const T* w, int64_t n, double mx, double* sum, double* wsum) {
  double s[kLanes] = {}, ws[kLanes] = {};
  int64_t v = 0;
  for (; v + kLanes <= n; v += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) {
      const double e = exp_nonpos(double(x[v + l]) - mx);
      s[l] += e;
      if (w) ws[l] += e * double(w[v + l]);
    }
  for (; v < n; ++v) {
    const double e = exp_nonpos(double(x[v]) - mx);
    s[0] += e;
    if (w) ws[0] += e * double(w[v]);
  }
  *sum = 0.0;
  if (wsum) *wsum = 0.0;
  for (int64_t l = 0; l < kLanes; ++l) {
    *sum += s[l];
    if (wsum) *wsum += ws[l];
  }
}
}  // namespace

template <class T>
void silu_mul(const T* gate, const T* up, T* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = T(g * sigmoid(g) * double(up[i]));
  }
}

template <class T>
void silu_mul_jvp(const T* gate, const T* dgate, const T* up, const T* dup, T* dout, int64_t n) {
  // silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i], s = sigmoid(g);
    double d = 0.0;
    if (dgate) d += s * (1.0 + g * (1.0 - s)) * double(dgate[i]) * double(up[i]);
    if (dup) d += g * s * double(dup[i]);
    dout[i] = T(d);
  }
}

namespace {
constexpr double kGeluC = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

double act_value(Activation act, double a) {
  switch (act) {
    case Activation::ReLU: return a < 0.0 ? 0.0 : a;  // NaN stays NaN, as in torch
    case Activation::GeluTanh: return 0.5 * a * (1.0 + std::tanh(kGeluC * (a + kGeluA * a * a * a)));
    case Activation::GeluErf: return 0.5 * a * std::erfc(-a / std::numbers::sqrt2);
    case Activation::SiLU: return a / (1.0 + std::exp(-a));
  }
  return a;
}

double act_slope(Activation act, double a) {
  switch (act) {
    case Activation::ReLU: return a > 0.0 ? 1.0 : 0.0;  // torch's relu gradient is 0 at 0
    case Activation::GeluTanh: {
      const double t = std::tanh(kGeluC * (a + kGeluA * a * a * a));
      return 0.5 * (1.0 + t) + 0.5 * a * (1.0 - t * t) * kGeluC * (1.0 + 3.0 * kGeluA * a * a);
    }
    case Activation::GeluErf:
      return 0.5 * std::erfc(-a / std::numbers::sqrt2) +
             a * std::exp(-0.5 * a * a) * (0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2);
    case Activation::SiLU: {
      const double s = 1.0 / (1.0 + std::exp(-a));
      return s * (1.0 + a * (1.0 - s));
    }
  }
  return 1.0;
}
}  // namespace

template <class T>
void activation(Activation act, const T* x, T* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) y[i] = T(act_value(act, double(x[i])));
}

template <class T>
void activation_jvp(Activation act, const T* x, const T* dx, T* dy, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) dy[i] = T(act_slope(act, double(x[i])) * double(dx[i]));
}

template <class T>
void embedding(const int32_t* ids, const T* table, T* out, int64_t n, int64_t dim,
               bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    const T* row = table + int64_t(ids[i]) * dim;
    T* o = out + i * dim;
    if (accumulate)
      for (int64_t d = 0; d < dim; ++d) o[d] += row[d];
    else
      std::copy(row, row + dim, o);
  }
}

template <class T>
void cross_entropy(const T* logits, const int32_t* targets, T* nll, int64_t rows, int64_t vocab) {
#pragma omp parallel for schedule(static) if (rows * vocab >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) {
      nll[r] = T(0);
      continue;
    }
    const T* lr = logits + r * vocab;
    const double mx = row_max(lr, vocab);
    double sum;
    exp_sums<T>(lr, nullptr, vocab, mx, &sum, nullptr);
    nll[r] = T(mx + std::log(sum) - double(lr[targets[r]]));
  }
}

template <class T>
void cross_entropy_jvp(const T* logits, const T* dlogits, const int32_t* targets, T* dnll,
                       int64_t rows, int64_t vocab) {
#pragma omp parallel for schedule(static) if (rows * vocab >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) {
      dnll[r] = T(0);
      continue;
    }
    const T* lr = logits + r * vocab;
    const T* dl = dlogits + r * vocab;
    double sum, dot;
    exp_sums(lr, dl, vocab, row_max(lr, vocab), &sum, &dot);
    dnll[r] = T(dot / sum - double(dl[targets[r]]));
  }
}

#define ZOF_JVP_INSTANTIATE(T)                                                                   \
  template void matmul<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t);          \
  template void matmul_jvp<T>(const T*, const T*, const T*, const T*, const T*, T*, int64_t,     \
                              int64_t, int64_t);                                                 \
  template void rms_norm<T>(const T*, const T*, T*, int64_t, int64_t, float);                    \
  template void rms_norm_jvp<T>(const T*, const T*, const T*, const T*, T*, int64_t, int64_t,    \
                                float);                                                          \
  template void layer_norm<T>(const T*, const T*, const T*, T*, int64_t, int64_t, float);        \
  template void layer_norm_jvp<T>(const T*, const T*, const T*, const T*, const T*, T*, int64_t, \
                                  int64_t, float);                                               \
  template void rope<T>(T*, const int32_t*, int64_t, int64_t, int64_t, float);                   \
  template void attention<T>(const T*, const T*, const T*, T*, const uint8_t*, int64_t, int64_t, \
                             int64_t, int64_t, int64_t, double);                                 \
  template void attention_jvp<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, \
                                 const uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t,    \
                                 double);                                                        \
  template void silu_mul<T>(const T*, const T*, T*, int64_t);                                    \
  template void silu_mul_jvp<T>(const T*, const T*, const T*, const T*, T*, int64_t);            \
  template void activation<T>(Activation, const T*, T*, int64_t);                                \
  template void activation_jvp<T>(Activation, const T*, const T*, T*, int64_t);                  \
  template void embedding<T>(const int32_t*, const T*, T*, int64_t, int64_t, bool);              \
  template void cross_entropy<T>(const T*, const int32_t*, T*, int64_t, int64_t);                \
  template void cross_entropy_jvp<T>(const T*, const T*, const int32_t*, T*, int64_t, int64_t);
ZOF_JVP_INSTANTIATE(float)
ZOF_JVP_INSTANTIATE(double)
#undef ZOF_JVP_INSTANTIATE

}  // namespace jvp

std::vector<double> JVPSums::gradients() const {
  ZOF_CHECK(count > 0, "the batch has no scored tokens (every target is masked)");
  std::vector<double> g(sum_dir.size());
  for (size_t j = 0; j < g.size(); ++j) g[j] = sum_dir[j] / count;
  return g;
}

// ---- the walk ----------------------------------------------------------------------------------

namespace {
constexpr int64_t kHeadChunk = 256;  // rows of logits formed at once, as Forward::head_nll

// z(key, tensor, i) for i < n: philox.h's lane-parallel z_groups16 on whole chunks of 64, the
// scalar z_group on the tail, the same bits as Backend::zo_pass perturbs with.
void fill_z(float* z, int64_t n, uint32_t tensor, const ZKey& key) {
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 64)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, m = std::min(kChunk, n - i0);
    const uint32_t g0 = (uint32_t)(i0 / 4);
    if (m == kChunk) {
      z_groups16(key, tensor, g0, z + i0);
      continue;
    }
    float t[kChunk];
    for (int64_t g = 0; g * 4 < m; ++g) z_group(key, tensor, g0 + (uint32_t)g, t + 4 * g);
    std::copy(t, t + m, z + i0);
  }
}

// Model's weight views with T pointers (into a block's weights or into its z).
template <class T>
struct EmbedT {
  const T *tokens = nullptr, *positions = nullptr, *project_in = nullptr;
};
template <class T>
struct LayerT {
  const T *ln1_w = nullptr, *ln1_b = nullptr;
  const T *q_w = nullptr, *q_b = nullptr, *k_w = nullptr, *k_b = nullptr;
  const T *v_w = nullptr, *v_b = nullptr, *qkv_w = nullptr, *qkv_b = nullptr;
  const T *o_w = nullptr, *o_b = nullptr;
  const T *ln2_w = nullptr, *ln2_b = nullptr;
  const T *fc1_w = nullptr, *fc1_b = nullptr, *up_w = nullptr, *up_b = nullptr;
  const T *fc2_w = nullptr, *fc2_b = nullptr;
};
template <class T>
struct HeadT {
  const T *norm_w = nullptr, *norm_b = nullptr, *project_out = nullptr, *lm_head = nullptr;
};
}  // namespace

template <class T>
struct BasicJVPEstimator<T>::Impl {
  const Model& model;
  const ModelConfig& cfg;
  Backend& be;
  int64_t max_rows;
  bool backend_matmul = true;
  bool llama, pre_norm;
  int64_t C, E, H, Hkv, D, Hq, Hk, I, V;

  // Weights in T (float without a shift reads the model's own storage instead), z in T.
  std::vector<T> w_embed, w_block, z_block;
  std::vector<std::vector<T>> z_embed;  // per direction: the tied LM head needs it at the end
  std::vector<float> zf;                // fp32 z from Philox, before conversion to T
  // The current layer's saved primal intermediates and their tangents (max_rows rows each).
  std::vector<T> h, hin, xn1, q, k, v, att, h1, x2, f1, f2, a, h2, qkv, tmp;
  std::vector<T> dx, dq, dk, dv, datt, dtmp, dh1, dx2, df1, df2, da, dh2, dqkv, mmtmp;
  std::vector<std::vector<T>> dh;  // per direction
  // The head's chunk of rows.
  std::vector<T> hs, dhs, hn, dhn, ho, dho, logits, dlogits, nll, dnll;

  Impl(const Model& m, Backend& b, int64_t rows)
      : model(m), cfg(m.config()), be(b), max_rows(rows) {
    llama = cfg.arch == Arch::Llama;
    pre_norm = llama || cfg.arch == Arch::GPT2 || cfg.do_layer_norm_before;
    C = cfg.hidden_size;
    E = cfg.word_embed_proj_dim > 0 ? cfg.word_embed_proj_dim : C;
    H = cfg.num_heads;
    Hkv = cfg.num_kv_heads;
    D = cfg.head_dim;
    Hq = H * D;
    Hk = Hkv * D;
    I = cfg.intermediate_size;
    V = cfg.vocab_size;
    const auto& blocks = model.blocks();
    int64_t span = 1;
    for (size_t i = 1; i < blocks.size(); ++i) span = std::max(span, blocks[i].span);
    z_block.assign(span, T(0));
    zf.assign(std::max(span, blocks[0].span), 0.f);
    const int64_t R = max_rows, CE = std::max(C, E);
    for (auto* b : {&h, &hin, &xn1, &h1, &x2, &h2, &tmp, &dx, &dtmp, &dh1, &dx2, &dh2})
      b->assign(R * CE, T(0));
    for (auto* b : {&q, &att, &dq, &datt}) b->assign(R * Hq, T(0));
    for (auto* b : {&k, &v, &dk, &dv}) b->assign(R * Hk, T(0));
    for (auto* b : {&f1, &f2, &a, &df1, &df2, &da}) b->assign(R * I, T(0));
    if (cfg.arch == Arch::GPT2) {
      qkv.assign(R * 3 * C, T(0));
      dqkv.assign(R * 3 * C, T(0));
    }
    if constexpr (std::is_same_v<T, float>)
      // The largest product: a layer's (R rows) or the LM head's (kHeadChunk rows of V).
      mmtmp.assign(std::max(R * std::max({3 * C, I, Hq, CE}), kHeadChunk * V), 0.f);
    for (auto* b : {&hs, &dhs, &hn, &dhn, &ho, &dho}) b->assign(kHeadChunk * CE, T(0));
    logits.assign(kHeadChunk * V, T(0));
    dlogits.assign(kHeadChunk * V, T(0));
    nll.assign(kHeadChunk, T(0));
    dnll.assign(kHeadChunk, T(0));
  }

  // ---- weights and directions of a block, in T ----
  // z(key) of block b into out (laid out as the block's span in storage).
  void block_z(int b, const ZKey& key, std::vector<T>& out) {
    const Block& blk = model.blocks()[b];
    if ((int64_t)out.size() < blk.span) out.assign(blk.span, T(0));
    float* dst = zf.data();
    if constexpr (std::is_same_v<T, float>) dst = out.data();
    const auto& params = model.params();
    for (int pi : blk.params) {
      const int64_t off = (params[pi].data - model.storage()) - blk.offset;
      fill_z(dst + off, params[pi].numel, (uint32_t)pi, key);
    }
    if constexpr (!std::is_same_v<T, float>)
      for (int64_t i = 0; i < blk.span; ++i) out[i] = T(zf[i]);
  }
  // Block b's weights in T: theta + shift z(shift_key) (formed in double, then rounded to T).
  const T* block_weights(int b, std::vector<T>& buf, const ZKey* shift_key, double shift) {
    const Block& blk = model.blocks()[b];
    const float* src = model.storage() + blk.offset;
    if constexpr (std::is_same_v<T, float>)
      if (!shift_key) return src;
    if ((int64_t)buf.size() < std::max<int64_t>(blk.span, 1)) buf.assign(std::max<int64_t>(blk.span, 1), T(0));
    if (shift_key) {
      const auto& params = model.params();
      std::fill(zf.begin(), zf.begin() + blk.span, 0.f);
      for (int pi : blk.params) {
        const int64_t off = (params[pi].data - model.storage()) - blk.offset;
        fill_z(zf.data() + off, params[pi].numel, (uint32_t)pi, *shift_key);
      }
    }
    for (int64_t i = 0; i < blk.span; ++i)
      buf[i] = T(double(src[i]) + (shift_key ? shift * double(zf[i]) : 0.0));
    return buf.data();
  }
  // A pointer of the model's own views, moved into base (block b) or embed_base (block 0).
  const T* at(const float* p, int b, const T* base, const T* embed_base) const {
    if (!p) return nullptr;
    const auto& blocks = model.blocks();
    const int64_t off = p - model.storage();
    if (off >= blocks[b].offset && off < blocks[b].offset + blocks[b].span)
      return base + (off - blocks[b].offset);
    ZOF_ASSERT(embed_base && off >= blocks[0].offset && off < blocks[0].offset + blocks[0].span);
    return embed_base + (off - blocks[0].offset);
  }
  EmbedT<T> embed_view(const T* base) const {
    const EmbedWeights w = model.embed();
    return {at(w.tokens, 0, base, nullptr), at(w.positions, 0, base, nullptr),
            at(w.project_in, 0, base, nullptr)};
  }
  LayerT<T> layer_view(int li, const T* base) const {
    const LayerWeights w = model.layer(li);
    auto m = [&](const float* p) { return at(p, li + 1, base, nullptr); };
    LayerT<T> o;
    o.ln1_w = m(w.ln1_w), o.ln1_b = m(w.ln1_b);
    o.q_w = m(w.q_w), o.q_b = m(w.q_b), o.k_w = m(w.k_w), o.k_b = m(w.k_b);
    o.v_w = m(w.v_w), o.v_b = m(w.v_b), o.qkv_w = m(w.qkv_w), o.qkv_b = m(w.qkv_b);
    o.o_w = m(w.o_w), o.o_b = m(w.o_b);
    o.ln2_w = m(w.ln2_w), o.ln2_b = m(w.ln2_b);
    o.fc1_w = m(w.fc1_w), o.fc1_b = m(w.fc1_b), o.up_w = m(w.up_w), o.up_b = m(w.up_b);
    o.fc2_w = m(w.fc2_w), o.fc2_b = m(w.fc2_b);
    return o;
  }
  HeadT<T> head_view(const T* base, const T* embed_base) const {
    const HeadWeights w = model.head();
    const int b = (int)model.blocks().size() - 1;
    return {at(w.norm_w, b, base, embed_base), at(w.norm_b, b, base, embed_base),
            at(w.project_out, b, base, embed_base), at(w.lm_head, b, base, embed_base)};
  }

  // ---- ops with the backend fast path ----
  void mm(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t N, int64_t K) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_matmul) return be.matmul(x, w, b, y, M, N, K);
    jvp::matmul(x, w, b, y, M, N, K);
  }
  void mm_jvp(const T* x, const T* dx_, const T* w, const T* dw, const T* db, T* dy, int64_t M,
              int64_t N, int64_t K) {
    if constexpr (std::is_same_v<T, float>) {
      if (backend_matmul && dx_ && dw) {
        be.matmul(dx_, w, db, dy, M, N, K);
        be.matmul(x, dw, nullptr, mmtmp.data(), M, N, K);
        be.add(dy, mmtmp.data(), M * N);
        return;
      }
    }
    jvp::matmul_jvp(x, dx_, w, dw, db, dy, M, N, K);
  }
  void norm(const T* x, const T* w, const T* b, T* y, int64_t rows) {
    if (llama)
      jvp::rms_norm(x, w, y, rows, C, cfg.norm_eps);
    else
      jvp::layer_norm(x, w, b, y, rows, C, cfg.norm_eps);
  }
  void norm_jvp(const T* x, const T* dx_, const T* w, const T* dw, const T* db, T* dy,
                int64_t rows) {
    if (llama)
      jvp::rms_norm_jvp(x, dx_, w, dw, dy, rows, C, cfg.norm_eps);
    else
      jvp::layer_norm_jvp(x, dx_, w, dw, db, dy, rows, C, cfg.norm_eps);
  }
  static void add_to(T* y, const T* a_, const T* b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = a_[i] + b[i];
  }
  double scale() const { return 1.0 / std::sqrt(double(D)); }

  // ---- embedding ----
  void embed_primal(const EmbedT<T>& w, const int32_t* ids, const int32_t* pos, int64_t rows) {
    if (w.project_in) {  // OPT-350m: embed in E dims (kept in xn1), project to C
      jvp::embedding(ids, w.tokens, xn1.data(), rows, E, false);
      mm(xn1.data(), w.project_in, nullptr, h.data(), rows, C, E);
    } else {
      jvp::embedding(ids, w.tokens, h.data(), rows, C, false);
    }
    if (w.positions) jvp::embedding(pos, w.positions, h.data(), rows, C, true);
  }
  void embed_tangent(const EmbedT<T>& w, const EmbedT<T>& z, const int32_t* ids,
                     const int32_t* pos, int64_t rows, T* dh_) {
    if (w.project_in) {
      jvp::embedding(ids, z.tokens, dx.data(), rows, E, false);
      mm_jvp(xn1.data(), dx.data(), w.project_in, z.project_in, nullptr, dh_, rows, C, E);
    } else {
      jvp::embedding(ids, z.tokens, dh_, rows, C, false);
    }
    if (w.positions) jvp::embedding(pos, z.positions, dh_, rows, C, true);
  }

  // ---- one transformer layer (Forward::layer's structure) ----
  // h (rows, C) in place; keeps what the tangent needs.
  void layer_primal(const LayerT<T>& w, int64_t B, int64_t S, const int32_t* pos,
                    const uint8_t* mask) {
    const int64_t rows = B * S;
    std::copy(h.begin(), h.begin() + rows * C, hin.begin());
    const T* x = hin.data();
    if (pre_norm) {
      norm(hin.data(), w.ln1_w, w.ln1_b, xn1.data(), rows);
      x = xn1.data();
    }
    if (w.qkv_w) {  // GPT-2 fused c_attn: (rows, 3C) then split
      mm(x, w.qkv_w, w.qkv_b, qkv.data(), rows, 3 * C, C);
      split_qkv(qkv.data(), q.data(), k.data(), v.data(), rows);
    } else {
      mm(x, w.q_w, w.q_b, q.data(), rows, Hq, C);
      mm(x, w.k_w, w.k_b, k.data(), rows, Hk, C);
      mm(x, w.v_w, w.v_b, v.data(), rows, Hk, C);
    }
    if (llama) {
      jvp::rope(q.data(), pos, rows, H, D, cfg.rope_theta);
      jvp::rope(k.data(), pos, rows, Hkv, D, cfg.rope_theta);
    }
    jvp::attention(q.data(), k.data(), v.data(), att.data(), mask, B, S, H, Hkv, D, scale());
    mm(att.data(), w.o_w, w.o_b, tmp.data(), rows, C, Hq);
    add_to(h1.data(), hin.data(), tmp.data(), rows * C);
    // Pre-norm: the FFN reads LN2(h1) and adds to h1. Post-norm: h1 is normed by LN1 first,
    // and the FFN reads and adds to that.
    if (pre_norm)
      norm(h1.data(), w.ln2_w, w.ln2_b, x2.data(), rows);
    else
      norm(h1.data(), w.ln1_w, w.ln1_b, x2.data(), rows);
    const T* mid = pre_norm ? h1.data() : x2.data();
    mm(x2.data(), w.fc1_w, w.fc1_b, f1.data(), rows, I, C);
    if (w.up_w) {
      mm(x2.data(), w.up_w, w.up_b, f2.data(), rows, I, C);
      jvp::silu_mul(f1.data(), f2.data(), a.data(), rows * I);
    } else {
      jvp::activation(cfg.act, f1.data(), a.data(), rows * I);
    }
    mm(a.data(), w.fc2_w, w.fc2_b, tmp.data(), rows, C, I);
    add_to(h2.data(), mid, tmp.data(), rows * C);
    if (pre_norm)
      std::copy(h2.begin(), h2.begin() + rows * C, h.begin());
    else
      norm(h2.data(), w.ln2_w, w.ln2_b, h.data(), rows);
  }

  // dh_ (rows, C): the tangent of the layer's input in, of its output out. z: the layer's z.
  void layer_tangent(const LayerT<T>& w, const LayerT<T>& z, T* dh_, int64_t B, int64_t S,
                     const int32_t* pos, const uint8_t* mask) {
    const int64_t rows = B * S;
    const T* x = hin.data();
    const T* dxin = dh_;
    if (pre_norm) {
      norm_jvp(hin.data(), dh_, w.ln1_w, z.ln1_w, z.ln1_b, dx.data(), rows);
      x = xn1.data();
      dxin = dx.data();
    }
    if (w.qkv_w) {
      mm_jvp(x, dxin, w.qkv_w, z.qkv_w, z.qkv_b, dqkv.data(), rows, 3 * C, C);
      split_qkv(dqkv.data(), dq.data(), dk.data(), dv.data(), rows);
    } else {
      mm_jvp(x, dxin, w.q_w, z.q_w, z.q_b, dq.data(), rows, Hq, C);
      mm_jvp(x, dxin, w.k_w, z.k_w, z.k_b, dk.data(), rows, Hk, C);
      mm_jvp(x, dxin, w.v_w, z.v_w, z.v_b, dv.data(), rows, Hk, C);
    }
    if (llama) {  // linear: the tangent rotates like the primal
      jvp::rope(dq.data(), pos, rows, H, D, cfg.rope_theta);
      jvp::rope(dk.data(), pos, rows, Hkv, D, cfg.rope_theta);
    }
    jvp::attention_jvp(q.data(), dq.data(), k.data(), dk.data(), v.data(), dv.data(), datt.data(),
                       mask, B, S, H, Hkv, D, scale());
    mm_jvp(att.data(), datt.data(), w.o_w, z.o_w, z.o_b, dtmp.data(), rows, C, Hq);
    add_to(dh1.data(), dh_, dtmp.data(), rows * C);
    if (pre_norm)
      norm_jvp(h1.data(), dh1.data(), w.ln2_w, z.ln2_w, z.ln2_b, dx2.data(), rows);
    else
      norm_jvp(h1.data(), dh1.data(), w.ln1_w, z.ln1_w, z.ln1_b, dx2.data(), rows);
    const T* dmid = pre_norm ? dh1.data() : dx2.data();
    mm_jvp(x2.data(), dx2.data(), w.fc1_w, z.fc1_w, z.fc1_b, df1.data(), rows, I, C);
    if (w.up_w) {
      mm_jvp(x2.data(), dx2.data(), w.up_w, z.up_w, z.up_b, df2.data(), rows, I, C);
      jvp::silu_mul_jvp(f1.data(), df1.data(), f2.data(), df2.data(), da.data(), rows * I);
    } else {
      jvp::activation_jvp(cfg.act, f1.data(), df1.data(), da.data(), rows * I);
    }
    mm_jvp(a.data(), da.data(), w.fc2_w, z.fc2_w, z.fc2_b, dtmp.data(), rows, C, I);
    if (pre_norm) {
      add_to(dh_, dmid, dtmp.data(), rows * C);
    } else {
      add_to(dh2.data(), dmid, dtmp.data(), rows * C);
      norm_jvp(h2.data(), dh2.data(), w.ln2_w, z.ln2_w, z.ln2_b, dh_, rows);
    }
  }

  void split_qkv(const T* src, T* q_, T* k_, T* v_, int64_t rows) const {
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(src + r * 3 * C, src + r * 3 * C + C, q_ + r * C);
      std::copy(src + r * 3 * C + C, src + r * 3 * C + 2 * C, k_ + r * C);
      std::copy(src + r * 3 * C + 2 * C, src + r * 3 * C + 3 * C, v_ + r * C);
    }
  }

  // ---- head: rows hs (n, C) -> logits (n, V) -> nll; with z, their tangents ----
  // Returns the sum of nll; *dsum gets the sum of its tangent when z is given.
  double head_chunk(const HeadT<T>& w, const HeadT<T>* z, const int32_t* tg, int64_t n,
                    double* dsum) {
    const T* x = hs.data();
    const int64_t EO = w.project_out ? E : C;
    if (w.norm_w) {
      norm(hs.data(), w.norm_w, w.norm_b, hn.data(), n);
      x = hn.data();
    }
    if (w.project_out) {
      mm(x, w.project_out, nullptr, ho.data(), n, E, C);
      x = ho.data();
    }
    mm(x, w.lm_head, nullptr, logits.data(), n, V, EO);
    jvp::cross_entropy(logits.data(), tg, nll.data(), n, V);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += double(nll[i]);
    if (!z) return s;
    const T* xin = hs.data();
    const T* dxin = dhs.data();
    if (w.norm_w) {
      norm_jvp(hs.data(), dhs.data(), w.norm_w, z->norm_w, z->norm_b, dhn.data(), n);
      xin = hn.data();
      dxin = dhn.data();
    }
    if (w.project_out) {
      mm_jvp(xin, dxin, w.project_out, z->project_out, nullptr, dho.data(), n, E, C);
      xin = ho.data();
      dxin = dho.data();
    }
    mm_jvp(xin, dxin, w.lm_head, z->lm_head, nullptr, dlogits.data(), n, V, EO);
    jvp::cross_entropy_jvp(logits.data(), dlogits.data(), tg, dnll.data(), n, V);
    double ds = 0;
    for (int64_t i = 0; i < n; ++i) ds += double(dnll[i]);
    *dsum = ds;
    return s;
  }
};

template <class T>
BasicJVPEstimator<T>::BasicJVPEstimator(const Model& model, Backend& backend, int64_t max_rows)
    : impl_(std::make_unique<Impl>(model, backend, max_rows)) {
  ZOF_CHECK(max_rows >= 1, "the JVP estimator needs room for at least one token");
}

template <class T>
BasicJVPEstimator<T>::~BasicJVPEstimator() = default;

template <class T>
JVPSums BasicJVPEstimator<T>::directional_derivatives(const std::vector<ZKey>& keys,
                                                      const std::vector<LossBatch>& micro) {
  ZOF_CHECK(!keys.empty(), "the JVP estimator needs at least one direction (--queries >= 1)");
  return walk(keys, nullptr, 0.0, micro);
}

template <class T>
JVPSums BasicJVPEstimator<T>::loss_along(const ZKey& key, double shift,
                                         const std::vector<LossBatch>& micro) {
  return walk({}, &key, shift, micro);
}

template <class T>
JVPSums BasicJVPEstimator<T>::walk(const std::vector<ZKey>& keys, const ZKey* shift_key,
                                   double shift, const std::vector<LossBatch>& micro) {
  ZOF_CHECK(!micro.empty(), "a JVP step needs at least one batch");
  Impl& m = *impl_;
  m.backend_matmul = backend_matmul_;
  const ModelConfig& cfg = m.cfg;
  const int q = (int)keys.size();
  const int nblocks = (int)m.model.blocks().size();
  const int64_t C = m.C;
  JVPSums out;
  out.sum_dir.assign(q, 0.0);
  // The embedding block's weights and z stay for the whole walk: the tied LM head reads them.
  const T* w_emb = m.block_weights(0, m.w_embed, shift_key, shift);
  m.z_embed.resize(q);
  for (int j = 0; j < q; ++j) m.block_z(0, keys[j], m.z_embed[j]);
  m.dh.resize(q);
  for (auto& d : m.dh) d.resize(m.max_rows * C);
  const EmbedT<T> ew = m.embed_view(w_emb);

  for (const LossBatch& lb : micro) {
    const Batch& b = lb.batch;
    const int64_t rows = b.B * b.T;
    ZOF_CHECK(rows <= m.max_rows, "batch of " + std::to_string(rows) +
                                      " tokens exceeds the JVP estimator's capacity of " +
                                      std::to_string(m.max_rows));
    ZOF_ASSERT((int64_t)lb.targets.size() == rows);
    std::vector<int32_t> pos(rows), tok_pos(rows);
    std::vector<uint8_t> mask(rows);
    for (int64_t i = 0; i < b.B; ++i)
      for (int64_t t = 0; t < b.T; ++t) {
        pos[i * b.T + t] = (int32_t)t;
        mask[i * b.T + t] = t < b.lengths[i];
      }
    for (int64_t i = 0; i < rows; ++i) {
      ZOF_CHECK(b.ids[i] >= 0 && b.ids[i] < m.V, "token id " + std::to_string(b.ids[i]) +
                                                     " is outside the model's vocabulary of " +
                                                     std::to_string(m.V));
      ZOF_CHECK(pos[i] < cfg.max_position,
                "position " + std::to_string(pos[i]) + " is beyond the model's context of " +
                    std::to_string(cfg.max_position) + " tokens (max_position_embeddings)");
      tok_pos[i] = pos[i] + (cfg.arch == Arch::OPT ? 2 : 0);  // OPT's learned-position offset
    }

    // Block 0: the embedding.
    m.embed_primal(ew, b.ids.data(), tok_pos.data(), rows);
    for (int j = 0; j < q; ++j)
      m.embed_tangent(ew, m.embed_view(m.z_embed[j].data()), b.ids.data(), tok_pos.data(), rows,
                      m.dh[j].data());
    // The layers: the primal once, then each direction's tangent from its intermediates.
    for (int li = 0; li < (int)cfg.num_layers; ++li) {
      const LayerT<T> w = m.layer_view(li, m.block_weights(li + 1, m.w_block, shift_key, shift));
      m.layer_primal(w, b.B, b.T, pos.data(), mask.data());
      for (int j = 0; j < q; ++j) {
        m.block_z(li + 1, keys[j], m.z_block);
        m.layer_tangent(w, m.layer_view(li, m.z_block.data()), m.dh[j].data(), b.B, b.T,
                        pos.data(), mask.data());
      }
    }
    // The head over the scored rows, kHeadChunk at a time; the primal is recomputed for each
    // direction rather than keeping every chunk's logits.
    const HeadT<T> hw = m.head_view(m.block_weights(nblocks - 1, m.w_block, shift_key, shift), w_emb);
    std::vector<int64_t> sel;
    for (int64_t r = 0; r < rows; ++r)
      if (lb.targets[r] >= 0) {
        ZOF_CHECK(lb.targets[r] < m.V, "target token id " + std::to_string(lb.targets[r]) +
                                           " is outside the vocabulary of " + std::to_string(m.V));
        sel.push_back(r);
      }
    std::vector<int32_t> tg(kHeadChunk);
    for (int j = 0; j < std::max(q, 1); ++j) {
      HeadT<T> hz;
      if (q > 0) {
        m.block_z(nblocks - 1, keys[j], m.z_block);
        hz = m.head_view(m.z_block.data(), m.z_embed[j].data());
      }
      for (size_t s0 = 0; s0 < sel.size(); s0 += kHeadChunk) {
        const int64_t n = std::min<int64_t>(kHeadChunk, (int64_t)(sel.size() - s0));
        for (int64_t i = 0; i < n; ++i) {
          const int64_t r = sel[s0 + i];
          std::copy(m.h.begin() + r * C, m.h.begin() + (r + 1) * C, m.hs.begin() + i * C);
          if (q > 0) std::copy(m.dh[j].begin() + r * C, m.dh[j].begin() + (r + 1) * C, m.dhs.begin() + i * C);
          tg[i] = lb.targets[r];
        }
        double ds = 0;
        const double s = m.head_chunk(hw, q > 0 ? &hz : nullptr, tg.data(), n, &ds);
        if (j == 0) out.sum_loss += s;
        if (q > 0) out.sum_dir[j] += ds;
      }
    }
    out.count += (double)sel.size();
  }
  return out;
}

template class BasicJVPEstimator<float>;
template class BasicJVPEstimator<double>;

}  // namespace zof
