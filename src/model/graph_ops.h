// The ops objects that run block_graph.h's graphs: Primal (the values themselves) and Tangent
// (forward-mode AD: each op's tangent rule along one direction, from the primal values the walk
// kept). Both are written over a kernel set K, the raw ops on buffers of K::T:
//   BackendKernels (below): fp32 through the Backend interface, the engine's walks on any backend;
//   tests/model/host_kernels.h: jvp_ops.h's plain loops in float or float64, the oracle.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/block_graph.h"
#include "zof/backend.h"
#include "zof/error.h"

namespace zof::graph {

// One call's values (each a buffer of the call's rows) and the inputs the ops read.
template <class T>
struct Frame {
  T* v[kNumValues] = {};
  int64_t rows = 0;                    // B * S, or a packed batch's tokens
  int64_t B = 0, S = 0;                // attention's sequences (packed: S is the longest)
  const int32_t* starts = nullptr;     // host: packed sequences' first rows (B + 1), else null
  const int32_t* ids = nullptr;        // gather's rows (token ids)
  const int32_t* embed_pos = nullptr;  // gather_add's rows (a learned position table's)
  const int32_t* pos = nullptr;        // RoPE positions
  const float* inv_freq = nullptr;     // RoPE's table (Dims::Dr / 2), ModelConfig::rope_inv_freq
  const float* inv_freq_local = nullptr;  // the sliding layers' (rope_local_inv_freq), if any
  const uint8_t* key_mask = nullptr;   // (B, S); null: every key valid
  const int32_t* targets = nullptr;    // cross_entropy's (rows); < 0 not scored
  // Several values in one buffer.
  void set(std::initializer_list<Value> vals, T* p) {
    for (Value x : vals) v[x] = p;
  }
};

// y = a + b (n elements) where y may be a or b: in place when it is, else a copy and an add.
template <class K, class T>
void add_into(K& k, T* y, const T* a, const T* b, int64_t n) {
  if (y == a) return k.add(y, b, n);
  if (y == b) return k.add(y, a, n);
  k.copy(y, a, n);
  k.add(y, b, n);
}

// Runs f(first row, B, S, key mask) over attention's sequences: the whole padded batch in one
// call, or each packed sequence on its own at its own length (Batch::starts).
template <class T, class F>
void for_sequences(const Frame<T>& fr, F&& f) {
  if (!fr.starts) return f(int64_t(0), fr.B, fr.S, fr.key_mask);
  for (int64_t b = 0; b < fr.B; ++b)
    f(int64_t(fr.starts[b]), int64_t(1), int64_t(fr.starts[b + 1] - fr.starts[b]),
      static_cast<const uint8_t*>(nullptr));
}

// The attention's score scale: the config's (Gemma's query_pre_attn_scalar^-1/2), else the
// kernels' head_dim^-1/2.
template <class K>
auto attn_scale(const Dims& d) -> decltype(K::scale(d.D)) {
  return d.attn_scale != 0.f ? d.attn_scale : K::scale(d.D);
}

// The primal: each op on the frame's buffers. Values that share a buffer are updated in place
// where the op allows it (norm, add, copy, activation; see block_graph.h for which may share).
template <class K>
class Primal {
 public:
  using T = typename K::T;
  using W = typename K::W;  // the kernels' weight handle (Weight through the Backend)
  Primal(K& k, const Dims& d, Frame<T>& f) : k_(k), d_(d), f_(f) {}
  Primal(K& k, const Dims& d, Frame<T>&& f) = delete;  // the frame must outlive the ops

