// Tangent kernels: row reductions one block per row (norms, cross-entropy), elementwise
// grid-stride loops, and attention one warp per query (see jvp.cuh). The JVP estimator is a
// study option, not the throughput path: these are written for clarity and exactness first.
#include "cuda/jvp.cuh"
#include "cuda/op_math.h"

namespace zof::cuda {

namespace {

constexpr int kThreads = 256;

int row_threads(int64_t dim) {
  const int64_t warps = (dim + 31) / 32;
  return int(warps >= 8 ? 256 : warps * 32);
}

__device__ __forceinline__ float at(const float* p, int64_t i) { return p ? p[i] : 0.0f; }

// kOffset: the weight is w + w_offset (Gemma), else w itself (no addition, not even of 0).
template <bool kOffset>
__global__ void rms_norm_jvp_kernel(const float* x, const float* dx, const float* w,
                                    const float* dw, float* dy, int64_t dim, float eps,
                                    float w_offset) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x * dim;
  float ss = 0.0f, sd = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float xi = x[o + i];
    ss += xi * xi;
    sd += xi * at(dx, o + i);
  }
  ss = block_reduce<false>(ss, scratch);
  sd = block_reduce<false>(sd, scratch);
  const float inv = opmath::rms_inv(ss, dim, eps), dinv = opmath::rms_norm_dinv(inv, sd, dim);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    dy[o + i] = opmath::norm_jvp(x[o + i], at(dx, o + i), inv, dinv,
                                 kOffset ? w[i] + w_offset : w[i], at(dw, i));
}

// Two passes over the row: the means of x and dx, then the centred sums (no E[x^2] - mean^2).
__global__ void layer_norm_jvp_kernel(const float* x, const float* dx, const float* w,
                                      const float* dw, const float* db, float* dy, int64_t dim,
                                      float eps) {
  __shared__ float scratch[32];
  const int64_t o = blockIdx.x * dim;
  float sx = 0.0f, sdx = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    sx += x[o + i];
    sdx += at(dx, o + i);
  }
  const float mean = block_reduce<false>(sx, scratch) / (float)dim;
  const float dmean = block_reduce<false>(sdx, scratch) / (float)dim;
  float var = 0.0f, cov = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float c = x[o + i] - mean;
    var += c * c;
    cov += c * (at(dx, o + i) - dmean);
  }
  var = block_reduce<false>(var, scratch);
  cov = block_reduce<false>(cov, scratch);
  const float inv = 1.0f / sqrtf(var / (float)dim + eps);
  const float dinv = opmath::layer_norm_dinv(inv, cov, dim);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float c = x[o + i] - mean, dc = at(dx, o + i) - dmean;
    dy[o + i] = opmath::norm_jvp(c, dc, inv, dinv, w[i], at(dw, i)) + at(db, i);
  }
}

constexpr int kAttnWarps = 4;                   // queries per block
constexpr int kMaxPerLane = int(kMaxJvpHeadDim / 32);

