// cpu::Matmul: y = x w^T + bias through oneDNN's matmul primitive in strict fp32. The nn.Linear
// weight (N,K) row-major is described to oneDNN as a (K,N) matrix with strides (1,K), so it is
// read in place; primitives are cached per (M,N,K,bias) since creating one JIT-compiles kernels.
// Every product runs as blocks of rows and columns in one parallel region of zof's own, each
// block multiplied by one thread (see run_blocks), so no sum depends on the thread count; a
// bf16 product's rows are rounded to bf16 first, once, and on AVX-512 and AMX its weights laid
// out once in the kernels' own layout. On a CPU
// where oneDNN has no bf16 product (AVX2), the blocks run in fp32 on the bf16 values widened:
// the same bf16 inputs and fp32 sums, slower than fp32 (--dtype auto's probe then picks fp32).
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>
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
// Columns are split by N alone, into at most kColBlocks blocks of at least kMinBlockCols, so
// that a few rows still spread over threads (decoding's single rows, and everywhere on AVX2).
// Where the kernels are oneDNN's brgemm (AVX-512, AMX), zof lays each column block's weights
// out once per product in the layout the kernels read (lay_out_strip), which they would
// otherwise copy into once per row block; their blocks write dense rows (a strided destination
// makes oneDNN fall back to its plain gemm), through a buffer when a block is not whole rows of
// y, so they split N into blocks of at least kMinLaidOutCols: on AMX, SmolLM2's RTE step ran
// 9-14% faster with its 1536-wide products whole than in 6 column blocks (bench/RESULTS.md),
// though a product of 64 rows or fewer and N under 4096 then runs on one thread. x is rounded
// to bf16 once, in the same parallel region, before the blocks.
constexpr int64_t kBlockRows = 64;
constexpr int64_t kMinBlockCols = 256;
constexpr int64_t kMinLaidOutCols = 2048;
// A product's weights are laid out into a buffer the backend keeps: up to this size (in bf16,
// LLaMA-7B's MLP matrices and SmolLM2's head; Matmul's constructor takes another bound), so
// that a model larger than RAM (the disk tier) does not keep a second copy of its largest
// matrices. Larger weights go to the same dense blocks plain, and the kernels copy them into
// the same layout (Ops.CpuMatmulLaidOutWeightsGiveThePlainWeightsBits).
constexpr size_t kMaxLaidOutBytes = size_t(128) << 20;
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

// One block: `rows` rows of the product from xs (rows x K, of type t: bf16, or bf16 values
// widened to fp32 where oneDNN has no bf16 product on this CPU: a product of two bf16 values is
// exact in fp32, so the same sums in fp32's kernels) by the block's `cols` columns of weights
// ws, laid out as wd, plus bias (the block's own), into dst, rows of `cols` floats `ld` apart.
void run_block(const dnnl::matmul& prim, const dnnl::memory::desc& wd, const dnnl::engine& engine,
               dnnl::stream& stream, void* scratch, size_t scratch_bytes, const void* xs,
               const void* ws, dt t, const float* bias, float* dst, int64_t ld, int64_t rows,
               int64_t cols, int64_t K) {
  dnnl::memory src(x_desc(rows, K, t), engine, const_cast<void*>(xs));
  dnnl::memory wei(wd, engine, const_cast<void*>(ws));
  dnnl::memory out(y_desc(rows, cols, ld), engine, dst);
  dnnl::memory scr(dnnl::memory::desc({int64_t(scratch_bytes)}, dt::u8,
                                      dnnl::memory::format_tag::a),
                   engine, scratch);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src},
                                             {DNNL_ARG_WEIGHTS, wei},
                                             {DNNL_ARG_DST, out},
                                             {DNNL_ARG_SCRATCHPAD, scr}};
  if (bias)
    args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_desc(cols), engine, const_cast<float*>(bias)));
  prim.execute(stream, args);
  stream.wait();
}

}  // namespace