  void norm(Value y, Value x, W w, W b) {
    if (d_.rms_norm)
      k_.rms_norm(v(x), w, v(y), f_.rows, d_.C, d_.eps, d_.norm_offset);
    else
      k_.layer_norm(v(x), w, b, v(y), f_.rows, d_.C, d_.eps);
  }
  // RMSNorm of (rows * heads, D): each head's D values (y may be x).
  void head_norm(Value y, Value x, W w, int64_t heads) {
    k_.rms_norm(v(x), w, v(y), f_.rows * heads, d_.D, d_.eps, d_.norm_offset);
  }
  void scale(Value x, float a) { k_.mul_scalar(v(x), a, f_.rows * d_.C); }
  void softcap(Value y, Value x) { k_.softcap(v(x), v(y), d_.final_softcap, f_.rows * d_.V); }
  void matmul(Value y, Value x, W w, W b, int64_t N, int64_t Kd) {
    k_.matmul(v(x), w, b, v(y), f_.rows, N, Kd);
  }
  void split_qkv(Value qkv, Value q, Value kk, Value vv) {
    k_.split_qkv(v(qkv), v(q), v(kk), v(vv), f_.rows, d_.C);
  }
  void rope(Value x, int64_t heads) {
    const float* table = d_.local_rope ? f_.inv_freq_local : f_.inv_freq;
    ZOF_ASSERT(table);
    k_.rope(v(x), f_.pos, f_.rows, heads, d_.D, d_.Dr, table);
  }
  void attention(Value out, Value q, Value kk, Value vv) {
    // Kernels that take a packed batch whole run its sequences in one call (the same values).
    if constexpr (requires { &K::attention_packed; })
      if (f_.starts)
        return k_.attention_packed(v(q), v(kk), v(vv), v(out), f_.starts, f_.B, d_.H, d_.Hkv,
                                   d_.D, attn_scale<K>(d_), d_.window, d_.attn_softcap);
    for_sequences(f_, [&](int64_t r0, int64_t B, int64_t S, const uint8_t* mask) {
      const int64_t qo = r0 * d_.Hq, ko = r0 * d_.Hk;
      k_.attention(v(q) + qo, v(kk) + ko, v(vv) + ko, v(out) + qo, mask, B, S, d_.H, d_.Hkv,
                   d_.D, attn_scale<K>(d_), d_.window, d_.attn_softcap);
    });
  }
  void activation(Value out, Value f1, Value f2) {
    const int64_t n = f_.rows * d_.I;
    if (f2 != kNone && d_.act == Activation::GeluTanh)
      return k_.gelu_tanh_mul(v(f1), v(f2), v(out), n);
    if (f2 != kNone) return k_.silu_mul(v(f1), v(f2), v(out), n);
    if (v(out) != v(f1)) k_.copy(v(out), v(f1), n);
    k_.activation(d_.act, v(out), n);
  }
  // (rows, C) values.
  void add(Value y, Value a, Value b) { add_into(k_, v(y), v(a), v(b), f_.rows * d_.C); }
  void copy(Value y, Value x) {
    if (v(y) != v(x)) k_.copy(v(y), v(x), f_.rows * d_.C);
  }
  void gather(Value y, W table, int64_t dim) {
    k_.embedding(f_.ids, table, v(y), f_.rows, dim, false);
  }
  void gather_add(Value y, W table, int64_t dim) {
    k_.embedding(f_.embed_pos, table, v(y), f_.rows, dim, true);
  }
  void cross_entropy(Value nll, Value logits) {
    k_.cross_entropy(v(logits), f_.targets, v(nll), f_.rows, d_.V);
  }

 protected:
  T* v(Value x) const {
    ZOF_ASSERT(x >= 0 && f_.v[x]);
    return f_.v[x];
  }
  K& k_;
  const Dims d_;
  Frame<T>& f_;
};

// A weight and its tangent (z, the direction), the tangent ops' weight handle.
template <class T>
struct Dual {
  const T* w = nullptr;
  const T* z = nullptr;
};

// The tangent along one direction: each op writes its output's tangent from the primal values
// (p, as the primal walk left them) and the input tangents (t). Matrix products, RoPE, the
// embedding and the QKV split are linear: their tangent is the op on the tangents (plus the
// weight's term).
template <class K>
class Tangent {
 public:
  using T = typename K::T;
  using W = Dual<T>;
  Tangent(K& k, const Dims& d, const Frame<T>& primal, Frame<T>& tangent)
      : k_(k), d_(d), p_(primal), t_(tangent) {}
  Tangent(K& k, const Dims& d, const Frame<T>&& primal, Frame<T>& tangent) = delete;
  Tangent(K& k, const Dims& d, const Frame<T>& primal, Frame<T>&& tangent) = delete;

