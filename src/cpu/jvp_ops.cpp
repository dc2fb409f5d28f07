// The tangent rules of jvp_ops.h as host loops (OpenMP, double accumulation), in float and
// double; the host backends' tangent ops run them in fp32 (host_backend.cpp).
#include "cpu/jvp_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <type_traits>
#include <vector>

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
void rms_norm(const T* x, const T* w, T* y, int64_t rows, int64_t dim, float eps,
              float w_offset) {
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * double(xr[i]);
    const double inv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    for (int64_t i = 0; i < dim; ++i)
      y[r * dim + i] = T(double(xr[i]) * inv * double(w[i] + T(w_offset)));  // (w + 1) in T
  }
}

template <class T>
void rms_norm_jvp(const T* x, const T* dx, const T* w, const T* dw, T* dy, int64_t rows,
                  int64_t dim, float eps, float w_offset) {
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
      double d = (dxi * inv + xi * dinv) * double(w[i] + T(w_offset));
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
void rope(T* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rotary_dim, const float* inv_freq) {
  ZOF_ASSERT(rotary_dim % 2 == 0 && rotary_dim <= head_dim);
  const int64_t half = rotary_dim / 2;  // dims [rotary_dim, head_dim) pass through
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

// Softmax weights p of the query qi (D, already scaled) against its keys lo..n-1 in kt (D
// rows of stride Sp), written for all padded(n) keys (0 outside); false when it sees no key.
// cap > 0: each score x is cap tanh(x / cap) first, and slope (when given) gets 1 - tanh^2.
inline bool softmax_row(const double* qi, const double* kt, const double* bias, int64_t lo,
                        int64_t n, int64_t Sp, int64_t D, double cap, double* p,
                        double* slope = nullptr) {
  const int64_t nr = padded(n);
  dot_keys(qi, kt, Sp, D, nr, p, false);
  if (cap > 0.0)
    for (int64_t j = 0; j < nr; ++j) {
      const double t = std::tanh(p[j] / cap);
      p[j] = cap * t;
      if (slope) slope[j] = 1.0 - t * t;
    }
  for (int64_t j = 0; j < nr; ++j) p[j] += j < n && j >= lo ? bias[j] : kNegInf;
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
               int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, int64_t window,
               double softcap) {
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
      const int64_t lo = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
      const bool sees = softmax_row(qi.data(), kt.data() + kvo, bias.data() + b * S, lo, i + 1,
                                    Sp, D, softcap, p.data());
      for (int64_t d = 0; d < D; ++d)
        out[qo + d] = T(sees ? dot_padded(p.data(), vt.data() + kvo + d * Sp, nr) : 0.0);
    }
  }
}

template <class T>
void attention_jvp(const T* q, const T* dq, const T* k, const T* dk, const T* v, const T* dv,
                   T* dout, const uint8_t* key_mask, int64_t B, int64_t S, int64_t H, int64_t Hkv,
                   int64_t D, double scale, int64_t window, double softcap) {
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
    std::vector<double> slope(softcap > 0.0 ? std::max<int64_t>(Sp, 1) : 0);
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
      const int64_t lo = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
      if (!softmax_row(qi.data(), kt.data() + kvo, bias.data() + b * S, lo, i + 1, Sp, D, softcap,
                       p.data(), softcap > 0.0 ? slope.data() : nullptr)) {
        for (int64_t d = 0; d < D; ++d) dout[qo + d] = T(0);
        continue;
      }
      // ds_j = dq.k_j + q.dk_j (scaled); hidden keys have p_j = 0 and drop out below.
      dot_keys(dqi.data(), kt.data() + kvo, Sp, D, nr, ds.data(), false);
      if (dk) dot_keys(qi.data(), dkt.data() + kvo, Sp, D, nr, ds.data(), true);
      if (softcap > 0.0)
        for (int64_t j = 0; j < nr; ++j) ds[j] *= slope[j];  // through the cap's tanh
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
double act_value(Activation act, double a);
double act_slope(Activation act, double a);
}  // namespace

template <class T>
void gelu_tanh_mul(const T* gate, const T* up, T* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i)
    out[i] = T(act_value(Activation::GeluTanh, double(gate[i])) * double(up[i]));
}

template <class T>
void gelu_tanh_mul_jvp(const T* gate, const T* dgate, const T* up, const T* dup, T* dout,
                       int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    double d = 0.0;
    if (dgate) d += act_slope(Activation::GeluTanh, g) * double(dgate[i]) * double(up[i]);
    if (dup) d += act_value(Activation::GeluTanh, g) * double(dup[i]);
    dout[i] = T(d);
  }
}

template <class T>
void softcap(const T* x, T* y, double cap, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) y[i] = T(cap * std::tanh(double(x[i]) / cap));
}

template <class T>
void softcap_jvp(const T* x, const T* dx, T* dy, double cap, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const double t = std::tanh(double(x[i]) / cap);
    dy[i] = dx ? T((1.0 - t * t) * double(dx[i])) : T(0);
  }
}

namespace {
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
  for (int64_t i = 0; i < n; ++i) dy[i] = dx ? T(act_slope(act, double(x[i])) * double(dx[i])) : T(0);
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
  template void rms_norm<T>(const T*, const T*, T*, int64_t, int64_t, float, float);             \
  template void rms_norm_jvp<T>(const T*, const T*, const T*, const T*, T*, int64_t, int64_t,    \
                                float, float);                                                   \
  template void layer_norm<T>(const T*, const T*, const T*, T*, int64_t, int64_t, float);        \
  template void layer_norm_jvp<T>(const T*, const T*, const T*, const T*, const T*, T*, int64_t, \
                                  int64_t, float);                                               \
  template void rope<T>(T*, const int32_t*, int64_t, int64_t, int64_t, int64_t, const float*);  \
  template void attention<T>(const T*, const T*, const T*, T*, const uint8_t*, int64_t, int64_t, \
                             int64_t, int64_t, int64_t, double, int64_t, double);                \
  template void attention_jvp<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, \
                                 const uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t,    \
                                 double, int64_t, double);                                       \
  template void gelu_tanh_mul<T>(const T*, const T*, T*, int64_t);                               \
  template void gelu_tanh_mul_jvp<T>(const T*, const T*, const T*, const T*, T*, int64_t);       \
  template void softcap<T>(const T*, T*, double, int64_t);                                       \
  template void softcap_jvp<T>(const T*, const T*, T*, double, int64_t);                         \
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

}  // namespace zof
