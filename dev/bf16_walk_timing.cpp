// Where a bf16 ZO step's time goes on a CPU, shape by shape: the backend's matmul (fp32 and bf16)
// beside oneDNN's matmul on the same shapes with the weights laid out (N,K) as zof reads them
// (the source rounded to bf16 ahead, on the calling thread, or in a parallel region of its own)
// and prepacked by oneDNN (the reorder not timed); then attention in both dtypes. Variants
// run interleaved, best of --reps rounds, so a busy machine slows them alike. Not built by CMake;
// after building zof_lib in build-h4 (a library per layer), from the repository root:
//   g++ -std=c++20 -O3 -march=native -fopenmp -Iinclude -Isrc dev/bf16_walk_timing.cpp
//       build-h4/libzof_{backends,util}.a -ldnnl -o /tmp/bf16_walk_timing
//   /tmp/bf16_walk_timing 2 15
#include <omp.h>

#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "zof/backend.h"
#include "zof/dtype.h"

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// Wall time, or with ZOF_CPU_TIME=1 the process's CPU time divided by the thread count: on a
// machine shared with other jobs (run with OMP_WAIT_POLICY=passive so that waiting threads do not
// spin), what the op would take alone on its cores if its threads were balanced.
bool cpu_time = false;
int n_threads = 1;
double now() {
  if (cpu_time) {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double(t.tv_sec) + 1e-9 * double(t.tv_nsec)) / n_threads;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<float> random_vec(size_t n, unsigned seed = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = zof::f32_to_bf16(v[i]);
  return o;
}

// A oneDNN matmul y = x w^T (+ bias) on raw memory with the given weight layout.
struct DnnlCase {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  dnnl::matmul prim;
  dnnl::memory src, wei, bias, dst;
  std::vector<char> wbuf;  // prepacked weights

  // layout: "ba" (nn.Linear (N,K), read transposed, as zof does) or "any" (oneDNN's choice: the
  // weights reordered once into it, untimed). A (K,N) "ab" layout times as "ba" does on 2.6.3.
  DnnlCase(int64_t M, int64_t N, int64_t K, dt t, const std::string& layout, void* x, void* w_nk,
           float* b, float* y) {
    dnnl::memory::desc xd({M, K}, t, tag::ab), yd({M, N}, dt::f32, tag::ab),
        bd({1, N}, dt::f32, tag::ab);
    dnnl::memory::desc wd = layout == "ba" ? dnnl::memory::desc({K, N}, t, tag::ba)
                                           : dnnl::memory::desc({K, N}, t, tag::any);
    dnnl::primitive_attr attr;
    attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
    auto pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(xd, wd, bd, yd), attr, eng);
    prim = dnnl::matmul(pd);
    src = dnnl::memory(xd, eng, x);
    bias = dnnl::memory(bd, eng, b);
    dst = dnnl::memory(yd, eng, y);
    if (layout == "any") {
      dnnl::memory plain({{K, N}, t, tag::ba}, eng, w_nk);
      wbuf.resize(pd.weights_desc().get_size());
      wei = dnnl::memory(pd.weights_desc(), eng, wbuf.data());
      dnnl::reorder(plain, wei).execute(st, plain, wei);
      st.wait();
    } else {
      wei = dnnl::memory(pd.weights_desc(), eng, w_nk);
    }
  }
  void run() {
    prim.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_BIAS, bias},
                      {DNNL_ARG_DST, dst}});
    st.wait();
  }
};

struct Timed {
  std::string name;
  std::function<void()> f;
  double best = 1e30;
  std::vector<double> all;
  double median() {
    std::sort(all.begin(), all.end());
    return all[all.size() / 2];
  }
};