  void norm(Value y, Value x, W w, W b) {
    if (d_.rms_norm)
      k_.rms_norm_jvp(p(x), t(x), w.w, w.z, t(y), p_.rows, d_.C, d_.eps, d_.norm_offset);
    else
      k_.layer_norm_jvp(p(x), t(x), w.w, w.z, b.z, t(y), p_.rows, d_.C, d_.eps);
  }
  // The RMSNorm tangent rule over (rows * heads, D).
  void head_norm(Value y, Value x, W w, int64_t heads) {
    k_.rms_norm_jvp(p(x), t(x), w.w, w.z, t(y), p_.rows * heads, d_.D, d_.eps, d_.norm_offset);
  }
  // Linear: the tangent scaled in place.
  void scale(Value x, float a) { k_.mul_scalar(t(x), a, p_.rows * d_.C); }
  void softcap(Value y, Value x) {
    k_.softcap_jvp(p(x), t(x), t(y), d_.final_softcap, p_.rows * d_.V);
  }
  void matmul(Value y, Value x, W w, W b, int64_t N, int64_t Kd) {
    k_.matmul_jvp(p(x), t(x), w.w, w.z, b.z, t(y), p_.rows, N, Kd);
  }
  void split_qkv(Value qkv, Value q, Value kk, Value vv) {
    k_.split_qkv(t(qkv), t(q), t(kk), t(vv), p_.rows, d_.C);
  }
  void rope(Value x, int64_t heads) {
    const float* table = d_.local_rope ? p_.inv_freq_local : p_.inv_freq;
    ZOF_ASSERT(table);
    k_.rope(t(x), p_.pos, p_.rows, heads, d_.D, d_.Dr, table);
  }
  void attention(Value out, Value q, Value kk, Value vv) {
    for_sequences(p_, [&](int64_t r0, int64_t B, int64_t S, const uint8_t* mask) {
      const int64_t qo = r0 * d_.Hq, ko = r0 * d_.Hk;
      k_.attention_jvp(p(q) + qo, t(q) + qo, p(kk) + ko, t(kk) + ko, p(vv) + ko, t(vv) + ko,
                       t(out) + qo, mask, B, S, d_.H, d_.Hkv, d_.D, attn_scale<K>(d_), d_.window,
                       d_.attn_softcap);
    });
  }
  void activation(Value out, Value f1, Value f2) {
    const int64_t n = p_.rows * d_.I;
    if (f2 != kNone && d_.act == Activation::GeluTanh)
      return k_.gelu_tanh_mul_jvp(p(f1), t(f1), p(f2), t(f2), t(out), n);
    if (f2 != kNone) return k_.silu_mul_jvp(p(f1), t(f1), p(f2), t(f2), t(out), n);
    k_.activation_jvp(d_.act, p(f1), t(f1), t(out), n);
  }
  void add(Value y, Value a, Value b) { add_into(k_, t(y), t(a), t(b), p_.rows * d_.C); }
  void copy(Value y, Value x) {
    if (t(y) != t(x)) k_.copy(t(y), t(x), p_.rows * d_.C);
  }
  void gather(Value y, W table, int64_t dim) {
    k_.embedding(p_.ids, table.z, t(y), p_.rows, dim, false);
  }
  void gather_add(Value y, W table, int64_t dim) {
    k_.embedding(p_.embed_pos, table.z, t(y), p_.rows, dim, true);
  }
  void cross_entropy(Value nll, Value logits) {
    k_.cross_entropy_jvp(p(logits), t(logits), p_.targets, t(nll), p_.rows, d_.V);
  }

 private:
  const T* p(Value x) const {
    ZOF_ASSERT(x >= 0 && p_.v[x]);
    return p_.v[x];
  }
  T* t(Value x) const {
    ZOF_ASSERT(x >= 0 && t_.v[x]);
    return t_.v[x];
  }
  K& k_;
  const Dims d_;
  const Frame<T>& p_;
  Frame<T>& t_;
};

// fp32 kernels through the Backend (any backend: every pointer is its memory), on the default
// stream.
struct BackendKernels {
  using T = float;
  // The primal's weights: fp32, but for a bf16 walk's matrix-product weights (model.h).
  using W = Weight;
  Backend& be;
  float* mmtmp = nullptr;  // matmul_jvp's scratch, M * N floats; set by a walk that needs it
  DType attn = DType::F32;  // attention's inputs: a bf16 walk's are bf16 (Backend::attention)

  static float scale(int64_t D) { return 1.f / std::sqrt((float)D); }