// One warp per query (b, i, h): lane l holds components l, l + 32, ... of q, dq and the output.
// Pass 1: scores and their tangents key by key (warp sums), the online max, sum l and
// sum e^(s - max) ds. Pass 2: the same scores again, each key's terms with its final weight.
// kVariants (Gemma's): a sliding window (window > 0) starts both passes at key i - window + 1;
// a softcap (> 0) maps each scaled score x and its tangent dx to c tanh(x / c) and
// (1 - tanh^2) dx. Without, the plain kernel, which never reads window and softcap.
template <bool kVariants>
__global__ void attention_jvp_kernel(const float* q, const float* dq, const float* k,
                                     const float* dk, const float* v, const float* dv,
                                     float* dout, const uint8_t* key_mask, int64_t B, int64_t S,
                                     int64_t H, int64_t Hkv, int64_t D, float scale,
                                     int64_t window, float softcap) {
  const int lane = threadIdx.x & 31;
  const int64_t item = (int64_t)blockIdx.x * kAttnWarps + (threadIdx.x >> 5);
  if (item >= B * S * H) return;  // whole warps leave together
  const int64_t b = item / (S * H), i = item / H % S, h = item % H, hk = h / (H / Hkv);
  const int64_t qo = ((b * S + i) * H + h) * D;
  float qr[kMaxPerLane], dqr[kMaxPerLane];
  const int per = int((D + 31) / 32);
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int64_t d = lane + 32 * c;
    const bool in = c < per && d < D;
    qr[c] = in ? q[qo + d] * scale : 0.0f;
    dqr[c] = in ? at(dq, qo + d) * scale : 0.0f;
  }
  // The score and its tangent of key j (every lane gets both).
  auto score = [&](int64_t j, float& s, float& ds) {
    const int64_t ko = ((b * S + j) * Hkv + hk) * D;
    float a = 0.0f, da = 0.0f;
#pragma unroll
    for (int c = 0; c < kMaxPerLane; ++c) {
      const int64_t d = lane + 32 * c;
      if (c < per && d < D) {
        const float kd = k[ko + d];
        a += qr[c] * kd;
        da += dqr[c] * kd + (dk ? qr[c] * dk[ko + d] : 0.0f);
      }
    }
    s = warp_sum(a);
    ds = warp_sum(da);
    if constexpr (kVariants) {
      if (softcap > 0.0f) opmath::softcap_with_tangent(s, ds, softcap);
    }
  };
  int64_t j_first = 0;
  if constexpr (kVariants) {
    if (window > 0 && i - window + 1 > 0) j_first = i - window + 1;
  }
  float m = opmath::neg_inf(), l = 0.0f, sds = 0.0f;
  for (int64_t j = j_first; j <= i; ++j) {
    if (key_mask && !key_mask[b * S + j]) continue;
    float s, ds;
    score(j, s, ds);
    const opmath::SoftmaxStep st = opmath::softmax_advance(m, s);
    const float e = expf(s - st.shift);
    l = l * st.correction + e;
    sds = sds * st.correction + e * ds;
  }
  float acc[kMaxPerLane];
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) acc[c] = 0.0f;
  const float inv = opmath::softmax_inv_sum(l);
  if (inv > 0.0f) {
    const float sbar = sds * inv;
    for (int64_t j = j_first; j <= i; ++j) {
      if (key_mask && !key_mask[b * S + j]) continue;
      float s, ds;
      score(j, s, ds);
      const float p = expf(s - m) * inv;
      const int64_t vo = ((b * S + j) * Hkv + hk) * D;
#pragma unroll
      for (int c = 0; c < kMaxPerLane; ++c) {
        const int64_t d = lane + 32 * c;
        if (c < per && d < D) acc[c] += opmath::attn_jvp_term(p, ds, sbar, v[vo + d], at(dv, vo + d));
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kMaxPerLane; ++c) {
    const int64_t d = lane + 32 * c;
    if (c < per && d < D) dout[qo + d] = acc[c];
  }
}

#define ZOF_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);            \
       i += (int64_t)gridDim.x * blockDim.x)

__global__ void silu_mul_jvp_kernel(const float* gate, const float* dgate, const float* up,
                                    const float* dup, float* dout, int64_t n) {
  ZOF_GRID_STRIDE(i, n) dout[i] = opmath::silu_mul_jvp(gate[i], at(dgate, i), up[i], at(dup, i));
}

__global__ void gelu_tanh_mul_jvp_kernel(const float* gate, const float* dgate, const float* up,
                                         const float* dup, float* dout, int64_t n) {
  ZOF_GRID_STRIDE(i, n) {
    dout[i] = opmath::gelu_tanh_mul_jvp(gate[i], at(dgate, i), up[i], at(dup, i));
  }
}

__global__ void softcap_jvp_kernel(const float* x, const float* dx, float* dy, float cap,
                                   int64_t n) {
  ZOF_GRID_STRIDE(i, n) dy[i] = opmath::softcap_slope(x[i], cap) * at(dx, i);
}

template <JvpAct kAct>
__global__ void activation_jvp_kernel(const float* x, const float* dx, float* dy, int64_t n) {
  ZOF_GRID_STRIDE(i, n) {
    const float a = x[i];
    const float slope = kAct == JvpAct::GeluTanh  ? opmath::gelu_tanh_slope(a)
                        : kAct == JvpAct::GeluErf ? opmath::gelu_erf_slope(a)
                                                  : opmath::relu_slope(a);
    dy[i] = slope * at(dx, i);
  }
}

