// cpu::Matmul: y = x w^T + bias through oneDNN's matmul primitive in strict fp32. The nn.Linear
// weight (N,K) row-major is described to oneDNN as a (K,N) matrix with strides (1,K), so it is
// read in place; primitives are cached per (M,N,K,bias) since creating one JIT-compiles kernels.
// Every product runs as blocks of rows and columns in one parallel region of zof's own, each
// block multiplied by one thread (see run_blocks), so no sum depends on the thread count; a
// bf16 product's rows are rounded to bf16 first, once. On a CPU
// where oneDNN has no bf16 product (AVX2), the blocks run in fp32 on the bf16 values widened:
// the same bf16 inputs and fp32 sums, slower than fp32 (--dtype auto's probe then picks fp32).
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

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

using dt = dnnl::memory::data_type;
// A (rows, cols) matrix with the given strides, in elements.
dnnl::memory::desc matrix(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride,
                          dt t = dt::f32) {
  return dnnl::memory::desc({rows, cols}, t, dnnl::memory::dims{row_stride, col_stride});
}
dt of(DType t) { return t == DType::BF16 ? dt::bf16 : dt::f32; }
dnnl::memory::desc x_desc(int64_t M, int64_t K, dt t = dt::f32) { return matrix(M, K, K, 1, t); }
dnnl::memory::desc w_desc(int64_t N, int64_t K, dt t = dt::f32) {  // w^T (K,N)
  return matrix(K, N, 1, K, t);
}
dnnl::memory::desc y_desc(int64_t M, int64_t N, int64_t ldy = 0) {
  return matrix(M, N, ldy ? ldy : N, 1);
}
dnnl::memory::desc bias_desc(int64_t N) { return matrix(1, N, N, 1); }

constexpr size_t kMaxCached = 256;

// A product runs in blocks, each on one thread (a single-threaded primitive), blocks handed
// out in turn. Why not oneDNN's own threads: the rows must be rounded to bf16 first, and doing
// that in a parallel region of its own put a second fork and join on every product. On a shared
// machine each join is a chance to wait a scheduler tick for a preempted partner thread
// (bench/RESULTS.md: GPT-2's bf16 step slower than fp32 under load, with half fp32's CPU time);
// with blocks there is one region, the rounded rows are still in cache when they are multiplied,
// and a thread that runs takes the blocks of one that does not.
// Every output is made by a one-thread primitive of one fixed shape, whatever the threads and
// however many rows the product has: oneDNN's kernels sum an output in an order that depends on
// the shape they are given and on the threads they split K over (an AMX machine gave other bits
// at 2, 3 and 8 threads than at 1; an AVX2 one other bits for a row in a product of 32 rows than
// of 64), and data-parallel ranks, or a resumed run on other threads, must compute the rows one
// process computes bit for bit (tests/unit/test_ops.cpp CpuThreadCountIndependence*,
// tests/mpi). So rows go in blocks of exactly kBlockRows, the last one padded with zero rows
// (its outputs through a scratch, the padding's dropped); a single row (decoding) runs alone.
// Columns are split by N alone, into at most kColBlocks blocks of at least kMinBlockCols (a
// block packs only its own columns of the weights), so that a few rows still spread over
// threads. More row blocks cost oneDNN's weight packing once more each (128-row blocks ran 7%
// slower than the whole product on one thread, 256-row ones 2%). x is rounded to bf16 once, in
// the same parallel region, before the blocks.
constexpr int64_t kBlockRows = 64;
constexpr int64_t kMinBlockCols = 256;
constexpr int64_t kColBlocks = 8;