  void matmul(const float* x, Weight w, Weight b, float* y, int64_t M, int64_t N, int64_t K) {
    be.matmul(x, w.p, w.dtype, b.f32(), y, M, N, K);
  }
  // dy = dx w^T + db + x dw^T (every linear layer of a walk has both tangents: z perturbs
  // every weight).
  void matmul_jvp(const float* x, const float* dx, const float* w, const float* dw,
                  const float* db, float* dy, int64_t M, int64_t N, int64_t K) {
    ZOF_ASSERT(dx && dw && mmtmp);
    be.matmul(dx, w, db, dy, M, N, K);
    be.matmul(x, dw, nullptr, mmtmp, M, N, K);
    be.add(dy, mmtmp, M * N);
  }
  void rms_norm(const float* x, Weight w, float* y, int64_t rows, int64_t dim, float eps,
                float w_offset) {
    be.rms_norm(x, w.f32(), y, rows, dim, eps, w_offset);
  }
  void layer_norm(const float* x, Weight w, Weight b, float* y, int64_t rows, int64_t dim,
                  float eps) {
    be.layer_norm(x, w.f32(), b.f32(), y, rows, dim, eps);
  }
  void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                    int64_t rows, int64_t dim, float eps, float w_offset) {
    be.rms_norm_jvp(x, dx, w, dw, dy, rows, dim, eps, w_offset);
  }
  void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                      const float* db, float* dy, int64_t rows, int64_t dim, float eps) {
    be.layer_norm_jvp(x, dx, w, dw, db, dy, rows, dim, eps);
  }
  void rope(float* x, const int32_t* pos, int64_t rows, int64_t heads, int64_t D, int64_t Dr,
            const float* inv_freq) {
    be.rope(x, pos, rows, heads, D, Dr, inv_freq);
  }
  void attention(const float* q, const float* k, const float* v, float* out,
                 const uint8_t* mask, int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D,
                 float scale, int64_t window, float softcap) {
    be.attention(q, k, v, out, mask, B, S, S, H, Hkv, D, 0, scale, window, softcap, attn);
  }
  void attention_packed(const float* q, const float* k, const float* v, float* out,
                        const int32_t* starts, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                        float scale, int64_t window, float softcap) {
    be.attention_packed(q, k, v, out, starts, B, H, Hkv, D, scale, window, softcap, attn);
  }
  void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                     const float* v, const float* dv, float* dout, const uint8_t* mask,
                     int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                     int64_t window, float softcap) {
    be.attention_jvp(q, dq, k, dk, v, dv, dout, mask, B, S, H, Hkv, D, scale, window, softcap);
  }
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
    be.silu_mul(gate, up, out, n);
  }
  void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
    be.gelu_tanh_mul(gate, up, out, n);
  }
  void gelu_tanh_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                         float* dout, int64_t n) {
    be.gelu_tanh_mul_jvp(gate, dgate, up, dup, dout, n);
  }
  void mul_scalar(float* x, float a, int64_t n) { be.mul_scalar(x, a, n); }
  void softcap(const float* x, float* y, float cap, int64_t n) { be.softcap(x, y, cap, n); }
  void softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n) {
    be.softcap_jvp(x, dx, dy, cap, n);
  }
  // In place.
  void activation(Activation act, float* x, int64_t n) {
    switch (act) {
      case Activation::ReLU: return be.relu(x, n);
      case Activation::GeluTanh: return be.gelu_tanh(x, n);
      case Activation::GeluErf: return be.gelu_erf(x, n);
      case Activation::SiLU: break;
    }
    ZOF_ABORT("SiLU without a gate is not an architecture zof knows");
  }
  void silu_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                    float* dout, int64_t n) {
    be.silu_mul_jvp(gate, dgate, up, dup, dout, n);
  }
  void activation_jvp(Activation act, const float* x, const float* dx, float* dy, int64_t n) {
    switch (act) {
      case Activation::ReLU: return be.relu_jvp(x, dx, dy, n);
      case Activation::GeluTanh: return be.gelu_tanh_jvp(x, dx, dy, n);
      case Activation::GeluErf: return be.gelu_erf_jvp(x, dx, dy, n);
      case Activation::SiLU: break;
    }
    ZOF_ABORT("SiLU without a gate is not an architecture zof knows");
  }
  void add(float* y, const float* x, int64_t n) { be.add(y, x, n); }
  void copy(float* y, const float* x, int64_t n) {
    be.copy_device(y, x, size_t(n) * sizeof(float), nullptr);
  }
  // (rows, 3C) into three (rows, C).
  void split_qkv(const float* src, float* q, float* k, float* v, int64_t rows, int64_t C) {
    const size_t row = size_t(C) * sizeof(float);
    be.copy_device_2d(q, row, src, 3 * row, row, size_t(rows), nullptr);
    be.copy_device_2d(k, row, src + C, 3 * row, row, size_t(rows), nullptr);
    be.copy_device_2d(v, row, src + 2 * C, 3 * row, row, size_t(rows), nullptr);
  }
  void embedding(const int32_t* ids, Weight table, float* out, int64_t n, int64_t dim,
                 bool accumulate) {
    be.embedding(ids, table.f32(), out, n, dim, accumulate);
  }
  void cross_entropy(const float* logits, const int32_t* targets, float* nll, int64_t rows,
                     int64_t V) {
    be.cross_entropy(logits, targets, nll, rows, V);
  }
  void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* targets,
                         float* dnll, int64_t rows, int64_t V) {
    be.cross_entropy_jvp(logits, dlogits, targets, dnll, rows, V);
  }
};