// ZOF_MEDIAN=1: report the median instead of the best (how a loaded machine treats each variant).
bool use_median = false;
void race(std::vector<Timed>& v, int reps) {
  for (auto& t : v) t.f();  // warm-up
  for (int r = 0; r < reps; ++r)
    for (auto& t : v) {
      const double t0 = now();
      t.f();
      t.all.push_back(now() - t0);
      t.best = std::min(t.best, t.all.back());
    }
  if (use_median)
    for (auto& t : v) t.best = t.median();
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  const std::string only = argc > 3 ? argv[3] : "";  // "matmul" or "attention": that part alone
  omp_set_num_threads(threads);
  n_threads = threads;
  use_median = std::getenv("ZOF_MEDIAN") && std::atoi(std::getenv("ZOF_MEDIAN")) != 0;
  cpu_time = std::getenv("ZOF_CPU_TIME") && std::atoi(std::getenv("ZOF_CPU_TIME")) != 0;
  auto be = zof::make_cpu_backend(threads);
  const dnnl_version_t* v = dnnl_version();
  std::printf("oneDNN %d.%d.%d, %d threads, best of %d, %s; GFLOP/s\n", v->major, v->minor,
              v->patch, threads, reps, cpu_time ? "CPU time / threads" : "wall time");
  struct Shape {
    const char* what;
    int64_t M, N, K;
  };
  const Shape shapes[] = {
      {"gpt2 qkv", 1024, 2304, 768},    {"gpt2 proj", 1024, 768, 768},
      {"gpt2 fc", 1024, 3072, 768},     {"gpt2 fc2", 1024, 768, 3072},
      {"gpt2 head", 1016, 1344, 768},   {"smol q/o", 1024, 576, 576},
      {"smol k/v", 1024, 192, 576},     {"smol up", 1024, 1536, 576},
      {"smol down", 1024, 576, 1536},   {"smol head", 1016, 1792, 576},
  };
  std::printf("%-10s %16s | %8s %8s | %8s %8s %8s %8s %8s\n", "", "M N K", "zof f32",
              "zof bf16", "bf16 ba", "1t cv+ba", "nt cv+ba", "bf16 pk", "f32 pk");
  for (const Shape& s : shapes) {
    if (only == "attention") break;
    const int64_t M = s.M, N = s.N, K = s.K;
    auto x = random_vec(M * K), w = random_vec(N * K, 2), b = random_vec(N, 3);
    auto xb = to_bf16(x), wb = to_bf16(w), xc = xb;
    std::vector<float> y(M * N);
    DnnlCase bba(M, N, K, dt::bf16, "ba", xb.data(), wb.data(), b.data(), y.data());
    DnnlCase bcv(M, N, K, dt::bf16, "ba", xc.data(), wb.data(), b.data(), y.data());
    DnnlCase bpk(M, N, K, dt::bf16, "any", xb.data(), wb.data(), b.data(), y.data());
    DnnlCase fpk(M, N, K, dt::f32, "any", x.data(), w.data(), b.data(), y.data());
    const int64_t n = M * K;
    std::vector<Timed> t = {
        {"zof f32", [&] { be->matmul(x.data(), w.data(), zof::DType::F32, b.data(), y.data(), M, N, K); }},
        {"zof bf16", [&] { be->matmul(x.data(), wb.data(), zof::DType::BF16, b.data(), y.data(), M, N, K); }},
        {"bf16 ba", [&] { bba.run(); }},
        {"1t cv+ba", [&] {  // the source rounded on the calling thread, then the product
           for (int64_t i = 0; i < n; ++i) xc[i] = zof::f32_to_bf16(x[i]);
           bcv.run();
         }},
        {"nt cv+ba", [&] {  // rounded in a parallel region of its own, then the product
#pragma omp parallel for schedule(static)
           for (int64_t i = 0; i < n; ++i) xc[i] = zof::f32_to_bf16(x[i]);
           bcv.run();
         }},
        {"bf16 pk", [&] { bpk.run(); }},
        {"f32 pk", [&] { fpk.run(); }},
    };
    race(t, reps);
    const double flop = 2.0 * M * N * K;
    std::printf("%-10s %5ld %5ld %5ld |", s.what, long(M), long(N), long(K));
    for (size_t i = 0; i < t.size(); ++i)
      std::printf(" %8.1f%s", flop / t[i].best * 1e-9, i == 1 ? " |" : "");
    std::printf("\n");
  }

  struct Attn {
    const char* what;
    int64_t B, T, H, Hkv, D;
  };
  std::printf("\n%-10s %20s | %8s %8s  (GFLOP/s, causal)\n", "attention", "B T H Hkv D", "f32",
              "bf16");
  for (Attn a : {Attn{"gpt2", 8, 128, 12, 12, 64}, Attn{"smol", 8, 128, 9, 3, 64}}) {
    if (only == "matmul") break;
    auto q = random_vec(a.B * a.T * a.H * a.D), k = random_vec(a.B * a.T * a.Hkv * a.D, 2),
         vv = random_vec(a.B * a.T * a.Hkv * a.D, 3);
    std::vector<float> out(q.size());
    std::vector<Timed> t;
    for (zof::DType d : {zof::DType::F32, zof::DType::BF16})
      t.push_back({"", [&, d] {
                     be->attention(q.data(), k.data(), vv.data(), out.data(), nullptr, a.B, a.T,
                                   a.T, a.H, a.Hkv, a.D, 0, 0.125f, 0, 0.f, d);
                   }});
    race(t, reps);
    const double flop = 4.0 * a.B * a.H * a.D * (a.T * (a.T + 1) / 2);
    std::printf("%-10s %4ld %4ld %3ld %3ld %4ld | %8.1f %8.1f\n", a.what, long(a.B), long(a.T),
                long(a.H), long(a.Hkv), long(a.D), flop / t[0].best * 1e-9,
                flop / t[1].best * 1e-9);
  }
  return 0;
}
