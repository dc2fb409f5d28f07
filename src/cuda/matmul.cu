// cuBLASLt matmuls: one descriptor, three layouts and the heuristic's best algorithm cached per
// (type, shape, bias, pointer alignment), created on first use of a shape.
#include "cuda/matmul.cuh"

#include <string>

#include "cuda/cuda_common.cuh"

namespace zof::cuda {

namespace {

constexpr size_t kMaxCached = 512;

// The largest power of two (up to 256) dividing the address: cuBLASLt's heuristic otherwise
// assumes 256-byte alignment, and a weight slice (GPT-2's fused qkv) may have 4.
int alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// y = bias (broadcast over rows) or 0; with accumulate, y += bias.
template <class T>
__global__ void bias_rows_kernel(const T* bias, T* y, int64_t M, int64_t N, bool accumulate) {
  const int64_t n = M * N;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float b = bias ? load_f32(bias + i % N) : 0.0f;
    store_f32(y + i, accumulate ? load_f32(y + i) + b : b);
  }
}

template <class T>
void launch_bias_rows(const T* bias, T* y, int64_t M, int64_t N, bool accumulate, cudaStream_t s) {
  bias_rows_kernel<<<grid_for(M * N, 256), 256, 0, s>>>(bias, y, M, N, accumulate);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

struct Matmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool bias_in_epilogue = false;  // else the bias is added by a kernel after the product
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

Matmul::Matmul() { CUBLAS_CHECK(cublasLtCreate(&handle_)); }
Matmul::~Matmul() {
  cache_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

const Matmul::Plan& Matmul::plan(const Key& key, const void* bias) {
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;
  if (cache_.size() >= kMaxCached) cache_.clear();  // generation sees every prompt length
  const auto [type, M, N, K, has_bias, ax, aw, ay, ab] = key;
  (void)ab;
  // in: x and w; out: bias, y (and cuBLASLt's C, which beta = 0 never reads).
  const bool f32_in = type == int(GemmType::F32) || type == int(GemmType::TF32);
  const cudaDataType_t in_t = f32_in ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType_t out_t = type == int(GemmType::BF16) ? CUDA_R_16BF : CUDA_R_32F;
  const char* what = type == int(GemmType::F32)    ? "fp32"
                     : type == int(GemmType::TF32) ? "fp32 (TF32)"
                     : type == int(GemmType::BF16) ? "bf16"
                                                   : "bf16 (fp32 out)";
  auto p = std::make_unique<Plan>();
  // Column-major view: A = w as (K, N) ld K, B = x as (K, M) ld K, C = y as (N, M) ld N.
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, in_t, (uint64_t)K, (uint64_t)N, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, in_t, (uint64_t)K, (uint64_t)M, K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, out_t, (uint64_t)N, (uint64_t)M, N));

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t align_a = aw, align_b = ax, align_c = ay;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  // The bias as cuBLASLt's epilogue where an algorithm offers it, else a kernel after the product.
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
  for (const bool epilogue : {has_bias, false}) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    // CUBLAS_COMPUTE_32F with fp32 inputs is true fp32: TF32 only under COMPUTE_32F_FAST_TF32,
    // which --tf32 asks for.
    const cublasComputeType_t compute =
        type == int(GemmType::TF32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
    const cublasLtEpilogue_t epi = epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (epilogue) {  // the heuristic sees the bias pointer (of the alignment in the key) too
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      if (in_t != out_t) {  // the bias has y's type: cuBLASLt's default, said where A and B differ
        const int32_t bias_t = out_t;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &bias_t, sizeof(bias_t)));
      }
    }
    st = cublasLtMatmulAlgoGetHeuristic(handle_, p->desc, p->a, p->b, p->c, p->c, pref, 1, &result,
                                        &found);
    p->bias_in_epilogue = epilogue;
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) break;
    if (!has_bias) break;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  ZOF_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
            "cuBLASLt has no algorithm for a " + std::string(what) +
                " matmul M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" +
                std::to_string(K) + " on this GPU (status " + std::to_string(int(st)) + ")");
  p->algo = result.algo;
  return *cache_.emplace(key, std::move(p)).first->second;
}

void Matmul::run(GemmType t, const void* x, const void* w, const void* bias, void* y, int64_t M,
                 int64_t N, int64_t K, void* workspace, cudaStream_t s) {
  if (M <= 0 || N <= 0) return;
  const bool f32_out = t != GemmType::BF16;  // bias and y fp32
  if (K <= 0) {
    if (f32_out)
      launch_bias_rows(static_cast<const float*>(bias), static_cast<float*>(y), M, N, false, s);
    else
      launch_bias_rows(static_cast<const bf16*>(bias), static_cast<bf16*>(y), M, N, false, s);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  const Plan& p = plan(Key{int(t), M, N, K, bias != nullptr, alignment(x), alignment(w),
                           alignment(y), bias ? alignment(bias) : 0},
                      bias);
  if (bias && p.bias_in_epilogue)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c,
                              &p.algo, workspace, kWorkspaceBytes, s));
  if (bias && !p.bias_in_epilogue) {
    if (f32_out)
      launch_bias_rows(static_cast<const float*>(bias), static_cast<float*>(y), M, N, true, s);
    else
      launch_bias_rows(static_cast<const bf16*>(bias), static_cast<bf16*>(y), M, N, true, s);
  }
}

}  // namespace zof::cuda
