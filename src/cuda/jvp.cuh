// Tangent kernels (forward-mode AD) of the fp32 ops, Backend's *_jvp ops: the per-element
// arithmetic is op_math.h's, so the CPU unit tests check the same formulas; the GPU tests check
// each kernel against the host loops of jvp_ops.h. A null tangent pointer is a zero tangent.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

// The largest head_dim attention_jvp takes (a warp keeps D / 32 components per lane).
constexpr int64_t kMaxJvpHeadDim = 256;

// The weight is w + w_offset (formed in fp32; Gemma's RMSNorm), w itself when w_offset is 0.
void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                  int64_t rows, int64_t dim, float eps, float w_offset, cudaStream_t s);
void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                    const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                    cudaStream_t s);
// One warp per query; D <= kMaxJvpHeadDim. window > 0: a sliding window (the query at i sees
// keys j with i - window < j <= i); softcap > 0: soft-capped scores (0: neither).
void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                   const float* v, const float* dv, float* dout, const uint8_t* key_mask,
                   int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                   int64_t window, float softcap, cudaStream_t s);
void silu_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                  float* dout, int64_t n, cudaStream_t s);
// dout = gelu_tanh'(gate) dgate up + gelu_tanh(gate) dup.
void gelu_tanh_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                       float* dout, int64_t n, cudaStream_t s);
// dy = (1 - tanh(x / cap)^2) dx.
void softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n,
                 cudaStream_t s);
enum class JvpAct { GeluTanh, GeluErf, ReLU };
void activation_jvp(JvpAct act, const float* x, const float* dx, float* dy, int64_t n,
                    cudaStream_t s);
void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* targets,
                       float* dnll, int64_t rows, int64_t vocab, cudaStream_t s);

}  // namespace zof::cuda
