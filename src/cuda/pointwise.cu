// Elementwise kernels: grid-stride loops, one element per thread per step, the arithmetic in
// op_math.h so that the CPU unit tests check the same formulas.
#include "cuda/op_math.h"
#include "cuda/pointwise.cuh"

namespace zof::cuda {

namespace {

constexpr int kThreads = 256;

#define ZOF_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);            \
       i += (int64_t)gridDim.x * blockDim.x)

template <class T>
__global__ void silu_mul_kernel(const T* gate, const T* up, T* out, int64_t n) {
  ZOF_GRID_STRIDE(i, n) store_f32(out + i, opmath::silu_mul(load_f32(gate + i), load_f32(up + i)));
}
template <class T>
__global__ void gelu_tanh_mul_kernel(const T* gate, const T* up, T* out, int64_t n) {
  ZOF_GRID_STRIDE(i, n) {
    store_f32(out + i, opmath::gelu_tanh_mul(load_f32(gate + i), load_f32(up + i)));
  }
}
template <class T>
__global__ void mul_scalar_kernel(T* x, float a, int64_t n) {
  ZOF_GRID_STRIDE(i, n) store_f32(x + i, load_f32(x + i) * a);
}
template <class T>
__global__ void softcap_kernel(const T* x, T* y, float cap, int64_t n) {
  ZOF_GRID_STRIDE(i, n) store_f32(y + i, opmath::softcap(load_f32(x + i), cap));
}
template <class T>
__global__ void gelu_tanh_kernel(T* x, int64_t n) {
  ZOF_GRID_STRIDE(i, n) store_f32(x + i, opmath::gelu_tanh(load_f32(x + i)));
}
template <class T>
__global__ void gelu_erf_kernel(T* x, int64_t n) {
  ZOF_GRID_STRIDE(i, n) store_f32(x + i, opmath::gelu_erf(load_f32(x + i)));
}
template <class T>
__global__ void relu_kernel(T* x, int64_t n) {
  ZOF_GRID_STRIDE(i, n) store_f32(x + i, opmath::relu(load_f32(x + i)));
}
template <class T>
__global__ void add_kernel(T* y, const T* x, int64_t n) {
  ZOF_GRID_STRIDE(i, n) store_f32(y + i, load_f32(y + i) + load_f32(x + i));
}
__global__ void embedding_kernel(const int32_t* ids, const float* table, float* out, int64_t n,
                                 int64_t dim, bool accumulate) {
  ZOF_GRID_STRIDE(e, n * dim) {
    const int64_t i = e / dim, d = e % dim;
    const float v = table[(int64_t)ids[i] * dim + d];
    out[e] = accumulate ? out[e] + v : v;
  }
}
__global__ void to_bf16_kernel(const float* x, bf16* y, int64_t n) {
  ZOF_GRID_STRIDE(i, n) y[i] = f32_to_bf16_exact(x[i]);
}
__global__ void to_bf16_scaled_kernel(const float* x, float scale, bf16* y, int64_t n) {
  ZOF_GRID_STRIDE(i, n) y[i] = f32_to_bf16_exact(__fmul_rn(scale, x[i]));
}
// cvt.rn.f16.f32 (nearest even, overflow to inf, gradual underflow) as zof::f32_to_f16; a NaN
// becomes the quiet NaN with its sign that zof::f32_to_f16 gives (cvt would give 0x7fff).
__global__ void to_f16_kernel(const float* x, __half* y, int64_t n) {
  ZOF_GRID_STRIDE(i, n) {
    const float v = x[i];
    const uint32_t u = __float_as_uint(v);
    y[i] = (u & 0x7fffffffu) > 0x7f800000u
               ? __ushort_as_half((unsigned short)(((u >> 16) & 0x8000u) | 0x7e00u))
               : __float2half_rn(v);
  }
}
__global__ void to_f32_kernel(const bf16* x, float* y, int64_t n) {
  ZOF_GRID_STRIDE(i, n) y[i] = __bfloat162float(x[i]);
}

#undef ZOF_GRID_STRIDE

}  // namespace

#define ZOF_LAUNCH(kernel, n, ...)                                             \
  do {                                                                         \
    if ((n) <= 0) return;                                                      \
    kernel<<<grid_for((n), kThreads), kThreads, 0, s>>>(__VA_ARGS__);          \
    CUDA_CHECK(cudaGetLastError());                                            \
  } while (0)

template <class T>
void silu_mul(const T* gate, const T* up, T* out, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(silu_mul_kernel<T>, n, gate, up, out, n);
}
template <class T>
void gelu_tanh_mul(const T* gate, const T* up, T* out, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(gelu_tanh_mul_kernel<T>, n, gate, up, out, n);
}
template <class T>
void mul_scalar(T* x, float a, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(mul_scalar_kernel<T>, n, x, a, n);
}
template <class T>
void softcap(const T* x, T* y, float cap, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(softcap_kernel<T>, n, x, y, cap, n);
}
template <class T>
void gelu_tanh(T* x, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(gelu_tanh_kernel<T>, n, x, n);
}
template <class T>
void gelu_erf(T* x, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(gelu_erf_kernel<T>, n, x, n);
}
template <class T>
void relu(T* x, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(relu_kernel<T>, n, x, n);
}
template <class T>
void add(T* y, const T* x, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(add_kernel<T>, n, y, x, n);
}
void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
               bool accumulate, cudaStream_t s) {
  ZOF_LAUNCH(embedding_kernel, n * dim, ids, table, out, n, dim, accumulate);
}
void to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t s) { ZOF_LAUNCH(to_bf16_kernel, n, x, y, n); }
void to_bf16_scaled(const float* x, float scale, bf16* y, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(to_bf16_scaled_kernel, n, x, scale, y, n);
}
void to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s) { ZOF_LAUNCH(to_f32_kernel, n, x, y, n); }
void to_f16(const float* x, __half* y, int64_t n, cudaStream_t s) {
  ZOF_LAUNCH(to_f16_kernel, n, x, y, n);
}

#undef ZOF_LAUNCH

#define ZOF_INSTANTIATE(T)                                                       \
  template void silu_mul<T>(const T*, const T*, T*, int64_t, cudaStream_t);      \
  template void gelu_tanh_mul<T>(const T*, const T*, T*, int64_t, cudaStream_t); \
  template void mul_scalar<T>(T*, float, int64_t, cudaStream_t);                 \
  template void softcap<T>(const T*, T*, float, int64_t, cudaStream_t);          \
  template void gelu_tanh<T>(T*, int64_t, cudaStream_t);                         \
  template void gelu_erf<T>(T*, int64_t, cudaStream_t);                          \
  template void relu<T>(T*, int64_t, cudaStream_t);                              \
  template void add<T>(T*, const T*, int64_t, cudaStream_t);
ZOF_INSTANTIATE(float)
#undef ZOF_INSTANTIATE

}  // namespace zof::cuda