// The JVP walk's kernels: BackendKernels with the attention scale the JVP has always used,
// float(1 / sqrt(double(D))), which differs from Forward's 1.f / sqrtf(D) by an ulp for some D
// (not 8, 16, 32, 64, 80, 128, 256; e.g. 6, 24, 96): kept so that JVP runs stay bit-identical.
//
// A bf16 JVP walk (--dtype bf16, products BF16): every matrix product, the primal's and both of
// its tangent's, reads its weight and its z rounded to bf16 (nearest even, Backend::cast) and
// rounds its input as Backend::matmul does, accumulating in fp32; attention, norms, their
// tangents and every sum stay fp32. The rounded copies are kept in two scratch regions until the
// walk says their sources may change (forget_weights: a block's weights arrive; forget_z: a
// block's z is drawn): a block's weights are rounded once for its primal and every direction's
// tangent, a direction's z once, the LM head once for all its chunks of rows.
struct JvpBackendKernels : BackendKernels {
  explicit JvpBackendKernels(Backend& b, DType t = DType::F32) : BackendKernels{b}, products(t) {}
  static float scale(int64_t D) { return float(1.0 / std::sqrt(double(D))); }

  // The rounded copies' scratch: bf16 elements, in the backend's memory. A region never holds
  // less than the largest matrix.
  struct Copies {
    uint16_t* base = nullptr;
    int64_t capacity = 0, used = 0;
    struct Held {
      const float* p;
      int64_t n, at;
    };
    std::vector<Held> held;
    void forget() {
      held.clear();
      used = 0;
    }
  };
  DType products;
  Copies weights, z;

  void forget_weights() { weights.forget(); }
  void forget_z() { z.forget(); }
  void matmul(const float* x, Weight w, Weight b, float* y, int64_t M, int64_t N, int64_t K) {
    if (products != DType::BF16 || w.dtype != DType::F32)
      return BackendKernels::matmul(x, w, b, y, M, N, K);
    be.matmul(x, rounded(weights, w.f32(), N * K), DType::BF16, b.f32(), y, M, N, K);
  }
  void matmul_jvp(const float* x, const float* dx, const float* w, const float* dw,
                  const float* db, float* dy, int64_t M, int64_t N, int64_t K) {
    if (products != DType::BF16) return BackendKernels::matmul_jvp(x, dx, w, dw, db, dy, M, N, K);
    ZOF_ASSERT(dx && dw && mmtmp);
    be.matmul(dx, rounded(weights, w, N * K), DType::BF16, db, dy, M, N, K);
    be.matmul(x, rounded(z, dw, N * K), DType::BF16, nullptr, mmtmp, M, N, K);
    be.add(dy, mmtmp, M * N);
  }

 private:
  // p's n values in bf16: the copy c holds, or a new one (c starts over when it is full: the
  // products already queued read theirs first, in stream order). Copies start at multiples of
  // 64 elements (128 bytes), as the GEMM libraries prefer.
  const uint16_t* rounded(Copies& c, const float* p, int64_t n) {
    ZOF_ASSERT(c.base && p && n <= c.capacity);
    for (const Copies::Held& h : c.held)
      if (h.p == p && h.n == n) return c.base + h.at;
    if (c.used + n > c.capacity) c.forget();
    be.cast(p, c.base + c.used, DType::BF16, n);
    c.held.push_back({p, n, c.used});
    c.used = std::min(c.capacity, (c.used + n + 63) / 64 * 64);
    return c.base + c.held.back().at;
  }
};

}  // namespace zof::graph
