// The tangent rules (Jacobian-vector products) of every op of the transformer forward, as plain
// host loops, templated on float and double so that tests can run whole walks in float64. The
// primal and its tangent side by side; the host backends' tangent ops (host_backend.h) run
// these, and device backends are tested against them.
#pragma once
#include <cstdint>

#include "zof/activation.h"

namespace zof {
namespace jvp {

// Host loops, row-major, accumulating in double whatever T is (the attention's loops run along
// keys so that they vectorize). A tangent function takes the primal inputs and their tangents (a
// null tangent is zero) and writes only the output tangent. Shapes as in backend.h.

// y(M,N) = x(M,K) w(N,K)^T + b(N); b may be null.
template <class T>
void matmul(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t N, int64_t K);
// dy = dx w^T + x dw^T + db.
template <class T>
void matmul_jvp(const T* x, const T* dx, const T* w, const T* dw, const T* db, T* dy, int64_t M,
                int64_t N, int64_t K);

// y = x / sqrt(mean(x^2) + eps) * (w + w_offset) (w_offset 1: Gemma's RMSNorm).
template <class T>
void rms_norm(const T* x, const T* w, T* y, int64_t rows, int64_t dim, float eps,
              float w_offset = 0.f);
template <class T>
void rms_norm_jvp(const T* x, const T* dx, const T* w, const T* dw, T* dy, int64_t rows,
                  int64_t dim, float eps, float w_offset = 0.f);

// y = (x - mean) / sqrt(var + eps) * w + b (biased variance); b may be null.
template <class T>
void layer_norm(const T* x, const T* w, const T* b, T* y, int64_t rows, int64_t dim, float eps);
template <class T>
void layer_norm_jvp(const T* x, const T* dx, const T* w, const T* dw, const T* db, T* dy,
                    int64_t rows, int64_t dim, float eps);

// RoPE in place, backend.h's convention (the first rotary_dim dims of each head, fp32 angle
// float(pos) * inv_freq[i] from the model's table of rotary_dim/2); cos and sin are rounded to
// fp32 as transformers forms them even in a float64 model. RoPE is linear in x: its tangent is
// rope() of the tangent.
template <class T>
void rope(T* x, const int32_t* pos, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rotary_dim, const float* inv_freq);

// Causal GQA softmax attention over one sequence length S (queries and keys at positions
// 0..S-1): q (B,S,H,D), k and v (B,S,Hkv,D), out (B,S,H,D); key_mask (B,S) or null. A query
// that sees no key gets zeros (tangent zero). window > 0: query i sees keys j > i - window;
// softcap > 0: scores x become softcap tanh(x / softcap) (backend.h).
template <class T>
void attention(const T* q, const T* k, const T* v, T* out, const uint8_t* key_mask, int64_t B,
               int64_t S, int64_t H, int64_t Hkv, int64_t D, double scale, int64_t window = 0,
               double softcap = 0.0);
// With p = softmax(s), s_j = scale q.k_j: dout = sum_j p_j (dv_j + (ds_j - sum_l p_l ds_l) v_j),
// ds_j = scale (dq.k_j + q.dk_j) (times 1 - tanh^2 under a softcap). The probabilities are
// recomputed, never stored (no S x S).
template <class T>
void attention_jvp(const T* q, const T* dq, const T* k, const T* dk, const T* v, const T* dv,
                   T* dout, const uint8_t* key_mask, int64_t B, int64_t S, int64_t H, int64_t Hkv,
                   int64_t D, double scale, int64_t window = 0, double softcap = 0.0);

// out = silu(gate) * up.
template <class T>
void silu_mul(const T* gate, const T* up, T* out, int64_t n);
template <class T>
void silu_mul_jvp(const T* gate, const T* dgate, const T* up, const T* dup, T* dout, int64_t n);

// out = gelu_tanh(gate) * up (Gemma's GeGLU).
template <class T>
void gelu_tanh_mul(const T* gate, const T* up, T* out, int64_t n);
template <class T>
void gelu_tanh_mul_jvp(const T* gate, const T* dgate, const T* up, const T* dup, T* dout,
                       int64_t n);

// y = cap tanh(x / cap) (Gemma 2's final-logit soft-capping); dy = (1 - tanh^2) dx.
template <class T>
void softcap(const T* x, T* y, double cap, int64_t n);
template <class T>
void softcap_jvp(const T* x, const T* dx, T* dy, double cap, int64_t n);

// y = act(x) for ReLU, tanh GELU and erf GELU (SiLU only exists gated: silu_mul).
template <class T>
void activation(Activation act, const T* x, T* y, int64_t n);
template <class T>
void activation_jvp(Activation act, const T* x, const T* dx, T* dy, int64_t n);

// out(n,dim) = table[ids[i]] (+= when accumulate). Linear in the table: the tangent is the
// same lookup in the tangent table.
template <class T>
void embedding(const int32_t* ids, const T* table, T* out, int64_t n, int64_t dim,
               bool accumulate);

// nll(rows) = logsumexp(logits[r]) - logits[r][targets[r]]; targets < 0 give 0.
template <class T>
void cross_entropy(const T* logits, const int32_t* targets, T* nll, int64_t rows, int64_t vocab);
// dnll = sum_v softmax(logits)_v dlogits_v - dlogits[target].
template <class T>
void cross_entropy_jvp(const T* logits, const T* dlogits, const int32_t* targets, T* dnll,
                       int64_t rows, int64_t vocab);

}  // namespace jvp

}  // namespace zof
