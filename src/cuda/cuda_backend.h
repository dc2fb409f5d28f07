// The CUDA backend: the Backend interface on one NVIDIA GPU (sm_80, sm_90), bf16 on the tensor
// cores where a call's dtype says so (cuBLASLt GEMMs, the mma flash-attention kernel).
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

// The Backend on a GPU, plus what a CUDA caller needs beside it. Every op, bf16 ones included,
// is a Backend entry: the dtype travels with the call (Backend::matmul's weight type,
// Backend::attention's inputs, cast and widen), as on the CPU.
class CudaBackend : public Backend {
 public:
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
