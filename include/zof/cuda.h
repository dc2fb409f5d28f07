// The CUDA backend: the Backend interface on one NVIDIA GPU (sm_80, sm_90), plus the bf16
// activation ops that the fp32 interface cannot express yet (bf16 in and out, fp32 accumulate).
// This header needs no CUDA include; in a build without CUDA (ZOF_CUDA=OFF or no nvcc) the
// device count is 0 and make_cuda_backend throws zof::Error saying how to get one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zof/backend.h"

namespace zof {

// What one device can do, for choosing a backend and for MFU in benchmarks.
struct CudaDeviceInfo {
  int device = -1;
  std::string name;
  int cc_major = 0, cc_minor = 0;   // compute capability
  int sm_count = 0;
  size_t total_memory = 0;          // bytes
  double bf16_dense_tflops = 0.0;   // datasheet peak of dense bf16 tensor-core math (MFU basis)
  std::string driver;               // driver version, e.g. "13.0"
};

// Devices visible to this process; 0 without a driver, a GPU, or a CUDA build. Never throws.
int cuda_device_count();
// Throws zof::Error when device is not one of cuda_device_count().
CudaDeviceInfo cuda_device_info(int device);

// The Backend plus bf16 entries. bf16 tensors are raw bf16 bits (uint16_t, as zof/dtype.h),
// row-major, in device memory; norm weights and the like stay fp32 (they are tiny).
class CudaBackend : public Backend {
 public:
  // y(M,N) = x(M,K) w(N,K)^T + bias(N) through cuBLASLt, bf16 x/w/y/bias, fp32 accumulate.
  virtual void matmul_bf16(const uint16_t* x, const uint16_t* w, const uint16_t* bias,
                           uint16_t* y, int64_t M, int64_t N, int64_t K, Stream* s = nullptr) = 0;
  // As Backend::attention with bf16 q/k/v/out; fp32 softmax and accumulation (tensor cores for
  // head_dim 64 and 128, a generic kernel otherwise).
  virtual void attention_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                              uint16_t* out, const uint8_t* key_mask, int64_t B, int64_t Tq,
                              int64_t Tk, int64_t H, int64_t Hkv, int64_t D, int64_t q_offset,
                              float scale, Stream* s = nullptr) = 0;
  // As the fp32 ops, on bf16 activations (fp32 math inside, one rounding on store).
  virtual void rms_norm_bf16(const uint16_t* x, const float* w, uint16_t* y, int64_t rows,
                             int64_t dim, float eps, Stream* s = nullptr) = 0;
  virtual void layer_norm_bf16(const uint16_t* x, const float* w, const float* b, uint16_t* y,
                               int64_t rows, int64_t dim, float eps, Stream* s = nullptr) = 0;
  virtual void rope_bf16(uint16_t* x, const int32_t* pos, int64_t rows, int64_t n_heads,
                         int64_t head_dim, int64_t rotary_dim, const float* inv_freq,
                         Stream* s = nullptr) = 0;
  virtual void silu_mul_bf16(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n,
                             Stream* s = nullptr) = 0;
  virtual void relu_bf16(uint16_t* x, int64_t n, Stream* s = nullptr) = 0;
  virtual void add_bf16(uint16_t* y, const uint16_t* x, int64_t n, Stream* s = nullptr) = 0;
  // Conversions (round to nearest even, as zof::f32_to_bf16).
  virtual void to_bf16(const float* x, uint16_t* y, int64_t n, Stream* s = nullptr) = 0;
  virtual void to_f32(const uint16_t* x, float* y, int64_t n, Stream* s = nullptr) = 0;

  // The cudaStream_t behind s (nullptr: the default stream), as void* so that this header needs
  // no CUDA include; for timing with cudaEvents and for interop.
  virtual void* native_stream(Stream* s) = 0;
  virtual int device() const = 0;
};

// The backend on device `device`. Throws zof::Error (names the device count and the fix) when
// there is no such device or this build has no CUDA. tf32: its fp32 products run on TF32 tensor
// cores (10-bit mantissas in the products, fp32 sums); off, they are strict fp32.
std::unique_ptr<CudaBackend> make_cuda_backend(int device = 0, bool tf32 = false);

}  // namespace zof
