// The reference backend: every op once, as the plainest scalar loop, accumulating in double.
// It is the oracle the fast backends are tested against, so it is never optimized: keep it
// obviously right rather than fast.
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <vector>

#include "cpu/host_backend.h"
#include "zof/error.h"

namespace zof::ref {

void matmul(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t N,
            int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * double(w[n * K + k]);
      if (bias) acc += double(bias[n]);
      y[m * N + n] = float(acc);
    }
  }
}

// bf16 weights: x rounded to bf16 (nearest even), each product exact, the sum in double.
void matmul_bf16(const float* x, const uint16_t* w, const float* bias, float* y, int64_t M,
                 int64_t N, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(bf16_round(x[m * K + k])) * double(bf16_to_f32(w[n * K + k]));
      if (bias) acc += double(bias[n]);
      y[m * N + n] = float(acc);
    }
  }
}

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
              float w_offset) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += double(xr[i]) * double(xr[i]);
    double inv = 1.0 / std::sqrt(ss / double(dim) + double(eps));
    // (w + w_offset) in fp32, as transformers' Gemma forms (1 + w.float())
    for (int64_t i = 0; i < dim; ++i) yr[i] = float(double(xr[i]) * inv * double(w[i] + w_offset));
  }
}

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double mean = 0.0;
    for (int64_t i = 0; i < dim; ++i) mean += double(xr[i]);
    mean /= double(dim);
    double var = 0.0;
    for (int64_t i = 0; i < dim; ++i) var += (double(xr[i]) - mean) * (double(xr[i]) - mean);
    var /= double(dim);
    double inv = 1.0 / std::sqrt(var + double(eps));
    for (int64_t i = 0; i < dim; ++i)
      yr[i] = float((double(xr[i]) - mean) * inv * double(w[i]) + double(b[i]));
  }
}

void rope(float* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rotary_dim, const float* inv_freq) {
  const int64_t half = rotary_dim / 2;  // dims [rotary_dim, head_dim) pass through
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < half; ++i) {
      // The angle is rounded to fp32 as Hugging Face computes it (see backend.h); after that
      // everything is exact to double.
      float angle = float(pos[r]) * inv_freq[i];
      double c = std::cos(double(angle)), s = std::sin(double(angle));
      for (int64_t h = 0; h < n_heads; ++h) {
        float* xh = x + (r * n_heads + h) * head_dim;
        double a = xh[i], b = xh[i + half];
        xh[i] = float(a * c - b * s);
        xh[i + half] = float(b * c + a * s);
      }
    }
  }
}

// bf16: q * scale, k, v and the probabilities rounded to bf16 where they are multiplied
// (Backend::attention), the rest in double; a probability is rounded from its value against the
// row's overall maximum.
void attention(const float* q, const float* k, const float* v, float* out,
               const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
               int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
               float softcap, bool bf16) {
  auto r = [bf16](float x) { return bf16 ? bf16_round(x) : x; };
  const int64_t group = H / Hkv;
  std::vector<double> score(size_t(Tk > 0 ? Tk : 1));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < Tq; ++i) {
        const float* qi = q + ((b * Tq + i) * H + h) * D;
        float* oi = out + ((b * Tq + i) * H + h) * D;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Tk; ++j) {
          bool visible = j <= q_offset + i && (!key_mask || key_mask[b * Tk + j] != 0) &&
                         (window <= 0 || j > q_offset + i - window);
          score[j] = -std::numeric_limits<double>::infinity();
          if (!visible) continue;
          const float* kj = k + ((b * Tk + j) * Hkv + hk) * D;
          double dot = 0.0;
          if (bf16) {  // the scaled query rounded, as the kernels do
            for (int64_t d = 0; d < D; ++d) dot += double(r(qi[d] * scale)) * double(r(kj[d]));
            score[j] = dot;
          } else {
            for (int64_t d = 0; d < D; ++d) dot += double(qi[d]) * double(kj[d]);
            score[j] = dot * double(scale);
          }
          if (softcap > 0.0f) score[j] = double(softcap) * std::tanh(score[j] / double(softcap));
          if (score[j] > mx) mx = score[j];
        }
        for (int64_t d = 0; d < D; ++d) oi[d] = 0.0f;
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // sees no key
        double sum = 0.0;
        for (int64_t j = 0; j < Tk; ++j) {
          score[j] = std::exp(score[j] - mx);  // exp(-inf) = 0 for hidden keys
          sum += score[j];
        }
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < Tk; ++j)
            if (score[j] != 0.0)
              acc += (bf16 ? double(r(float(score[j]))) : score[j]) *
                     double(r(v[((b * Tk + j) * Hkv + hk) * D + d]));
          oi[d] = float(acc / sum);
        }
      }
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double g = gate[i];
    out[i] = float(g / (1.0 + std::exp(-g)) * double(up[i]));
  }
}

