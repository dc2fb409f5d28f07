// (Not built by CMake: bench/gemm_libs.sh builds it once per library.)
// The CPU kernel libraries a user can have on a fresh machine, at the models' own product shapes:
// one source built once per library by bench/gemm_libs.sh (which prints the table) and linked to
// exactly one of
//   -DGEMM_ZOF   zof's own Backend::matmul (what the walks run: Debian's oneDNN and zof's row
//                blocks), from the build's per-layer libraries;
//   -DGEMM_DNNL  a oneDNN, whichever the include and library paths name (Debian's 2.x, or PyPI's
//                onednn-devel 3.x), y = x w^T with w laid out (N, K) as nn.Linear and zof hold it;
//   -DGEMM_MKL   MKL's cblas_gemm_bf16bf16f32 and cblas_sgemm (PyPI mkl-devel).
// Each runs fp32 and bf16 (bf16 inputs, fp32 accumulation and output) at every shape, best of
// --reps after a warm-up, and prints one JSON line per (shape, dtype).
//   gemm_libs THREADS REPS
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#if defined(GEMM_ZOF)
#include "zof/backend.h"
#include "zof/dtype.h"
#elif defined(GEMM_DNNL)
#include <oneapi/dnnl/dnnl.hpp>
#elif defined(GEMM_MKL)
#include <mkl.h>
#else
#error "build with one of -DGEMM_ZOF, -DGEMM_DNNL, -DGEMM_MKL"
#endif

namespace {

struct Shape {
  const char* what;
  int64_t M, N, K;
};
// GPT-2-124M's and SmolLM2-135M's layer products and LM-head chunks at 1024 rows (8 x 128 tokens),
// as dev/bf16_walk_timing.cpp and dev/torch_matmul_rate.py list them.
const Shape kShapes[] = {
    {"gpt2 qkv", 1024, 2304, 768},  {"gpt2 proj", 1024, 768, 768},   {"gpt2 fc", 1024, 3072, 768},
    {"gpt2 fc2", 1024, 768, 3072},  {"gpt2 head", 1016, 1344, 768},  {"smol q/o", 1024, 576, 576},
    {"smol k/v", 1024, 192, 576},   {"smol up", 1024, 1536, 576},    {"smol down", 1024, 576, 1536},
    {"smol head", 1016, 1792, 576},
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint16_t bf16_of(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

double best_of(int reps, const std::function<void()>& f) {
  f();  // warm-up (and any one-time setup inside the library)
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now();
    f();
    best = std::min(best, now() - t0);
  }
  return best;
}

#if defined(GEMM_DNNL)
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
struct DnnlMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  DnnlMatmul(int64_t M, int64_t N, int64_t K, dt t, void* x, void* w_nk, float* y) {
    dnnl::memory::desc xd({M, K}, t, tag::ab), wd({K, N}, t, tag::ba), yd({M, N}, dt::f32, tag::ab);
#if DNNL_VERSION_MAJOR >= 3
    auto pd = dnnl::matmul::primitive_desc(eng, xd, wd, yd);
#else
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(xd, wd, yd), eng);
#endif
    prim = dnnl::matmul(pd);
    src = dnnl::memory(xd, eng, x);
    wei = dnnl::memory(wd, eng, w_nk);
    dst = dnnl::memory(yd, eng, y);
  }
  void run() {
    prim.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    st.wait();
  }
};
#endif

std::string library() {
#if defined(GEMM_ZOF)
  return "zof";
#elif defined(GEMM_DNNL)
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch);
#else
  MKLVersion v;
  mkl_get_version(&v);
  return "MKL " + std::to_string(v.MajorVersion) + "." + std::to_string(v.UpdateVersion);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 15;
  omp_set_num_threads(threads);
#if defined(GEMM_MKL)
  mkl_set_num_threads(threads);
#endif
#if defined(GEMM_ZOF)
  auto be = zof::make_cpu_backend(threads);
#endif
  const std::string lib = library();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  for (const Shape& s : kShapes) {
    std::vector<float> x(s.M * s.K), w(s.N * s.K), y(s.M * s.N);
    for (auto& v : x) v = d(rng);
    for (auto& v : w) v = d(rng);
    std::vector<uint16_t> xb(x.size()), wb(w.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_of(x[i]);
    for (size_t i = 0; i < w.size(); ++i) wb[i] = bf16_of(w[i]);
    const double flop = 2.0 * s.M * s.N * s.K;
    for (const char* dtype : {"fp32", "bf16"}) {
      const bool bf = std::strcmp(dtype, "bf16") == 0;
      double t = 0;
#if defined(GEMM_ZOF)
      // The walks' call: fp32 activations (rounded to bf16 inside for a bf16 product), weights in
      // the product's type, (N, K); fp32 out.
      t = best_of(reps, [&] {
        be->matmul(x.data(), bf ? (const void*)wb.data() : (const void*)w.data(),
                   bf ? zof::DType::BF16 : zof::DType::F32, nullptr, y.data(), s.M, s.N, s.K);
      });
#elif defined(GEMM_DNNL)
      DnnlMatmul mm(s.M, s.N, s.K, bf ? dt::bf16 : dt::f32, bf ? (void*)xb.data() : x.data(),
                    bf ? (void*)wb.data() : w.data(), y.data());
      t = best_of(reps, [&] { mm.run(); });
#else
      if (bf)
        t = best_of(reps, [&] {
          cblas_gemm_bf16bf16f32(CblasRowMajor, CblasNoTrans, CblasTrans, s.M, s.N, s.K, 1.f,
                                 (const MKL_BF16*)xb.data(), s.K, (const MKL_BF16*)wb.data(), s.K,
                                 0.f, y.data(), s.N);
        });
      else
        t = best_of(reps, [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.M, s.N, s.K, 1.f, x.data(), s.K,
                      w.data(), s.K, 0.f, y.data(), s.N);
        });
#endif
      std::printf("{\"lib\": \"%s\", \"shape\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, "
                  "\"dtype\": \"%s\", \"threads\": %d, \"gflops\": %.1f}\n",
                  lib.c_str(), s.what, (long long)s.M, (long long)s.N, (long long)s.K, dtype,
                  threads, flop / t / 1e9);
    }
  }
  return 0;
}
