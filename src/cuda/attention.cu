// Flash attention kernels. Both walk the keys a query tile can see (causal: up to q_offset + its
// last row; with a sliding window, from the window start of its first row) in blocks held in
// shared memory, and keep per row a running max m, sum l and output accumulator rescaled as each
// block arrives (op_math.h's online softmax).
//
// Generic kernel: a block of 4 warps owns 16 rows of one (batch, kv head), rows ordered as
// (query position, query head of the group) so that a kv head's group shares every key block.
// A warp scores 32 keys for 4 rows (lane = key), then accumulates outputs (lane = dimension).
// It alone takes Gemma's variants: a sliding window (a row sees keys j with p - window < j <= p)
// and soft-capped scores (softcap * tanh(x / softcap) of the scaled score x, before the mask).
//
// Tensor-core kernel (FlashAttention-2 layout): a block of 4 warps owns 64 query positions of one
// (batch, head), each warp 16 of them; S = Q K^T and O += P V run as mma.sync m16n8k16 with the
// S accumulator fragments reused, rounded to bf16, as the A operand of P V.
#include "cuda/attention.cuh"

#include <type_traits>

#include "cuda/op_math.h"

namespace zof::cuda {

namespace {

// ---- generic kernel -------------------------------------------------------------------------
constexpr int kGenWarps = 4, kGenRowsPerWarp = 4, kGenRows = kGenWarps * kGenRowsPerWarp;
constexpr int kGenKeys = 32, kGenMaxChunks = int(kMaxHeadDim / 32);

size_t generic_smem_bytes(int64_t D) {
  // Qs (16, D), Ks (32, D+1), Vs (32, D), Ps (16, 32), key flags (32)
  return sizeof(float) * size_t(kGenRows * D + kGenKeys * (D + 1) + kGenKeys * D +
                                kGenRows * kGenKeys + kGenKeys);
}

// kVariants: the kernel with Gemma's sliding window and softcap (window, softcap); without,
// the plain kernel, which never reads them (and keeps its registers: no window bounds).
template <class T, bool kVariants>
__global__ void __launch_bounds__(kGenWarps * 32)
    attention_generic_kernel(const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, T* __restrict__ out,
                             const uint8_t* __restrict__ key_mask, int64_t Tq, int64_t Tk,
                             int64_t H, int64_t Hkv, int64_t D, int64_t q_offset, float scale,
                             int64_t window, float softcap) {
  extern __shared__ float smem[];
  float* Qs = smem;                      // (16, D) scaled queries
  float* Ks = Qs + kGenRows * D;         // (32, D+1): the +1 spreads a lane's row over banks
  float* Vs = Ks + kGenKeys * (D + 1);   // (32, D)
  float* Ps = Vs + kGenKeys * D;         // (16, 32) probabilities of the current key block
  float* flag = Ps + kGenRows * kGenKeys;  // (32) key is inside the range and unmasked

  const int64_t group = H / Hkv, rows_total = Tq * group;
  const int64_t b = blockIdx.y / Hkv, hk = blockIdx.y % Hkv;
  const int64_t r0 = (int64_t)blockIdx.x * kGenRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  auto q_index = [&](int64_t r) { return ((b * Tq + r / group) * H + hk * group + r % group) * D; };

  for (int64_t e = threadIdx.x; e < kGenRows * D; e += blockDim.x) {
    const int64_t rr = e / D, d = e % D, r = r0 + rr;
    Qs[e] = r < rows_total ? load_f32(q + q_index(r) + d) * scale : 0.0f;
  }
  // The last key each of this warp's rows sees (-1: a padding row that sees none), and the first
  // (its window start; 0 without a window).
  int64_t lim[kGenRowsPerWarp], lo[kGenRowsPerWarp];
  float m[kGenRowsPerWarp], l[kGenRowsPerWarp], o[kGenRowsPerWarp][kGenMaxChunks];
#pragma unroll
  for (int rr = 0; rr < kGenRowsPerWarp; ++rr) {
    const int64_t r = r0 + warp * kGenRowsPerWarp + rr;
    lim[rr] = r < rows_total ? min(Tk - 1, q_offset + r / group) : -1;
    lo[rr] = kVariants && window > 0 ? q_offset + r / group - window + 1 : 0;
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kGenMaxChunks; ++c) o[rr][c] = 0.0f;
  }
  const int64_t last_row = min(rows_total - 1, r0 + kGenRows - 1);
  const int64_t n_keys = min(Tk, q_offset + last_row / group + 1);
  const int nc = int((D + 31) / 32);
  // With a window, the key blocks wholly before the window start of the block's first row (the
  // earliest of its rows) are seen by no row: start at the block that holds that key.
  int64_t first_key = 0;
  if (kVariants && window > 0) {
    const int64_t lo0 = q_offset + r0 / group - window + 1;
    if (lo0 > 0) first_key = lo0 / kGenKeys * kGenKeys;
  }