void gelu_tanh(float* x, int64_t n) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  for (int64_t i = 0; i < n; ++i) {
    double a = x[i];
    x[i] = float(0.5 * a * (1.0 + std::tanh(c * (a + 0.044715 * a * a * a))));
  }
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  const double c = std::sqrt(2.0 / std::numbers::pi);
  for (int64_t i = 0; i < n; ++i) {
    double a = gate[i];
    out[i] = float(0.5 * a * (1.0 + std::tanh(c * (a + 0.044715 * a * a * a))) * double(up[i]));
  }
}

void mul_scalar(float* x, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

void softcap(const float* x, float* y, float cap, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = float(double(cap) * std::tanh(double(x[i]) / double(cap)));
}

void gelu_erf(float* x, int64_t n) {
  // 0.5 x (1 + erf(x/sqrt2)) written with erfc so that the far negative tail keeps its digits.
  for (int64_t i = 0; i < n; ++i) {
    double a = x[i];
    x[i] = float(0.5 * a * std::erfc(-a / std::sqrt(2.0)));
  }
}

void relu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN stays NaN, as in torch
}

void add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
               bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    const float* row = table + int64_t(ids[i]) * dim;
    for (int64_t d = 0; d < dim; ++d)
      out[i * dim + d] = accumulate ? out[i * dim + d] + row[d] : row[d];
  }
}

void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                   int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* lr = logits + r * vocab;
    if (targets[r] < 0) {
      nll[r] = 0.0f;
      continue;
    }
    ZOF_ASSERT(targets[r] < vocab);
    double mx = lr[0];
    for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, double(lr[j]));
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(lr[j]) - mx);
    nll[r] = float(mx + std::log(sum) - double(lr[targets[r]]));
  }
}

namespace {

class ReferenceBackend final : public cpu::HostBackend {
 public:
  std::string name() const override { return "reference"; }

  ComputeInfo compute_info() const override {
    return ComputeInfo{false, "reference (scalar loops, double sums)"};
  }
  void matmul(const float* x, const void* w, DType wt, const float* bias, float* y, int64_t M,
              int64_t N, int64_t K, Stream*) override {
    ZOF_CHECK(wt == DType::F32 || wt == DType::BF16,
              std::string("the reference matrix product takes fp32 or bf16 weights, not ") +
                  dtype_name(wt));
    if (wt == DType::BF16)
      ref::matmul_bf16(x, static_cast<const uint16_t*>(w), bias, y, M, N, K);
    else
      ref::matmul(x, static_cast<const float*>(w), bias, y, M, N, K);
  }
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                float w_offset, Stream*) override {
    ref::rms_norm(x, w, y, rows, dim, eps, w_offset);
  }
  void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                  int64_t dim, float eps, Stream*) override {
    ref::layer_norm(x, w, b, y, rows, dim, eps);
  }
  void rope(float* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
            int64_t rotary_dim, const float* inv_freq, Stream*) override {
    ZOF_ASSERT(rotary_dim % 2 == 0 && rotary_dim <= head_dim);
    ref::rope(x, pos, rows, n_heads, head_dim, rotary_dim, inv_freq);
  }
  void attention(const float* q, const float* k, const float* v, float* out,
                 const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                 int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
                 float softcap, DType t, Stream*) override {
    ZOF_ASSERT(Hkv > 0 && H % Hkv == 0);
    ZOF_CHECK(t == DType::F32 || t == DType::BF16,
              std::string("attention computes on fp32 or bf16 inputs, not ") + dtype_name(t));
    ref::attention(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, window, softcap,
                   t == DType::BF16);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n, Stream*) override {
    ref::silu_mul(gate, up, out, n);
  }
  void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n,
                     Stream*) override {
    ref::gelu_tanh_mul(gate, up, out, n);
  }
  void mul_scalar(float* x, float a, int64_t n, Stream*) override { ref::mul_scalar(x, a, n); }
  void softcap(const float* x, float* y, float cap, int64_t n, Stream*) override {
    ref::softcap(x, y, cap, n);
  }
  void gelu_tanh(float* x, int64_t n, Stream*) override { ref::gelu_tanh(x, n); }
  void gelu_erf(float* x, int64_t n, Stream*) override { ref::gelu_erf(x, n); }
  void relu(float* x, int64_t n, Stream*) override { ref::relu(x, n); }
  void add(float* y, const float* x, int64_t n, Stream*) override { ref::add(y, x, n); }
  void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
                 bool accumulate, Stream*) override {
    ref::embedding(ids, table, out, n, dim, accumulate);
  }
  void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                     int64_t vocab, Stream*) override {
    ref::cross_entropy(logits, targets, nll, rows, vocab);
  }
};

}  // namespace
}  // namespace zof::ref

namespace zof {
std::unique_ptr<Backend> make_reference_backend() {
  return std::make_unique<ref::ReferenceBackend>();
}
}  // namespace zof
