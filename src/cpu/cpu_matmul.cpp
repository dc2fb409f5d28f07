// cpu::Matmul: y = x w^T + bias through oneDNN's matmul primitive in strict fp32. The nn.Linear
// weight (N,K) row-major is described to oneDNN as a (K,N) matrix with strides (1,K), so it is
// read in place; primitives are cached per (M,N,K,bias) since creating one JIT-compiles kernels.
#include <omp.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#include "cpu/cpu_ops.h"
#include "cpu/host_backend.h"
#include "zof/error.h"

static_assert(DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP,
              "zof sets oneDNN's thread count through OpenMP; it needs an OpenMP build of oneDNN");

namespace zof::cpu {

namespace {

// oneDNN's OpenMP runtime sizes its parallel regions from omp_get_max_threads() both when a
// primitive is created and when it runs, so the backend's thread count is set around both and the
// caller's value restored after. The libgomp pool is shared with zof's own loops: no
// oversubscription as long as no op is called from inside an OpenMP parallel region.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) {
    if (n != saved_) omp_set_num_threads(n);
  }
  ~OmpThreads() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

// A (rows, cols) fp32 matrix with the given strides, in elements.
dnnl::memory::desc matrix(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride) {
  return dnnl::memory::desc({rows, cols}, dnnl::memory::data_type::f32,
                            dnnl::memory::dims{row_stride, col_stride});
}
dnnl::memory::desc x_desc(int64_t M, int64_t K) { return matrix(M, K, K, 1); }
dnnl::memory::desc w_desc(int64_t N, int64_t K) { return matrix(K, N, 1, K); }  // w^T (K,N)
dnnl::memory::desc y_desc(int64_t M, int64_t N) { return matrix(M, N, N, 1); }
dnnl::memory::desc bias_desc(int64_t N) { return matrix(1, N, N, 1); }

constexpr size_t kMaxCached = 256;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

struct Matmul::Impl {
  using Key = std::tuple<int64_t, int64_t, int64_t, bool>;  // M, N, K, has_bias
  int threads;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mu;  // guards the cache and the scratchpad
  std::map<Key, dnnl::matmul> cache;
  std::unique_ptr<void, FreeDeleter> scratch;
  size_t scratch_bytes = 0;

  explicit Impl(int n) : threads(n) {
    const dnnl_version_t* v = dnnl_version();
    ZOF_CHECK(v->cpu_runtime == DNNL_RUNTIME_OMP,
              "the oneDNN library loaded at run time was not built with OpenMP (cpu_runtime " +
                  std::to_string(v->cpu_runtime) +
                  "); install the OpenMP build (Debian: libdnnl2) that zof was compiled against");
    scratch.reset(aligned_host_alloc(64));
    scratch_bytes = 64;
  }

  const dnnl::matmul& primitive(int64_t M, int64_t N, int64_t K, bool has_bias) {
    Key key{M, N, K, has_bias};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    // Training sees a handful of shapes; prompts of every length during generation would grow
    // the cache without end, so it starts over past a bound.
    if (cache.size() >= kMaxCached) cache.clear();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // Never let ONEDNN_DEFAULT_FPMATH_MODE trade fp32 for bf16 behind the tests' back.
    attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
    dnnl::matmul::desc desc =
        has_bias ? dnnl::matmul::desc(x_desc(M, K), w_desc(N, K), bias_desc(N), y_desc(M, N))
                 : dnnl::matmul::desc(x_desc(M, K), w_desc(N, K), y_desc(M, N));
    dnnl::matmul::primitive_desc pd(desc, attr, engine);
    size_t need = pd.scratchpad_desc().get_size();
    if (need > scratch_bytes) {
      scratch.reset(aligned_host_alloc(need));
      scratch_bytes = need;
    }
    return cache.emplace(key, dnnl::matmul(pd)).first->second;
  }
};

Matmul::Matmul(int threads) : impl_(std::make_unique<Impl>(threads)) {}
Matmul::~Matmul() = default;

void Matmul::run(const float* x, const float* w, const float* bias, float* y, int64_t M,
                 int64_t N, int64_t K) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty sum: y is the bias, broadcast
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] = bias ? bias[n] : 0.0f;
    return;
  }
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  OmpThreads threads(im.threads);
  const dnnl::matmul& prim = im.primitive(M, N, K, bias != nullptr);
  // oneDNN takes non-const handles; it never writes the source, weights or bias.
  dnnl::memory src(x_desc(M, K), im.engine, const_cast<float*>(x));
  dnnl::memory wei(w_desc(N, K), im.engine, const_cast<float*>(w));
  dnnl::memory dst(y_desc(M, N), im.engine, y);
  dnnl::memory scratch(dnnl::memory::desc({int64_t(im.scratch_bytes)}, dnnl::memory::data_type::u8,
                                          dnnl::memory::format_tag::a),
                       im.engine, im.scratch.get());
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src},
                                             {DNNL_ARG_WEIGHTS, wei},
                                             {DNNL_ARG_DST, dst},
                                             {DNNL_ARG_SCRATCHPAD, scratch}};
  if (bias)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_desc(N), im.engine, const_cast<float*>(bias)));
  prim.execute(im.stream, args);
  im.stream.wait();
}

}  // namespace zof::cpu