// One block per row: the max, then the sums of e^(x - max) and of e^(x - max) dl.
__global__ void cross_entropy_jvp_kernel(const float* logits, const float* dlogits,
                                         const int32_t* targets, float* dnll, int64_t vocab) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x;
  const int32_t t = targets[r];
  if (t < 0 || t >= vocab) {  // the whole block takes this branch
    if (threadIdx.x == 0) dnll[r] = t < 0 ? 0.0f : NAN;
    return;
  }
  const float* lr = logits + r * vocab;
  const float* dl = dlogits + r * vocab;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, lr[j]);
  mx = block_reduce<true>(mx, scratch);
  float sum = 0.0f, dot = 0.0f;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float e = expf(lr[j] - mx);
    sum += e;
    dot += e * dl[j];
  }
  sum = block_reduce<false>(sum, scratch);
  dot = block_reduce<false>(dot, scratch);
  if (threadIdx.x == 0) dnll[r] = opmath::ce_jvp(sum, dot, dl[t]);
}

}  // namespace

void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                  int64_t rows, int64_t dim, float eps, float w_offset, cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return;
  if (w_offset != 0.0f)
    rms_norm_jvp_kernel<true><<<unsigned(rows), row_threads(dim), 0, s>>>(x, dx, w, dw, dy, dim,
                                                                          eps, w_offset);
  else
    rms_norm_jvp_kernel<false><<<unsigned(rows), row_threads(dim), 0, s>>>(x, dx, w, dw, dy, dim,
                                                                           eps, 0.0f);
  CUDA_CHECK(cudaGetLastError());
}

void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                    const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                    cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return;
  layer_norm_jvp_kernel<<<unsigned(rows), row_threads(dim), 0, s>>>(x, dx, w, dw, db, dy, dim,
                                                                    eps);
  CUDA_CHECK(cudaGetLastError());
}

void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                   const float* v, const float* dv, float* dout, const uint8_t* key_mask,
                   int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                   int64_t window, float softcap, cudaStream_t s) {
  const int64_t items = B * S * H;
  if (items <= 0 || D <= 0) return;
  const unsigned blocks = unsigned((items + kAttnWarps - 1) / kAttnWarps);
  if (window > 0 || softcap > 0.0f)
    attention_jvp_kernel<true><<<blocks, 32 * kAttnWarps, 0, s>>>(
        q, dq, k, dk, v, dv, dout, key_mask, B, S, H, Hkv, D, scale, window, softcap);
  else
    attention_jvp_kernel<false><<<blocks, 32 * kAttnWarps, 0, s>>>(
        q, dq, k, dk, v, dv, dout, key_mask, B, S, H, Hkv, D, scale, 0, 0.0f);
  CUDA_CHECK(cudaGetLastError());
}

void silu_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                  float* dout, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  silu_mul_jvp_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(gate, dgate, up, dup, dout, n);
  CUDA_CHECK(cudaGetLastError());
}

void gelu_tanh_mul_jvp(const float* gate, const float* dgate, const float* up, const float* dup,
                       float* dout, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  gelu_tanh_mul_jvp_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(gate, dgate, up, dup, dout,
                                                                      n);
  CUDA_CHECK(cudaGetLastError());
}

void softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n,
                 cudaStream_t s) {
  if (n <= 0) return;
  softcap_jvp_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(x, dx, dy, cap, n);
  CUDA_CHECK(cudaGetLastError());
}

void activation_jvp(JvpAct act, const float* x, const float* dx, float* dy, int64_t n,
                    cudaStream_t s) {
  if (n <= 0) return;
  const unsigned g = grid_for(n, kThreads);
  switch (act) {
    case JvpAct::GeluTanh: activation_jvp_kernel<JvpAct::GeluTanh><<<g, kThreads, 0, s>>>(x, dx, dy, n); break;
    case JvpAct::GeluErf: activation_jvp_kernel<JvpAct::GeluErf><<<g, kThreads, 0, s>>>(x, dx, dy, n); break;
    case JvpAct::ReLU: activation_jvp_kernel<JvpAct::ReLU><<<g, kThreads, 0, s>>>(x, dx, dy, n); break;
  }
  CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* targets,
                       float* dnll, int64_t rows, int64_t vocab, cudaStream_t s) {
  if (rows <= 0) return;
  cross_entropy_jvp_kernel<<<unsigned(rows), kThreads, 0, s>>>(logits, dlogits, targets, dnll,
                                                               vocab);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace zof::cuda