  for (int64_t j0 = first_key; j0 < n_keys; j0 += kGenKeys) {
    __syncthreads();  // the previous block's keys and probabilities are consumed
    for (int64_t e = threadIdx.x; e < kGenKeys * D; e += blockDim.x) {
      const int64_t jj = e / D, d = e % D, j = j0 + jj;
      float kx = 0.0f, vx = 0.0f;
      if (j < n_keys) {
        const int64_t at = ((b * Tk + j) * Hkv + hk) * D + d;
        kx = load_f32(k + at);
        vx = load_f32(v + at);
      }
      Ks[jj * (D + 1) + d] = kx;
      Vs[jj * D + d] = vx;
    }
    if (threadIdx.x < kGenKeys) {
      const int64_t j = j0 + threadIdx.x;
      flag[threadIdx.x] = j < n_keys && (!key_mask || key_mask[b * Tk + j] != 0) ? 1.0f : 0.0f;
    }
    __syncthreads();

    const int64_t j = j0 + lane;
    const bool key_ok = flag[lane] != 0.0f;
#pragma unroll
    for (int rr = 0; rr < kGenRowsPerWarp; ++rr) {
      const int row = warp * kGenRowsPerWarp + rr;
      float s = -INFINITY;
      if (key_ok && j <= lim[rr] && (!kVariants || j >= lo[rr])) {
        const float* qr = Qs + row * D;
        const float* kr = Ks + lane * (D + 1);
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
        if constexpr (kVariants) {
          if (softcap > 0.0f) dot = opmath::softcap(dot, softcap);
        }
        s = dot;
      }
      const float block_max = warp_max(s);
      float p = 0.0f;
      if (block_max != -INFINITY) {  // uniform over the warp
        const opmath::SoftmaxStep st = opmath::softmax_advance(m[rr], block_max);
        p = expf(s - st.shift);
        l[rr] = l[rr] * st.correction + warp_sum(p);
#pragma unroll
        for (int c = 0; c < kGenMaxChunks; ++c) o[rr][c] *= st.correction;
      }
      Ps[row * kGenKeys + lane] = p;
    }
    __syncwarp();
    for (int jj = 0; jj < kGenKeys; ++jj) {
      if (flag[jj] == 0.0f) continue;  // masked keys are skipped, not multiplied by 0
      const float* vr = Vs + jj * D;
#pragma unroll
      for (int rr = 0; rr < kGenRowsPerWarp; ++rr) {
        const float p = Ps[(warp * kGenRowsPerWarp + rr) * kGenKeys + jj];
#pragma unroll
        for (int c = 0; c < kGenMaxChunks; ++c) {
          const int64_t d = lane + 32 * c;
          if (c < nc && d < D) o[rr][c] += p * vr[d];
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < kGenRowsPerWarp; ++rr) {
    const int64_t r = r0 + warp * kGenRowsPerWarp + rr;
    if (r >= rows_total) continue;
    const float inv = opmath::softmax_inv_sum(l[rr]);
    T* dst = out + q_index(r);
#pragma unroll
    for (int c = 0; c < kGenMaxChunks; ++c) {
      const int64_t d = lane + 32 * c;
      if (c < nc && d < D) store_f32(dst + d, o[rr][c] * inv);
    }
  }
}

template <class T, bool kVariants>
void attention_generic_launch(const T* q, const T* k, const T* v, T* out,
                              const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk,
                              int64_t H, int64_t Hkv, int64_t D, int64_t q_offset, float scale,
                              int64_t window, float softcap, cudaStream_t s) {
  const size_t smem = generic_smem_bytes(D);
  // Above 48 KB (D > 146) needs the opt-in; it is per device, so it is set on every launch (to
  // the largest size, so that concurrent callers never lower it under each other).
  CUDA_CHECK(cudaFuncSetAttribute(attention_generic_kernel<T, kVariants>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(generic_smem_bytes(kMaxHeadDim))));
  const int64_t rows_total = Tq * (H / Hkv);
  const dim3 grid(unsigned((rows_total + kGenRows - 1) / kGenRows), unsigned(B * Hkv));
  attention_generic_kernel<T, kVariants><<<grid, kGenWarps * 32, smem, s>>>(
      q, k, v, out, key_mask, Tq, Tk, H, Hkv, D, q_offset, scale, window, softcap);
  CUDA_CHECK(cudaGetLastError());
}

template <class T>
void attention_generic(const T* q, const T* k, const T* v, T* out, const uint8_t* key_mask,
                       int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                       int64_t q_offset, float scale, int64_t window, float softcap,
                       cudaStream_t s) {
  if (window > 0 || softcap > 0.0f)
    attention_generic_launch<T, true>(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset,
                                      scale, window, softcap, s);
  else
    attention_generic_launch<T, false>(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset,
                                       scale, 0, 0.0f, s);
}

// ---- bf16 tensor-core kernel ----------------------------------------------------------------------
constexpr int kTcWarps = 4, kTcQ = 64, kTcK = 64;

template <int D>
constexpr size_t tc_smem_bytes() {
  // Qs and Ks (64, D+8), V transposed (D, 64+8) in bf16, key flags (64); the +8 padding puts
  // the 8 rows a fragment load touches in 8 different bank groups.
  return sizeof(bf16) * size_t(2 * kTcQ * (D + 8) + D * (kTcK + 8)) + kTcK;
}

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&p);
}

__device__ __forceinline__ uint32_t lds32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }

template <int D>
__global__ void __launch_bounds__(kTcWarps * 32)
    attention_tc_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k,
                        const bf16* __restrict__ v, bf16* __restrict__ out,
                        const uint8_t* __restrict__ key_mask, int64_t Tq, int64_t Tk, int64_t H,
                        int64_t Hkv, int64_t q_offset, float scale_log2) {
  constexpr int LDQ = D + 8, LDV = kTcK + 8, KS = D / 16, DT = D / 8, NT = kTcK / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kTcQ * LDQ;
  bf16* Vt = Ks + kTcK * LDQ;
  uint8_t* flag = reinterpret_cast<uint8_t*>(Vt + D * LDV);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // Late query tiles see the most keys: start them first.
  const int64_t q0 = int64_t(gridDim.x - 1 - blockIdx.x) * kTcQ;
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);

  for (int c = tid; c < kTcQ * D / 8; c += blockDim.x) {
    const int r = c / (D / 8), d8 = (c % (D / 8)) * 8;
    const int64_t i = q0 + r;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (i < Tq) val = *reinterpret_cast<const uint4*>(q + ((b * Tq + i) * H + h) * D + d8);
    *reinterpret_cast<uint4*>(Qs + r * LDQ + d8) = val;
  }
  __syncthreads();
  const int rw = warp * 16;
  uint32_t qa[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    qa[ks][0] = lds32(Qs + (rw + g) * LDQ + ks * 16 + t4 * 2);
    qa[ks][1] = lds32(Qs + (rw + g + 8) * LDQ + ks * 16 + t4 * 2);
    qa[ks][2] = lds32(Qs + (rw + g) * LDQ + ks * 16 + 8 + t4 * 2);
    qa[ks][3] = lds32(Qs + (rw + g + 8) * LDQ + ks * 16 + 8 + t4 * 2);
  }
  float o[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  // This thread holds two rows of the warp's 16: positions i0 and i0 + 8 (log2-domain state).
  const int64_t i0 = q0 + rw + g, i1 = i0 + 8;
  const int64_t lim0 = q_offset + i0, lim1 = q_offset + i1;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int64_t n_keys = min(Tk, q_offset + min(q0 + kTcQ, Tq));

  for (int64_t j0 = 0; j0 < n_keys; j0 += kTcK) {
    __syncthreads();
    for (int c = tid; c < kTcK * D / 8; c += blockDim.x) {
      const int r = c / (D / 8), d8 = (c % (D / 8)) * 8;
      const int64_t j = j0 + r;
      uint4 kx = make_uint4(0, 0, 0, 0), vx = make_uint4(0, 0, 0, 0);
      if (j < n_keys) {
        const int64_t at = ((b * Tk + j) * Hkv + hk) * D + d8;
        kx = *reinterpret_cast<const uint4*>(k + at);
        vx = *reinterpret_cast<const uint4*>(v + at);
      }
      *reinterpret_cast<uint4*>(Ks + r * LDQ + d8) = kx;
      const bf16* ve = reinterpret_cast<const bf16*>(&vx);
#pragma unroll
      for (int e = 0; e < 8; ++e) Vt[(d8 + e) * LDV + r] = ve[e];
    }
    for (int c = tid; c < kTcK; c += blockDim.x) {
      const int64_t j = j0 + c;
      flag[c] = j < n_keys && (!key_mask || key_mask[b * Tk + j] != 0);
    }
    __syncthreads();

    // S (16 x 64 per warp) = Q K^T
    float sc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const bf16* kr = Ks + (nt * 8 + g) * LDQ + ks * 16 + t4 * 2;
        mma_bf16_16816(sc[nt], qa[ks], lds32(kr), lds32(kr + 8));
      }
    }
    // Mask, scale into the log2 domain, row maxima over the quad that shares a row.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int jj = nt * 8 + t4 * 2 + e;
        const int64_t j = j0 + jj;
        const bool ok = flag[jj] != 0;
        sc[nt][e] = ok && j <= lim0 ? sc[nt][e] * scale_log2 : -INFINITY;
        sc[nt][2 + e] = ok && j <= lim1 ? sc[nt][2 + e] * scale_log2 : -INFINITY;
        mx0 = fmaxf(mx0, sc[nt][e]);
        mx1 = fmaxf(mx1, sc[nt][2 + e]);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float sh0 = n0 == -INFINITY ? 0.0f : n0, sh1 = n1 == -INFINITY ? 0.0f : n1;
    const float c0 = exp2f(m0 - sh0), c1 = exp2f(m1 - sh1);
    m0 = n0;
    m1 = n1;
    l0 *= c0;  // per-thread partial sums; the quad's are added at the end
    l1 *= c1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      sc[nt][0] = exp2f(sc[nt][0] - sh0);
      sc[nt][1] = exp2f(sc[nt][1] - sh0);
      sc[nt][2] = exp2f(sc[nt][2] - sh1);
      sc[nt][3] = exp2f(sc[nt][3] - sh1);
      l0 += sc[nt][0] + sc[nt][1];
      l1 += sc[nt][2] + sc[nt][3];
    }
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      o[dt][0] *= c0;
      o[dt][1] *= c0;
      o[dt][2] *= c1;
      o[dt][3] *= c1;
    }
    // O (16 x D) += P (16 x 64) V (64 x D); P's A fragments are S's accumulators, two n-tiles
    // (16 keys) per k-step.
