// cuda::Matmul: y(M,N) = x(M,K) w(N,K)^T + bias(N) through cuBLASLt, in strict fp32 (no TF32),
// bf16 in/out, or bf16 in and fp32 out, always with fp32 accumulation; the bias is cuBLASLt's
// epilogue. Row-major y is the column-major y^T = w x^T, so w (nn.Linear layout) is read in place
// with op T. Host code only (no device code in this header): the GPU benchmarks time it as the
// raw cuBLASLt rate beside the backend's products.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime.h>

namespace zof::cuda {

// Element types of (x and w; bias and y). Accumulation is fp32 in each.
enum class GemmType {
  F32,          // all fp32: strict fp32 products
  BF16,         // all bf16 (block_bench: cuBLASLt's raw bf16 rate, the limit)
  BF16_F32OUT,  // x and w bf16 (tensor cores), bias and y fp32 (Backend::matmul with bf16 weights)
  TF32,         // all fp32 in memory, the products on TF32 tensor cores (--tf32)
};

class Matmul {
 public:
  // The workspace each stream needs (cuBLASLt's recommendation for Hopper).
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;

  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // Enqueues the product on stream s; x, w, bias and y of the types t names. workspace:
  // kWorkspaceBytes of device memory that no other stream uses. bias may be null. K == 0 gives
  // y = bias (or 0).
  void run(GemmType t, const void* x, const void* w, const void* bias, void* y, int64_t M,
           int64_t N, int64_t K, void* workspace, cudaStream_t s);

 private:
  struct Plan;
  // type, M, N, K, has_bias, alignments of x, w, y, bias (they restrict the algorithms)
  using Key = std::tuple<int, int64_t, int64_t, int64_t, bool, int, int, int, int>;
  const Plan& plan(const Key& key, const void* bias);

  cublasLtHandle_t handle_ = nullptr;
  std::mutex mu_;  // the cache, and the bias pointer set on a cached descriptor before a call
  std::map<Key, std::unique_ptr<Plan>> cache_;
};

}  // namespace zof::cuda