// Strip `strip` (columns [64 strip, 64 strip + 64)) of a block's weights w (`cols` rows of K
// values of type t, back to back) laid out as oneDNN's brgemm kernels read them, for a (K, cols)
// matrix: bf16 as BA16a64b2a, fp32 as BA16a64b. A strip is ceil(K / D) blocks of D values of K
// (D = 32 for bf16, 16 for fp32); a block holds, for each pair of K (bf16) or each K (fp32),
// the 64 columns' values side by side (a bf16 pair as one 32-bit unit, the even K first), past
// K and past the last column zeros. So a block is a 64 x 16 transpose of 32-bit units, four
// 16 x 16 transposes in AVX-512 registers. tests/unit/test_ops.cpp holds both versions to
// oneDNN's own reorder (Ops.CpuMatmulLaysOutWeightsAsOneDnnReorders).
// (GCC 12 warns of its own _mm512_undefined_epi32 inside the unpack intrinsics.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void lay_out_strip(const void* w, DType t, int64_t cols, int64_t K, int64_t strip, void* out,
                   bool portable) {
  const bool pairs = t == DType::BF16;
  const int64_t D = pairs ? 32 : 16, n_k = (K + D - 1) / D;
#if defined(__AVX512F__) && defined(__AVX512BW__)
  constexpr bool kVector = true;
#else
  constexpr bool kVector = false;
#endif
  for (int64_t b = 0; b < n_k; ++b) {
    uint32_t* dst = static_cast<uint32_t*>(out) + b * 1024;
    const int64_t k0 = b * D, kn = std::min(D, K - k0);  // values of K in this block
#if defined(__AVX512F__) && defined(__AVX512BW__)
    for (int g = 0; kVector && !portable && g < 4; ++g) {
      __m512i r[16], u[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t n = strip * 64 + g * 16 + i;
        if (n >= cols)
          r[i] = _mm512_setzero_si512();
        else if (pairs)
          r[i] = _mm512_maskz_loadu_epi16(kn == 32 ? ~__mmask32(0) : (__mmask32(1) << kn) - 1,
                                          static_cast<const uint16_t*>(w) + n * K + k0);
        else
          r[i] = _mm512_maskz_loadu_epi32(kn == 16 ? __mmask16(0xffff) : (__mmask16(1) << kn) - 1,
                                          static_cast<const float*>(w) + n * K + k0);
      }
      // 16 x 16 32-bit units transposed: r[p] becomes unit p of the 16 columns.
      for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(u[i], u[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(u[i], u[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(u[i + 1], u[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(u[i + 1], u[i + 3]);
      }
      for (int i = 0; i < 4; ++i) {
        u[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        u[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        u[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        u[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
      }
      for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_i32x4(u[i], u[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(u[i], u[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(u[i + 4], u[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(u[i + 4], u[i + 12], 0xdd);
      }
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(dst + p * 64 + g * 16, r[p]);
    }
#endif
    if (kVector && !portable) continue;
    for (int64_t p = 0; p < 16; ++p)
      for (int64_t i = 0; i < 64; ++i) {
        const int64_t n = strip * 64 + i;
        uint32_t v = 0;
        if (n < cols && pairs) {
          const uint16_t* row = static_cast<const uint16_t*>(w) + n * K + k0;
          v = (2 * p < kn ? row[2 * p] : 0u) | (2 * p + 1 < kn ? uint32_t(row[2 * p + 1]) << 16 : 0u);
        } else if (n < cols && p < kn) {
          std::memcpy(&v, static_cast<const float*>(w) + n * K + k0 + p, sizeof v);
        }
        dst[p * 64 + i] = v;
      }
  }
}
#pragma GCC diagnostic pop

struct Matmul::Impl {
  // M, N, K, has_bias, dtype, threads the primitive was made for (1: a block's), y's row
  // stride (dense_block's: -1 laying its weights out was asked for, -2 not)
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
  std::unique_ptr<void, FreeDeleter> laid_w;  // a product's weights in its blocks' layout
  size_t laid_bytes = 0;
  std::vector<BlockBuffers> blocks;
  size_t block_scratch_bytes = 0;  // the most any block primitive asks for

  size_t max_laid_out_bytes;
  Impl(int n, size_t max_laid) : threads(n), max_laid_out_bytes(max_laid) {
    const dnnl_version_t* v = dnnl_version();
    ZOF_CHECK(v->cpu_runtime == DNNL_RUNTIME_OMP,
              "the oneDNN library loaded at run time was not built with OpenMP (cpu_runtime " +
                  std::to_string(v->cpu_runtime) +
                  "); install the OpenMP build (Debian: libdnnl2) that zof was compiled against");
    scratch.reset(aligned_host_alloc(64));
    scratch_bytes = 64;
  }

  // The primitive for (M, N, K) on `nthr` threads: the backend's (its scratchpad fits in
  // `scratch`), or 1 for a block (in block_scratch_bytes), with plain (N, K) weights and y's
  // rows `ldy` apart (0: N). The caller has set OpenMP's thread count to the backend's.
  const dnnl::matmul& primitive(int64_t M, int64_t N, int64_t K, bool has_bias, DType wt,
                                int nthr, int64_t ldy = 0) {
    if (!ldy) ldy = N;
    Key key{M, N, K, has_bias, (int)wt, nthr, ldy};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    // Training sees a handful of shapes; prompts of every length during generation would grow
    // the cache without end, so it starts over past a bound.
    if (cache.size() >= kMaxCached) {
      cache.clear();
      laid_blocks.clear();
    }
    dnnl::matmul::primitive_desc pd = make_pd(M, N, K, has_bias, wt, w_desc(N, K, of(wt)), ldy, nthr);
    size_t need = pd.scratchpad_desc().get_size();
    if (nthr == 1) block_scratch_bytes = std::max(block_scratch_bytes, need);
    if (nthr == threads && need > scratch_bytes) {
      scratch.reset(aligned_host_alloc(need));
      scratch_bytes = need;
    }
    return cache.emplace(key, dnnl::matmul(pd)).first->second;
  }

  dnnl::matmul::primitive_desc make_pd(int64_t M, int64_t N, int64_t K, bool has_bias, DType wt,
                                       const dnnl::memory::desc& wd, int64_t ldy, int nthr) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    // Never let ONEDNN_DEFAULT_FPMATH_MODE trade fp32 for bf16 behind the tests' back.
    attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
    const dt t = of(wt);  // the source is rounded to the weights' type
    const dnnl::matmul::desc desc =
        has_bias ? dnnl::matmul::desc(x_desc(M, K, t), wd, bias_desc(N), y_desc(M, N, ldy))
                 : dnnl::matmul::desc(x_desc(M, K, t), wd, y_desc(M, N, ldy));
    try {
      // oneDNN sizes a primitive's work split from omp_get_max_threads() when it is made.
      OmpThreads team(nthr);
      return dnnl::matmul::primitive_desc(desc, attr, engine);
    } catch (const dnnl::error&) {
      ZOF_CHECK(wt == DType::F32, "this CPU has no bf16 matrix product (oneDNN found no "
                                  "implementation for " + std::string(isa_name()) +
                                  "); use --dtype fp32");
      throw;
    }
  }

  // The layout zof lays a product's weights out in for its blocks' kernels, for weights of type
  // t, where oneDNN picks one zof knows (lay_out_strip) for a block of kBlockRows rows writing
  // dense rows: its brgemm kernels (AVX-512, AMX). Handed plain weights, they copy them into that
  // layout themselves every time they run, once per row block, which on AMX took as long as the
  // multiplying; laid out once per product, a column block's weights serve all its row blocks.
  // A format_tag::undef answer: oneDNN keeps plain weights (its gemm-based AVX2 kernels) or wants
  // a layout zof does not know; the blocks then get the plain weights. Asked once per type: what
  // oneDNN picks follows the ISA (checked on each block's primitive, dense_block).
  dnnl::memory::format_tag layout(DType wt) {
    const auto tag = wt == DType::BF16 ? dnnl::memory::format_tag::BA16a64b2a
                                       : dnnl::memory::format_tag::BA16a64b;
    int& known = wt == DType::BF16 ? layout_bf16 : layout_f32;
    if (known < 0) {
      const int64_t n = 128;
      dnnl::matmul::primitive_desc pd =
          make_pd(kBlockRows, n, n, false, wt,
                  dnnl::memory::desc({n, n}, of(wt), dnnl::memory::format_tag::any), n, 1);
      known = pd.weights_desc() == dnnl::memory::desc({n, n}, of(wt), tag);
    }
    return known ? tag : dnnl::memory::format_tag::undef;
  }
  int layout_bf16 = -1, layout_f32 = -1;

  // A block's primitive writing rows of `cols` outputs back to back (oneDNN's brgemm kernels
  // take a dense destination only: given rows with a stride, it falls back to its plain gemm, on
  // AMX at half the rate), for weights laid out as layout(wt) where `lay` and oneDNN picks that
  // layout for this shape too, else for the plain weights (whose kernels copy them into that
  // layout themselves). *laid says which.
  dnnl::matmul dense_block(int64_t cols, int64_t K, bool has_bias, DType wt, bool lay,
                           bool* laid) {
    Key key{kBlockRows, cols, K, has_bias, (int)wt, 1, lay ? -1 : -2};
    auto it = cache.find(key);
    if (it == cache.end()) {
      if (cache.size() >= kMaxCached) {
        cache.clear();
        laid_blocks.clear();
      }
      const dnnl::memory::desc wd({K, cols}, of(wt), layout(wt));
      dnnl::matmul::primitive_desc pd;
      if (lay)
        pd = make_pd(kBlockRows, cols, K, has_bias, wt,
                     dnnl::memory::desc({K, cols}, of(wt), dnnl::memory::format_tag::any), cols, 1);
      const bool l = lay && pd.weights_desc() == wd;
      if (!l) pd = make_pd(kBlockRows, cols, K, has_bias, wt, w_desc(cols, K, of(wt)), cols, 1);
      block_scratch_bytes = std::max(block_scratch_bytes, pd.scratchpad_desc().get_size());
      it = cache.emplace(key, dnnl::matmul(pd)).first;
      if (l) laid_blocks.insert(key);
    }
    *laid = laid_blocks.count(key) > 0;
    return it->second;
  }
  std::set<Key> laid_blocks;  // the keys of dense_block's primitives on laid-out weights

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

  // The product in blocks that depend on (M, N) alone (see kBlockRows), handed out one at a
  // time over the backend's threads; the caller holds mu and has set OpenMP's thread count.
  void run_blocks(const float* x, const void* w, DType wt, const float* bias, float* y,
                  int64_t M, int64_t N, int64_t K) {
    // fp32 weights: the blocks read x and w in place. bf16: x rounded once; without a bf16
    // product on this CPU, the same blocks in fp32 on the bf16 values widened.
    const bool f32 = wt == DType::F32;
    const bool native = !f32 && has_bf16();
    const DType pt = native ? DType::BF16 : DType::F32;
    const size_t es = native ? sizeof(uint16_t) : sizeof(float);
    // Rows in blocks of exactly R (a single row alone), the last padded. Columns by N alone:
    // blocks of laid-out weights write their rows dense, through a buffer where they are not
    // all of y's, so they split N less.
    const int64_t R = M == 1 ? 1 : kBlockRows;
    // Dense blocks where the kernels are brgemm; their weights laid out unless too large to
    // keep a copy of (then the kernels copy them into the same layout themselves).
    const dnnl::memory::format_tag tag = R > 1 ? layout(pt) : dnnl::memory::format_tag::undef;
    const bool laid = tag != dnnl::memory::format_tag::undef;
    const bool lay = laid && size_t(N * K) * es <= max_laid_out_bytes;
    const int64_t n_rows = (M + R - 1) / R, row_tail = M - (n_rows - 1) * R;
    const int64_t n_cols =
        std::max<int64_t>(1, std::min(kColBlocks, N / (laid ? kMinLaidOutCols : kMinBlockCols)));
    const int64_t cols = (N + n_cols - 1) / n_cols, col_tail = N - (n_cols - 1) * cols;
    const bool has_bias = bias != nullptr;
    // Handles, not references: making one may start the cache over. [col tail]
    dnnl::matmul prim[2];
    bool laid_ct[2] = {false, false};  // whether a block's weights are laid out
    for (int ct = 0; ct < 2; ++ct) {
      const int64_t c = ct ? col_tail : cols;
      prim[ct] = laid ? dense_block(c, K, has_bias, pt, lay, &laid_ct[ct])
                      : primitive(R, c, K, has_bias, pt, 1, N);
    }
    // The laid-out weights: column block cb's at cb * lay_stride, in 64-column strips of
    // strip_bytes (a K-deep strip, K padded to the layout's K block of D values).
    const int64_t D = pt == DType::BF16 ? 32 : 16;
    const size_t strip_bytes = laid ? size_t((K + D - 1) / D * D * 64) * es : 0;
    const int64_t strips = (cols + 63) / 64, tail_strips = (col_tail + 63) / 64;
    const size_t lay_stride = size_t(strips) * strip_bytes;
    const int64_t full_strips = laid_ct[0] ? strips * (n_cols - 1) : 0;
    const int64_t n_strips = full_strips + (laid_ct[1] ? tail_strips : 0);
    const size_t need = lay_stride * size_t(n_cols - 1) + size_t(tail_strips) * strip_bytes;
    if (n_strips && laid_bytes < need) {
      laid_w.reset(aligned_host_alloc(need));
      laid_bytes = need;
    }
    char* lw = static_cast<char*>(laid_w.get());
    size_blocks(threads, M, K, f32 ? 0 : es);
    const bool padded = row_tail < R;
    const bool buffered = laid && n_cols > 1;  // blocks' outputs dense in pad_y, then into y
    for (int t = 0; t < threads; ++t) {
      BlockBuffers& b = blocks[size_t(t)];
      if (padded) b.pad_x.resize(size_t((R * K * es + sizeof(float) - 1) / sizeof(float)));
      if (padded || buffered) b.pad_y.resize(size_t(R * (laid ? cols : N)));
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
      auto plain_w = [&](int64_t cb) -> const void* {
        return f32      ? (const void*)(static_cast<const float*>(w) + cb * cols * K)
               : native ? (const void*)(wb + cb * cols * K)
                        : (const void*)(wide.data() + cb * cols * K);
      };
      // The weights laid out, 64-column strips over the threads (a pass bound by memory).
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n_strips; ++i) {
        const int64_t cb = i < full_strips ? i / strips : n_cols - 1;
        const int64_t st = i < full_strips ? i % strips : i - full_strips;
        lay_out_strip(plain_w(cb), pt, cb == n_cols - 1 ? col_tail : cols, K, st,
                      lw + size_t(cb) * lay_stride + size_t(st) * strip_bytes);
      }
      // A column block's row blocks one after another, its weights in cache for the next.
#pragma omp for schedule(dynamic, 1)
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        BlockBuffers& b = blocks[size_t(omp_get_thread_num())];
        const int64_t cb = blk / n_rows, rb = blk % n_rows;
        const bool last_col = cb == n_cols - 1, tail = padded && rb == n_rows - 1;
        const int64_t c = last_col ? col_tail : cols, rows = tail ? row_tail : R;
        try {
          const bool l = laid_ct[last_col];
          const void* ws = l ? (const void*)(lw + size_t(cb) * lay_stride) : plain_w(cb);
          const dnnl::memory::desc wd =
              l ? dnnl::memory::desc({K, c}, of(pt), tag) : w_desc(c, K, of(pt));
          const char* src = xs + size_t(rb * R * K) * es;
          if (tail) {  // the last rows and zero rows after them; only theirs kept
            char* px = reinterpret_cast<char*>(b.pad_x.data());
            std::memcpy(px, src, size_t(row_tail * K) * es);
            std::memset(px + size_t(row_tail * K) * es, 0, size_t((R - row_tail) * K) * es);
            src = px;
          }
          // Plain weights write y's rows N apart, laid-out ones dense rows of c.
          const int64_t ld = laid ? c : N;
          float* out = y + rb * R * N + cb * cols;
          const bool direct = !tail && (!laid || n_cols == 1);
          float* dst = direct ? out : b.pad_y.data();
          run_block(prim[last_col], wd, engine, b.stream, b.scratch.get(), b.scratch_bytes, src,
                    ws, of(pt), bias ? bias + cb * cols : nullptr, dst, ld, R, c, K);
          if (!direct)
            for (int64_t r = 0; r < rows; ++r)
              std::memcpy(out + r * N, dst + r * ld, size_t(c) * sizeof(float));
        } catch (...) {
#pragma omp critical(zof_matmul_error)
          if (!error) error = std::current_exception();
        }
      }
    }
    if (error) std::rethrow_exception(error);
  }
};

Matmul::Matmul(int threads, size_t max_laid_out_bytes)
    : impl_(std::make_unique<Impl>(threads, max_laid_out_bytes)) {}
Matmul::Matmul(int threads) : Matmul(threads, kMaxLaidOutBytes) {}
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
