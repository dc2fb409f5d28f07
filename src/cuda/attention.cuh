// Causal grouped-query attention, flash style (online softmax, no T x T matrix): a generic
// kernel on fp32 or bf16 storage with fp32 math for any head_dim up to 256, and a bf16
// tensor-core kernel (mma.sync m16n8k16, fp32 accumulate) for head_dim 64 and 128.
#pragma once
#include <cstdint>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

constexpr int64_t kMaxHeadDim = 256;

// As Backend::attention: q (B,Tq,H,D), k and v (B,Tk,Hkv,D), out (B,Tq,H,D), key_mask (B,Tk) or
// null, all on the device. window > 0: the query at position p sees only keys j > p - window;
// softcap > 0: each scaled score x becomes softcap * tanh(x / softcap) (0: neither). bf16 goes to
// the tensor-core kernel where it applies (no window, no softcap), else to the generic kernel.
template <class T>
void attention(const T* q, const T* k, const T* v, T* out, const uint8_t* key_mask, int64_t B,
               int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, int64_t q_offset,
               float scale, int64_t window, float softcap, cudaStream_t s);

}  // namespace zof::cuda
