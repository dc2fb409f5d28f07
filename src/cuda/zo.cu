// ZO pass kernel: one thread per group of 4 elements (one Philox block gives 4 normals), the
// same arithmetic in the same order as cpu::zo_pass (src/cpu/cpu_zo.cpp). Compiled with
// --fmad=false (CMakeLists.txt) so that no multiply-add is fused where the host's is not.
#include "cuda/zo.cuh"

#include <string>

#include "util/philox.h"

namespace zof::cuda {

namespace {

// A perturbed copy's element: fp32 as computed, or that value rounded as zof::f32_to_bf16.
__device__ __forceinline__ void store_copy(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_copy(bf16* p, float v) { *p = f32_to_bf16_exact(v); }
// A master's element (T: float, or bf16 for a bf16 master held in 2 bytes) as fp32, and back:
// what a bf16 master stores is a stochastically rounded value, a bf16 value already (exact).
__device__ __forceinline__ float load_master(const float* p) { return *p; }
__device__ __forceinline__ float load_master(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_master(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_master(bf16* p, float v) { *p = f32_to_bf16_exact(v); }

// One thread per group of 4 elements, groups counted from the tensor's start; elements
// [first, first + n) are touched, theta/plus/minus point at element first. upd: n_update terms
// in device memory, read by every thread (the same address across a warp: one broadcast load).
template <class C, class T>
__global__ void zo_pass_kernel(T* theta, int64_t first, int64_t n, uint32_t tensor,
                               const ZOUpdateTerm* __restrict__ upd, int n_update, float lr_wd,
                               ZKey round, bool has_round, ZKey cur, bool has_cur, float eps,
                               C* plus, C* minus) {
  const int64_t end = first + n, g_lo = first / 4, g_hi = (end + 3) / 4;
  for (int64_t g = g_lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < g_hi;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i0 = g * 4 - first;  // local index of the group's element 0 (may be < 0)
    const int lo = i0 < 0 ? int(-i0) : 0;
    const int hi = end - g * 4 < 4 ? int(end - g * 4) : 4;
    float th[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int l = lo; l < hi; ++l) th[l] = load_master(theta + i0 + l);
    if (n_update > 0) {
      float acc[4];
      for (int l = 0; l < 4; ++l) acc[l] = lr_wd * th[l];
      for (int j = 0; j < n_update; ++j) {
        const ZKey key = upd[j].key;
        const float coef = upd[j].coef;
        float z[4];
        z_group(key, tensor, (uint32_t)g, z);
        const float mk = key.mask;  // Sparse MeZO: as cpu::zo_pass
        for (int l = 0; l < 4; ++l) z[l] = fabsf(th[l]) > mk ? 0.0f : z[l];
        for (int l = 0; l < 4; ++l) acc[l] = fmaf(coef, z[l], acc[l]);
      }
      for (int l = 0; l < 4; ++l) th[l] = th[l] - acc[l];
      if (has_round) {  // a bf16 master: the bits of round_bf16_kernel
        uint32_t r[4];
        round_bits_group(round.seed, round.step, tensor, (uint32_t)g, r);
        for (int l = 0; l < 4; ++l) th[l] = bf16_round_stochastic(th[l], r[l]);
      }
      for (int l = lo; l < hi; ++l) store_master(theta + i0 + l, th[l]);
    }
    if (has_cur) {
      float z[4];
      z_group(cur, tensor, (uint32_t)g, z);
      for (int l = 0; l < 4; ++l) z[l] = fabsf(th[l]) > cur.mask ? 0.0f : z[l];
      for (int l = lo; l < hi; ++l) {
        if (plus) store_copy(plus + i0 + l, zo_perturbed(th[l], z[l], eps));
        if (minus) store_copy(minus + i0 + l, zo_perturbed(th[l], z[l], -eps));
      }
    }
  }
}

// Backend::zo_rows: blockIdx.y walks the rows, the threads of x the groups of 4 of a row
// (groups counted from the tensor's start, as zo_pass_kernel with first = the row's start).
template <class T>
__global__ void zo_rows_kernel(const T* theta, int64_t width, const int32_t* rows,
                               int64_t n_rows, uint32_t tensor, ZKey cur, float eps, float* plus,
                               float* minus) {
  for (int64_t k = blockIdx.y; k < n_rows; k += gridDim.y) {
    const int64_t first = (int64_t)rows[k] * width, end = first + width;
    const T* th_row = theta + first;
    float* p = plus + k * width;
    float* m = minus ? minus + k * width : nullptr;
    const int64_t g_lo = first / 4, g_hi = (end + 3) / 4;
    for (int64_t g = g_lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < g_hi;
         g += (int64_t)gridDim.x * blockDim.x) {
      const int64_t i0 = g * 4 - first;
      const int lo = i0 < 0 ? int(-i0) : 0;
      const int hi = end - g * 4 < 4 ? int(end - g * 4) : 4;
      float th[4] = {0.0f, 0.0f, 0.0f, 0.0f}, z[4];
      for (int l = lo; l < hi; ++l) th[l] = load_master(th_row + i0 + l);
      z_group(cur, tensor, (uint32_t)g, z);
      for (int l = 0; l < 4; ++l) z[l] = fabsf(th[l]) > cur.mask ? 0.0f : z[l];
      for (int l = lo; l < hi; ++l) {
        p[i0 + l] = zo_perturbed(th[l], z[l], eps);
        if (m) m[i0 + l] = zo_perturbed(th[l], z[l], -eps);
      }
    }
  }
}

// Backend::round_bf16_stochastic: one thread per group of 4, the bits of philox.h.
__global__ void round_bf16_kernel(float* x, int64_t first, int64_t n, uint32_t tensor, ZKey key) {
  const int64_t end = first + n, g_lo = first / 4, g_hi = (end + 3) / 4;
  for (int64_t g = g_lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < g_hi;
       g += (int64_t)gridDim.x * blockDim.x) {
    uint32_t r[4];
    round_bits_group(key.seed, key.step, tensor, (uint32_t)g, r);
    for (int l = 0; l < 4; ++l) {
      const int64_t i = g * 4 + l;
      if (i >= first && i < end) x[i - first] = bf16_round_stochastic(x[i - first], r[l]);
    }
  }
}

// Backend::zo_update_state: one thread per group of 4, the arithmetic of cpu::zo_update_state.
template <class T>
__global__ void zo_state_kernel(T* theta, float* m, float* v, int64_t first, int64_t n,
                                uint32_t tensor, const ZOUpdateTerm* __restrict__ upd,
                                int n_update, ZOOptimizer o, ZKey round, bool has_round) {
  const int64_t end = first + n, g_lo = first / 4, g_hi = (end + 3) / 4;
  for (int64_t g = g_lo + blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < g_hi;
       g += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i0 = g * 4 - first;
    const int lo = i0 < 0 ? int(-i0) : 0;
    const int hi = end - g * 4 < 4 ? int(end - g * 4) : 4;
    float th[4] = {0.0f, 0.0f, 0.0f, 0.0f}, gh[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int l = lo; l < hi; ++l) th[l] = load_master(theta + i0 + l);
    for (int j = 0; j < n_update; ++j) {
      const ZKey key = upd[j].key;
      const float coef = upd[j].coef;
      float z[4];
      z_group(key, tensor, (uint32_t)g, z);
      const float mk = key.mask;
      for (int l = 0; l < 4; ++l) gh[l] = fmaf(coef, fabsf(th[l]) > mk ? 0.0f : z[l], gh[l]);
    }
    uint32_t r[4] = {0u, 0u, 0u, 0u};
    if (has_round) round_bits_group(round.seed, round.step, tensor, (uint32_t)g, r);
    for (int l = lo; l < hi; ++l) {
      float nt;
      if (o.kind == ZOOptimizer::Momentum) {
        const float mm = fmaf(o.beta1, m[i0 + l], fmaf(o.wd, th[l], gh[l]));
        m[i0 + l] = mm;
        nt = fmaf(-o.lr, mm, th[l]);
      } else {
        const float mm = fmaf(o.beta1, m[i0 + l], (1.0f - o.beta1) * gh[l]);
        const float vv = fmaf(o.beta2, v[i0 + l], (1.0f - o.beta2) * gh[l] * gh[l]);
        m[i0 + l] = mm;
        v[i0 + l] = vv;
        const float step = mm * o.bc1 / (sqrtf(vv * o.bc2) + o.eps);
        nt = fmaf(-o.lr, fmaf(o.wd, th[l], step), th[l]);  // as the host: one rounding
      }
      store_master(theta + i0 + l, has_round ? bf16_round_stochastic(nt, r[l]) : nt);
    }
  }
}

}  // namespace

void zo_rows(const void* theta, DType theta_t, int64_t width, const int32_t* rows,
             int64_t n_rows, uint32_t tensor, const ZKey& cur, float eps, float* plus,
             float* minus, cudaStream_t s) {
  if (width <= 0 || n_rows <= 0) return;
  const int64_t groups = width / 4 + 2;  // a row's groups, at any alignment
  const dim3 grid(grid_for(groups, 256), unsigned(n_rows < 65535 ? n_rows : 65535));
  if (theta_t == DType::BF16)
    zo_rows_kernel<<<grid, 256, 0, s>>>(static_cast<const bf16*>(theta), width, rows, n_rows,
                                        tensor, cur, eps, plus, minus);
  else
    zo_rows_kernel<<<grid, 256, 0, s>>>(static_cast<const float*>(theta), width, rows, n_rows,
                                        tensor, cur, eps, plus, minus);
  CUDA_CHECK(cudaGetLastError());
}

void round_bf16_stochastic(float* x, int64_t n, uint32_t tensor, int64_t first, const ZKey& key,
                           cudaStream_t s) {
  if (n <= 0) return;
  const int64_t groups = n / 4 + 2;
  round_bf16_kernel<<<grid_for(groups, 256), 256, 0, s>>>(x, first, n, tensor, key);
  CUDA_CHECK(cudaGetLastError());
}

void check_zo_terms(int n_update) {
  ZOF_CHECK(n_update >= 0 && n_update <= kMaxZOTerms,
            "the CUDA backend applies at most " + std::to_string(kMaxZOTerms) +
                " ZO directions per step (asked for " + std::to_string(n_update) +
                "); use fewer --queries");
}

void zo_update_state(void* theta, DType theta_t, float* m, float* v, int64_t n, uint32_t tensor,
                     int64_t first, const ZOUpdateTerm* upd, int n_update, const ZOOptimizer& o,
                     const ZKey* round, cudaStream_t s) {
  check_zo_terms(n_update);
  if (n <= 0 || n_update <= 0) return;
  ZOF_ASSERT(upd);
  ZOF_ASSERT(theta_t == DType::F32 || round);  // a bf16 master's update is rounded stochastically
  const int64_t groups = (first + n + 3) / 4 - first / 4;
  const ZKey rk = round ? *round : ZKey{};
  if (theta_t == DType::BF16)
    zo_state_kernel<<<grid_for(groups, 256), 256, 0, s>>>(
        static_cast<bf16*>(theta), m, v, first, n, tensor, upd, n_update, o, rk, round != nullptr);
  else
    zo_state_kernel<<<grid_for(groups, 256), 256, 0, s>>>(
        static_cast<float*>(theta), m, v, first, n, tensor, upd, n_update, o, rk, round != nullptr);
  CUDA_CHECK(cudaGetLastError());
}

namespace {

template <class C, class T>
void launch_zo_pass(T* theta, int64_t n, uint32_t tensor, int64_t first,
                    const ZOUpdateTerm* upd, int n_update, float lr_wd, const ZKey* round,
                    const ZKey* cur, float eps, void* plus, void* minus, cudaStream_t s) {
  const int64_t groups = (first + n + 3) / 4 - first / 4;
  zo_pass_kernel<C, T><<<grid_for(groups, 256), 256, 0, s>>>(
      theta, first, n, tensor, upd, n_update, lr_wd, round ? *round : ZKey{}, round != nullptr,
      cur ? *cur : ZKey{}, cur != nullptr, eps, static_cast<C*>(plus), static_cast<C*>(minus));
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void zo_pass(void* theta, DType theta_t, int64_t n, uint32_t tensor, int64_t first,
             const ZOUpdateTerm* upd, int n_update, float lr_wd, const ZKey* round,
             const ZKey* cur, float eps, void* plus, void* minus, DType copy_t, cudaStream_t s) {
  check_zo_terms(n_update);
  ZOF_CHECK(copy_t == DType::F32 || copy_t == DType::BF16,
            std::string("the CUDA ZO pass writes fp32 or bf16 perturbed copies, not ") +
                dtype_name(copy_t));
  if (n <= 0 || (n_update <= 0 && !cur)) return;
  ZOF_ASSERT(n_update == 0 || upd);
  // A bf16 master's update is rounded stochastically: a value it stores exactly.
  ZOF_ASSERT(theta_t == DType::F32 || n_update == 0 || round);
  auto launch = [&](auto* th) {
    if (copy_t == DType::BF16)
      launch_zo_pass<bf16>(th, n, tensor, first, upd, n_update, lr_wd, round, cur, eps, plus,
                           minus, s);
    else
      launch_zo_pass<float>(th, n, tensor, first, upd, n_update, lr_wd, round, cur, eps, plus,
                            minus, s);
  };
  if (theta_t == DType::BF16)
    launch(static_cast<bf16*>(theta));
  else
    launch(static_cast<float*>(theta));
}

}  // namespace zof::cuda