// oneDNN's name of the ISA its kernels dispatch to on this CPU.
const char* isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "another ISA";
  }
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// y rows [m0, m0 + rows) x columns [n0, n0 + cols) of the (M, N) product through prim, from
// xs, the (M, K) source rounded to bf16, and ws, the block's weights (cols rows of K), both of
// type t: bf16, or their values widened to fp32 where oneDNN has no bf16 product on this CPU
// (a product of two bf16 values is exact in fp32: the same sums, in fp32's kernels).
void run_block(const dnnl::matmul& prim, const dnnl::engine& engine, dnnl::stream& stream,
               void* scratch, size_t scratch_bytes, const void* xs, const void* ws, dt t,
               const float* bias, float* y, int64_t m0, int64_t rows, int64_t n0, int64_t cols,
               int64_t N, int64_t K) {
  const size_t es = t == dt::bf16 ? sizeof(uint16_t) : sizeof(float);
  dnnl::memory src(x_desc(rows, K, t), engine,
                   const_cast<char*>(static_cast<const char*>(xs) + size_t(m0 * K) * es));
  dnnl::memory wei(w_desc(cols, K, t), engine, const_cast<void*>(ws));
  dnnl::memory dst(y_desc(rows, cols, N), engine, y + m0 * N + n0);
  dnnl::memory scr(dnnl::memory::desc({int64_t(scratch_bytes)}, dt::u8,
                                      dnnl::memory::format_tag::a),
                   engine, scratch);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src},
                                             {DNNL_ARG_WEIGHTS, wei},
                                             {DNNL_ARG_DST, dst},
                                             {DNNL_ARG_SCRATCHPAD, scr}};
  if (bias)
    args.emplace(DNNL_ARG_BIAS,
                 dnnl::memory(bias_desc(cols), engine, const_cast<float*>(bias + n0)));
  prim.execute(stream, args);
  stream.wait();
}

}  // namespace

struct Matmul::Impl {
  // M, N, K, has_bias, dtype, threads the primitive was made for (1: a block's), y's row stride
  using Key = std::tuple<int64_t, int64_t, int64_t, bool, int, int, int64_t>;
  int threads;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mu;  // guards everything below
  std::map<Key, dnnl::matmul> cache;
  std::unique_ptr<void, FreeDeleter> scratch;
  size_t scratch_bytes = 0;
  // Per thread of a blocked product: a stream and the scratchpad.
  struct BlockBuffers {
    dnnl::stream stream;
    std::unique_ptr<void, FreeDeleter> scratch;
    size_t scratch_bytes = 0;
    std::vector<float> pad_x, pad_y;  // the padded last row block's source and outputs
  };
  std::vector<float> wide;  // bf16 weights widened to fp32, once a product (no bf16 kernel)
  int bf16_native = -1;  // whether oneDNN has a bf16 product on this CPU (-1: not asked yet)
  std::unique_ptr<void, FreeDeleter> xbf;  // the source rounded to bf16
  size_t xbf_bytes = 0;
  std::vector<BlockBuffers> blocks;
  size_t block_scratch_bytes = 0;  // the most any block primitive asks for

  explicit Impl(int n) : threads(n) {
    const dnnl_version_t* v = dnnl_version();
    ZOF_CHECK(v->cpu_runtime == DNNL_RUNTIME_OMP,
              "the oneDNN library loaded at run time was not built with OpenMP (cpu_runtime " +
                  std::to_string(v->cpu_runtime) +
                  "); install the OpenMP build (Debian: libdnnl2) that zof was compiled against");
    scratch.reset(aligned_host_alloc(64));
    scratch_bytes = 64;
  }

  // The primitive for (M, N, K) on `nthr` threads: the backend's (its scratchpad fits in
  // `scratch`), or 1 for a block (in block_scratch_bytes). The caller has set OpenMP's thread
  // count to the backend's.
  const dnnl::matmul& primitive(int64_t M, int64_t N, int64_t K, bool has_bias, DType wt,
                                int nthr, int64_t ldy = 0) {
    if (!ldy) ldy = N;
    Key key{M, N, K, has_bias, (int)wt, nthr, ldy};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    // Training sees a handful of shapes; prompts of every length during generation would grow
    // the cache without end, so it starts over past a bound.
    if (cache.size() >= kMaxCached) cache.clear();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // Never let ONEDNN_DEFAULT_FPMATH_MODE trade fp32 for bf16 behind the tests' back.
    attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
    const dt t = of(wt);  // the source is rounded to the weights' type
    dnnl::matmul::desc desc =
        has_bias ? dnnl::matmul::desc(x_desc(M, K, t), w_desc(N, K, t), bias_desc(N),
                                      y_desc(M, N, ldy))
                 : dnnl::matmul::desc(x_desc(M, K, t), w_desc(N, K, t), y_desc(M, N, ldy));
    dnnl::matmul::primitive_desc pd;
    try {
      // oneDNN sizes a primitive's work split from omp_get_max_threads() when it is made.
      OmpThreads team(nthr);
      pd = dnnl::matmul::primitive_desc(desc, attr, engine);
    } catch (const dnnl::error&) {
      ZOF_CHECK(wt == DType::F32, "this CPU has no bf16 matrix product (oneDNN found no "
                                  "implementation for " + std::string(isa_name()) +
                                  "); use --dtype fp32");
      throw;
    }
    size_t need = pd.scratchpad_desc().get_size();
    if (nthr == 1) block_scratch_bytes = std::max(block_scratch_bytes, need);
    if (nthr == threads && need > scratch_bytes) {
      scratch.reset(aligned_host_alloc(need));
      scratch_bytes = need;
    }
    return cache.emplace(key, dnnl::matmul(pd)).first->second;
  }