#pragma unroll
    for (int kk = 0; kk < kTcK / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]),
                              pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                              pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                              pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const bf16* vr = Vt + (dt * 8 + g) * LDV + kk * 16 + t4 * 2;
        mma_bf16_16816(o[dt], pa, lds32(vr), lds32(vr + 8));
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = opmath::softmax_inv_sum(l0), inv1 = opmath::softmax_inv_sum(l1);
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int d = dt * 8 + t4 * 2;
    if (i0 < Tq)
      *reinterpret_cast<uint32_t*>(out + ((b * Tq + i0) * H + h) * D + d) =
          pack_bf16(o[dt][0] * inv0, o[dt][1] * inv0);
    if (i1 < Tq)
      *reinterpret_cast<uint32_t*>(out + ((b * Tq + i1) * H + h) * D + d) =
          pack_bf16(o[dt][2] * inv1, o[dt][3] * inv1);
  }
}

template <int D>
void attention_tc(const bf16* q, const bf16* k, const bf16* v, bf16* out, const uint8_t* key_mask,
                  int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t q_offset,
                  float scale, cudaStream_t s) {
  constexpr size_t smem = tc_smem_bytes<D>();
  CUDA_CHECK(cudaFuncSetAttribute(attention_tc_kernel<D>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((Tq + kTcQ - 1) / kTcQ), unsigned(H), unsigned(B));
  attention_tc_kernel<D><<<grid, kTcWarps * 32, smem, s>>>(q, k, v, out, key_mask, Tq, Tk, H, Hkv,
                                                           q_offset, scale * 1.4426950408889634f);
  CUDA_CHECK(cudaGetLastError());
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

template <class T>
void attention(const T* q, const T* k, const T* v, T* out, const uint8_t* key_mask, int64_t B,
               int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, int64_t q_offset,
               float scale, int64_t window, float softcap, cudaStream_t s) {
  if (B <= 0 || Tq <= 0 || H <= 0 || D <= 0) return;
  if constexpr (std::is_same_v<T, bf16>) {
    const bool tc_ok = aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out) && Tk > 0 &&
                       window <= 0 && softcap <= 0.0f;  // the tensor-core kernel has neither
    if (tc_ok && D == 64)
      return attention_tc<64>(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, q_offset, scale, s);
    if (tc_ok && D == 128)
      return attention_tc<128>(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, q_offset, scale, s);
  }
  attention_generic(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, window,
                    softcap, s);
}

template void attention<float>(const float*, const float*, const float*, float*, const uint8_t*,
                               int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                               float, int64_t, float, cudaStream_t);
template void attention<bf16>(const bf16*, const bf16*, const bf16*, bf16*, const uint8_t*,
                              int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                              int64_t, float, cudaStream_t);

}  // namespace zof::cuda
