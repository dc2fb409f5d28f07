// The JVP walk's oracle: jvp_ops.h's plain host loops (accumulating in double) as a kernel set
// for src/zo/jvp_walk.h, in float64 (OracleJVP: transformers' float64 reference, central
// differences) or fp32 (PlainLoopJVP: what the Backend path is checked against). Host backends
// only: every buffer is host memory.
#pragma once
#include <cmath>
#include <cstring>

#include "cpu/jvp_ops.h"
#include "model/graph_ops.h"
#include "zo/jvp_walk.h"

namespace zof::test {

template <class U>
struct HostKernels {
  using T = U;
  using W = const T*;
  static double scale(int64_t D) { return 1.0 / std::sqrt(double(D)); }

  void matmul(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t N, int64_t K) {
    jvp::matmul(x, w, b, y, M, N, K);
  }
  void matmul_jvp(const T* x, const T* dx, const T* w, const T* dw, const T* db, T* dy,
                  int64_t M, int64_t N, int64_t K) {
    jvp::matmul_jvp(x, dx, w, dw, db, dy, M, N, K);
  }
  void rms_norm(const T* x, const T* w, T* y, int64_t rows, int64_t dim, float eps,
                float w_offset) {
    jvp::rms_norm(x, w, y, rows, dim, eps, w_offset);
  }
  void layer_norm(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t dim,
                  float eps) {
    jvp::layer_norm(x, w, b, y, rows, dim, eps);
  }
  void rms_norm_jvp(const T* x, const T* dx, const T* w, const T* dw, T* dy, int64_t rows,
                    int64_t dim, float eps, float w_offset) {
    jvp::rms_norm_jvp(x, dx, w, dw, dy, rows, dim, eps, w_offset);
  }
  void layer_norm_jvp(const T* x, const T* dx, const T* w, const T* dw, const T* db, T* dy,
                      int64_t rows, int64_t dim, float eps) {
    jvp::layer_norm_jvp(x, dx, w, dw, db, dy, rows, dim, eps);
  }
  void rope(T* x, const int32_t* pos, int64_t rows, int64_t heads, int64_t D, int64_t Dr,
            const float* inv_freq) {
    jvp::rope(x, pos, rows, heads, D, Dr, inv_freq);
  }
  void attention(const T* q, const T* k, const T* v, T* out, const uint8_t* mask, int64_t B,
                 int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, int64_t window,
                 float softcap) {
    jvp::attention(q, k, v, out, mask, B, S, H, Hkv, D, scale, window, double(softcap));
  }
  void attention_jvp(const T* q, const T* dq, const T* k, const T* dk, const T* v, const T* dv,
                     T* dout, const uint8_t* mask, int64_t B, int64_t S, int64_t H, int64_t Hkv,
                     int64_t D, double scale, int64_t window, float softcap) {
    jvp::attention_jvp(q, dq, k, dk, v, dv, dout, mask, B, S, H, Hkv, D, scale, window,
                       double(softcap));
  }
  void silu_mul(const T* gate, const T* up, T* out, int64_t n) { jvp::silu_mul(gate, up, out, n); }
  void gelu_tanh_mul(const T* gate, const T* up, T* out, int64_t n) {
    jvp::gelu_tanh_mul(gate, up, out, n);
  }
  void gelu_tanh_mul_jvp(const T* gate, const T* dgate, const T* up, const T* dup, T* dout,
                         int64_t n) {
    jvp::gelu_tanh_mul_jvp(gate, dgate, up, dup, dout, n);
  }
  void mul_scalar(T* x, float a, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = T(double(x[i]) * double(a));
  }
  void softcap(const T* x, T* y, float cap, int64_t n) { jvp::softcap(x, y, double(cap), n); }
  void softcap_jvp(const T* x, const T* dx, T* dy, float cap, int64_t n) {
    jvp::softcap_jvp(x, dx, dy, double(cap), n);
  }
  void activation(Activation act, T* x, int64_t n) { jvp::activation(act, x, x, n); }
  void silu_mul_jvp(const T* gate, const T* dgate, const T* up, const T* dup, T* dout, int64_t n) {
    jvp::silu_mul_jvp(gate, dgate, up, dup, dout, n);
  }
  void activation_jvp(Activation act, const T* x, const T* dx, T* dy, int64_t n) {
    jvp::activation_jvp(act, x, dx, dy, n);
  }
  void add(T* y, const T* x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void copy(T* y, const T* x, int64_t n) { std::memcpy(y, x, size_t(n) * sizeof(T)); }
  void split_qkv(const T* src, T* q, T* k, T* v, int64_t rows, int64_t C) {
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(q + r * C, src + r * 3 * C, size_t(C) * sizeof(T));
      std::memcpy(k + r * C, src + r * 3 * C + C, size_t(C) * sizeof(T));
      std::memcpy(v + r * C, src + r * 3 * C + 2 * C, size_t(C) * sizeof(T));
    }
  }
  void embedding(const int32_t* ids, const T* table, T* out, int64_t n, int64_t dim,
                 bool accumulate) {
    jvp::embedding(ids, table, out, n, dim, accumulate);
  }
  void cross_entropy(const T* logits, const int32_t* targets, T* nll, int64_t rows, int64_t V) {
    jvp::cross_entropy(logits, targets, nll, rows, V);
  }
  void cross_entropy_jvp(const T* logits, const T* dlogits, const int32_t* targets, T* dnll,
                         int64_t rows, int64_t V) {
    jvp::cross_entropy_jvp(logits, dlogits, targets, dnll, rows, V);
  }
};

// The walk over the plain loops: the float64 oracle and the fp32 loops.
template <class U>
class HostJVP : public JVPWalk<HostKernels<U>> {
 public:
  HostJVP(const Model& m, Backend& be, int64_t max_rows, int directions = 1)
      : JVPWalk<HostKernels<U>>(m, be, max_rows, directions, HostKernels<U>{}) {}
};
using OracleJVP = HostJVP<double>;
using PlainLoopJVP = HostJVP<float>;

}  // namespace zof::test
