// Throwaway timing of the CPU backend's hot ops at GPT-2-small training shapes: matmul through
// the backend (weights (N,K) read transposed in place) beside a oneDNN matmul on pre-transposed
// (K,N) weights, attention, and the pointwise ops. Not built by CMake; after building zof_lib in
// build-ops (a library per layer), from the repository root:
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude dev/matmul_timing.cpp
//       build-ops/libzof_{backends,hf,util}.a -ldnnl -o /tmp/matmul_timing
//   /tmp/matmul_timing 2   (2 = threads)
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <vector>

#include "zof/backend.h"
#include "zof/config.h"

static double best_seconds(int reps, const std::function<void()>& f) {
  f();  // warm-up: primitive creation, page faults
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

static std::vector<float> random_vec(size_t n) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// oneDNN on weights already stored (K,N) row-major: what the strided (N,K) view is measured against.
static double dnnl_plain_seconds(int64_t M, int64_t N, int64_t K, int threads) {
  omp_set_num_threads(threads);
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  md a({M, K}, dt::f32, tag::ab), b({K, N}, dt::f32, tag::ab), bias({1, N}, dt::f32, tag::ab),
      c({M, N}, dt::f32, tag::ab);
  dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, bias, c), eng));
  auto x = random_vec(M * K), w = random_vec(K * N), bv = random_vec(N);
  std::vector<float> y(M * N);
  dnnl::memory ma(a, eng, x.data()), mb(b, eng, w.data()), mbias(bias, eng, bv.data()),
      mc(c, eng, y.data());
  return best_seconds(10, [&] {
    prim.execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_BIAS, mbias},
                      {DNNL_ARG_DST, mc}});
    st.wait();
  });
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  auto be = zof::make_cpu_backend(threads);
  dnnl_version_t const* v = dnnl_version();
  std::printf("oneDNN %d.%d.%d cpu_runtime=%d (OMP=%d), threads=%d\n", v->major, v->minor,
              v->patch, v->cpu_runtime, DNNL_RUNTIME_OMP, threads);

  std::printf("\n%-26s %10s %10s %14s\n", "matmul M,N,K (+bias)", "ms", "GFLOP/s", "plain (K,N)");
  struct Shape {
    int64_t M, N, K;
  };
  for (Shape s : {Shape{1024, 768, 768}, Shape{1024, 3072, 768}, Shape{1024, 2304, 768},
                  Shape{1024, 768, 3072}, Shape{1, 768, 768}, Shape{1024, 50257, 768}}) {
    auto x = random_vec(s.M * s.K), w = random_vec(s.N * s.K), bias = random_vec(s.N);
    std::vector<float> y(s.M * s.N);
    double t = best_seconds(s.N > 10000 ? 2 : 10, [&] {
      be->matmul(x.data(), w.data(), bias.data(), y.data(), s.M, s.N, s.K);
    });
    double flop = 2.0 * s.M * s.N * s.K;
    double tp = dnnl_plain_seconds(s.M, s.N, s.K, threads);
    std::printf("%5ld,%5ld,%5ld             %10.3f %10.1f %10.1f GF/s\n", long(s.M), long(s.N),
                long(s.K), t * 1e3, flop / t * 1e-9, flop / tp * 1e-9);
  }

  struct Attn {
    int64_t B, Tq, Tk, H, Hkv, D;
  };
  std::printf("\n%-34s %10s %10s\n", "attention B,Tq,Tk,H,Hkv,D", "ms", "GFLOP/s");
  for (Attn a : {Attn{8, 128, 128, 12, 12, 64}, Attn{1, 1024, 1024, 12, 12, 64},
                 Attn{4, 512, 512, 32, 8, 128}, Attn{8, 1, 1024, 12, 12, 64}}) {
    auto q = random_vec(a.B * a.Tq * a.H * a.D), k = random_vec(a.B * a.Tk * a.Hkv * a.D),
         vv = random_vec(a.B * a.Tk * a.Hkv * a.D);
    std::vector<float> out(a.B * a.Tq * a.H * a.D);
    const int64_t q_offset = a.Tk - a.Tq;
    double t = best_seconds(5, [&] {
      be->attention(q.data(), k.data(), vv.data(), out.data(), nullptr, a.B, a.Tq, a.Tk, a.H,
                    a.Hkv, a.D, q_offset, 0.125f);
    });
    double pairs = 0;  // (query, key) pairs under the causal mask
    for (int64_t i = 0; i < a.Tq; ++i) pairs += double(std::min(a.Tk, q_offset + i + 1));
    double flop = 4.0 * a.B * a.H * a.D * pairs;
    std::printf("%5ld,%5ld,%5ld,%3ld,%3ld,%4ld          %10.3f %10.1f\n", long(a.B), long(a.Tq),
                long(a.Tk), long(a.H), long(a.Hkv), long(a.D), t * 1e3, flop / t * 1e-9);
  }

  {
    const int64_t rows = 1024, C = 768, n = rows * 3072;
    auto x = random_vec(n), y = random_vec(n), w = random_vec(C), b = random_vec(C);
    std::vector<float> o(n);
    std::printf("\ngelu_tanh  n=%ld: %.3f ms\n", long(n),
                1e3 * best_seconds(10, [&] { be->gelu_tanh(x.data(), n); }));
    x = random_vec(n);
    std::printf("gelu_erf   n=%ld: %.3f ms\n", long(n),
                1e3 * best_seconds(10, [&] { be->gelu_erf(x.data(), n); }));
    x = random_vec(n);
    std::printf("silu_mul   n=%ld: %.3f ms\n", long(n),
                1e3 * best_seconds(10, [&] { be->silu_mul(x.data(), y.data(), o.data(), n); }));
    std::printf("layer_norm 1024x768: %.3f ms\n", 1e3 * best_seconds(10, [&] {
                  be->layer_norm(x.data(), w.data(), b.data(), o.data(), rows, C, 1e-5f);
                }));
    std::vector<int32_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) pos[r] = int32_t(r % 128);
    const std::vector<float> inv = zof::rope_default_inv_freq(1e4f, 64);
    std::printf("rope 1024x12x64: %.3f ms\n", 1e3 * best_seconds(10, [&] {
                  be->rope(x.data(), pos.data(), rows, 12, 64, 64, inv.data());
                }));
    const int64_t V = 50257, R = 256;
    auto logits = random_vec(R * V);
    std::vector<int32_t> tg(R, 7);
    std::vector<float> nll(R);
    double t = best_seconds(5, [&] { be->cross_entropy(logits.data(), tg.data(), nll.data(), R, V); });
    std::printf("cross_entropy 256x50257: %.3f ms (%.2f ns/logit)\n", t * 1e3, t * 1e9 / (R * V));
  }
  return 0;
}
