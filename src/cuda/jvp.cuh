// Tangent kernels (forward-mode AD) of the fp32 ops, Backend's *_jvp ops: the per-element
// arithmetic is op_math.h's, so the CPU unit tests check the same formulas; the GPU tests check
// each kernel against the host loops of jvp_ops.h. A null tangent pointer is a zero tangent.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

// The largest head_dim attention_jvp takes (a warp keeps D / 32 components per lane).
constexpr int64_t kMaxJvpHeadDim = 256;

void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                  int64_t rows, int64_t dim, float eps, cudaStream_t s);
void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                    const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                    cudaStream_t s);
// One warp per query; D <= kMaxJvpHeadDim.
void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                   const float* v, const float* dv, float* dout, const uint8_t* key_mask,
                   int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                   cudaStream_t s);
void silu_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                  float* dout, int64_t n, cudaStream_t s);
enum class JvpAct { GeluTanh, GeluErf, ReLU };
void activation_jvp(JvpAct act, const float* x, const float* dx, float* dy, int64_t n,
                    cudaStream_t s);
void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* targets,
                       float* dnll, int64_t rows, int64_t vocab, cudaStream_t s);

}  // namespace zof::cuda