  // Whether oneDNN makes a bf16 product on this CPU (asked once; AVX2 machines have none: their
  // bf16 products run on the values widened to fp32, see run_block).
  bool has_bf16() {
    if (bf16_native < 0) {
      dnnl::primitive_attr attr;
      attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
      try {
        OmpThreads team(1);
        dnnl::matmul::primitive_desc pd(
            dnnl::matmul::desc(x_desc(16, 16, dt::bf16), w_desc(16, 16, dt::bf16), y_desc(16, 16)),
            attr, engine);
        bf16_native = 1;
      } catch (const dnnl::error&) {
        bf16_native = 0;
      }
    }
    return bf16_native == 1;
  }

  // Buffers for `n` threads, each with room for block_scratch_bytes of scratchpad, and the
  // source's M x K bf16 values (of `elem` bytes each: bf16, or widened to fp32).
  void size_blocks(int n, int64_t M, int64_t K, size_t elem = sizeof(uint16_t)) {
    if (int(blocks.size()) < n) blocks.resize(size_t(n));
    for (int i = 0; i < n; ++i) {
      BlockBuffers& b = blocks[size_t(i)];
      if (!b.stream) b.stream = dnnl::stream(engine);
      if (b.scratch_bytes < std::max<size_t>(block_scratch_bytes, 64)) {
        b.scratch_bytes = std::max<size_t>(block_scratch_bytes, 64);
        b.scratch.reset(aligned_host_alloc(b.scratch_bytes));
      }
    }
    const size_t xb = size_t(M * K) * elem;
    if (xbf_bytes < xb) {
      xbf.reset(aligned_host_alloc(xb));
      xbf_bytes = xb;
    }
  }

  // The bf16 product in blocks that depend on (M, N) alone (see kBlockRows), handed out one at
  // a time over the backend's threads; the caller holds mu and has set OpenMP's thread count.
  void run_blocks(const float* x, const void* w, DType wt, const float* bias, float* y,
                  int64_t M, int64_t N, int64_t K) {
    // Rows in blocks of exactly R (a single row alone), the last padded; columns by N alone.
    const int64_t R = M == 1 ? 1 : kBlockRows;
    const int64_t n_rows = (M + R - 1) / R, row_tail = M - (n_rows - 1) * R;
    const int64_t n_cols = std::max<int64_t>(1, std::min(kColBlocks, N / kMinBlockCols));
    const int64_t cols = (N + n_cols - 1) / n_cols, col_tail = N - (n_cols - 1) * cols;
    const bool has_bias = bias != nullptr;
    // fp32 weights: the blocks read x and w in place. bf16: x rounded once; without a bf16
    // product on this CPU, the same blocks in fp32 on the bf16 values widened.
    const bool f32 = wt == DType::F32;
    const bool native = !f32 && has_bf16();
    const DType pt = native ? DType::BF16 : DType::F32;
    const size_t es = native ? sizeof(uint16_t) : sizeof(float);
    // Handles, not references: making one may start the cache over. [col tail]
    dnnl::matmul prim[2];
    for (int ct = 0; ct < 2; ++ct) prim[ct] = primitive(R, ct ? col_tail : cols, K, has_bias, pt, 1, N);
    size_blocks(threads, M, K, f32 ? 0 : es);
    const bool padded = row_tail < R;
    if (padded)
      for (int t = 0; t < threads; ++t) {
        BlockBuffers& b = blocks[size_t(t)];
        b.pad_x.assign(size_t((R * K * es + sizeof(float) - 1) / sizeof(float)), 0.f);
        b.pad_y.resize(size_t(R * N));
      }
    uint16_t* xb = static_cast<uint16_t*>(xbf.get());
    float* xw = static_cast<float*>(xbf.get());
    const uint16_t* wb = static_cast<const uint16_t*>(w);
    const int64_t n_blocks = n_rows * n_cols, n_x = M * K;
    if (!native && !f32) wide.resize(size_t(N * K));
    std::exception_ptr error;
#pragma omp parallel num_threads(threads)
    {
      if (native) {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n_x; ++i) xb[i] = f32_to_bf16(x[i]);
      } else if (!f32) {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n_x; ++i) xw[i] = bf16_to_f32(f32_to_bf16(x[i]));
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N * K; ++i) wide[size_t(i)] = bf16_to_f32(wb[i]);
      }
      const char* xs = f32 ? (const char*)x : native ? (const char*)xb : (const char*)xw;
#pragma omp for schedule(dynamic, 1)
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        BlockBuffers& b = blocks[size_t(omp_get_thread_num())];
        const int64_t rb = blk / n_cols, cb = blk % n_cols;
        const bool last_col = cb == n_cols - 1;
        const int64_t c = last_col ? col_tail : cols;
        try {
          const void* ws = f32       ? (const void*)(static_cast<const float*>(w) + cb * cols * K)
                           : native ? (const void*)(wb + cb * cols * K)
                                    : (const void*)(wide.data() + cb * cols * K);
          if (!padded || rb < n_rows - 1) {
            run_block(prim[last_col], engine, b.stream, b.scratch.get(), b.scratch_bytes, xs, ws,
                      of(pt), bias, y, rb * R, R, cb * cols, c, N, K);
          } else {  // the last rows and zero rows after them; only theirs kept
            char* px = reinterpret_cast<char*>(b.pad_x.data());
            std::memcpy(px, xs + size_t(rb * R * K) * es, size_t(row_tail * K) * es);
            std::memset(px + size_t(row_tail * K) * es, 0, size_t((R - row_tail) * K) * es);
            run_block(prim[last_col], engine, b.stream, b.scratch.get(), b.scratch_bytes, px, ws,
                      of(pt), bias, b.pad_y.data(), 0, R, cb * cols, c, N, K);
            for (int64_t r = 0; r < row_tail; ++r)
              std::memcpy(y + (rb * R + r) * N + cb * cols, b.pad_y.data() + r * N + cb * cols,
                          size_t(c) * sizeof(float));
          }
        } catch (...) {
#pragma omp critical(zof_matmul_error)
          if (!error) error = std::current_exception();
        }
      }
    }
    if (error) std::rethrow_exception(error);
  }
};

Matmul::Matmul(int threads) : impl_(std::make_unique<Impl>(threads)) {}
Matmul::~Matmul() = default;

void Matmul::run(const float* x, const void* w, DType wt, const float* bias, float* y,
                 int64_t M, int64_t N, int64_t K) {
  ZOF_CHECK(wt == DType::F32 || wt == DType::BF16,
            std::string("the CPU matrix product takes fp32 or bf16 weights, not ") + dtype_name(wt));
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {  // an empty sum: y is the bias, broadcast
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] = bias ? bias[n] : 0.0f;
    return;
  }
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mu);
  OmpThreads threads(im.threads);
  // Every product in blocks chosen from its shape alone (see kBlockRows), each on one thread:
  // oneDNN's own threads may split K (its AVX2 kernels did at M=7, K=1000), which would make the
  // sums depend on the thread count.
  im.run_blocks(x, w, wt, bias, y, M, N, K);
}

Backend::ComputeInfo Matmul::compute_info() {
  Backend::ComputeInfo ci;
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  // AMX tiles run bf16 products several times faster than fp32. avx512_core_bf16's dot
  // products differ from machine to machine of CI's kind: 2.0x fp32's GEMM rate on one, slower
  // than fp32 on another (bench/RESULTS.md), so the unit does not decide them: finetune's
  // --dtype auto times both at the model's shapes (resolve_compute_dtype's probe, runtime.h).
  ci.bf16_fast = isa == dnnl::cpu_isa::avx512_core_amx;
  ci.isa = std::string("oneDNN ") + isa_name();
  return ci;
}

}  // namespace zof::cpu
