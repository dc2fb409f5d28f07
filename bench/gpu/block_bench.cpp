// Forward throughput of one transformer block on the GPU, random weights: LLaMA-7B-shaped
// (RMSNorm, RoPE, MHA, SwiGLU) and OPT-13B-shaped (LayerNorm, biases, ReLU) blocks at several
// token counts, through src's own layer, zof::Forward::layer: the block every walk of the
// trainer runs (the ZO step's dual walk, evaluation, generation), its weights resident on the
// device. bf16 (as zof finetune --dtype bf16): the products read bf16 copies of the matrices, as the ZO pass
// writes its perturbed copies, on the tensor cores (cuBLASLt), and attention runs the mma flash
// kernel on bf16-rounded inputs; activations, norms and every sum stay fp32. fp32: strict fp32
// GEMMs (TF32 off) and the generic attention kernel. Prints TFLOP/s and MFU against the GPU's
// dense bf16 peak, the time in the layer's GEMMs and in its attention (the same Backend calls
// the layer makes, timed alone), and the anchors: pinned host<->device bandwidth, the product's
// bf16 GEMM (Backend::matmul: fp32 x rounded on the stream, fp32 y) and cuBLASLt's raw bf16 GEMM
// (bf16 in and out: the limit) at LLM shapes. Markdown on stdout.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zof/config.h"
#include "cuda/cuda_backend.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "util/philox.h"
#include "zof/streaming.h"

#include "cuda/matmul.cuh"

namespace {

#define BENCH_CUDA(expr)                                                                 \
  do {                                                                                   \
    cudaError_t e_ = (expr);                                                             \
    if (e_ != cudaSuccess) ZOF_ABORT(cudaGetErrorString(e_));                            \
  } while (0)

struct Shape {
  std::string name;
  int64_t C, H, Hkv, D, I;
  bool llama;  // else OPT: LayerNorm, biases, ReLU, no RoPE
};

const Shape kLlama7B{"LLaMA-7B block", 4096, 32, 32, 128, 11008, true};
const Shape kOpt13B{"OPT-13B block", 5120, 40, 40, 128, 20480, false};

// Model FLOPs of one block's forward over T tokens of one sequence: 2 per multiply-add of the
// linear layers, and causal attention counted as computed (QK^T and PV over T(T+1)/2 pairs).
double gemm_flops(const Shape& s, int64_t T) {
  const double C = s.C, Hq = s.H * s.D, Hk = s.Hkv * s.D, I = s.I;
  const double linear = C * Hq + 2 * C * Hk + Hq * C + (s.llama ? 3 : 2) * C * I;
  return 2.0 * linear * T;
}
double attention_flops(const Shape& s, int64_t T) {
  return 2.0 * 2.0 * double(s.H) * s.D * double(T) * double(T + 1) / 2.0;
}

class Timer {
 public:
  explicit Timer(cudaStream_t s) : s_(s) {
    BENCH_CUDA(cudaEventCreate(&a_));
    BENCH_CUDA(cudaEventCreate(&b_));
  }
  ~Timer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  // Median seconds of f over iters runs (after one warm-up).
  double median(int iters, const std::function<void()>& f) {
    f();
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
      BENCH_CUDA(cudaEventRecord(a_, s_));
      f();
      BENCH_CUDA(cudaEventRecord(b_, s_));
      BENCH_CUDA(cudaEventSynchronize(b_));
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, a_, b_));
      t.push_back(ms * 1e-3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }

 private:
  cudaStream_t s_;
  cudaEvent_t a_, b_;
};

// Device buffers of one backend, freed together.
class Pool {
 public:
  explicit Pool(zof::CudaBackend& be) : be_(be) {}
  ~Pool() {
    be_.synchronize(nullptr);
    for (void* p : ptrs_) be_.free(p);
  }
  template <class T>
  T* get(int64_t n) {
    void* p = be_.alloc(size_t(n) * sizeof(T));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  // n normals * std (fp32), drawn on the device from Philox.
  float* normal_f32(int64_t n, float std, uint32_t tensor) {
    float* p = get<float>(n);
    BENCH_CUDA(cudaMemsetAsync(p, 0, size_t(n) * 4, cudaStream_t(be_.native_stream(nullptr))));
    const zof::ZKey key{777, 0, 0};
    be_.zo_pass(p, n, tensor, 0, nullptr, 0, 0.f, &key, std, p, nullptr);
    return p;
  }
  uint16_t* normal_bf16(int64_t n, float std, uint32_t tensor) {
    float* f = normal_f32(n, std, tensor);
    uint16_t* b = get<uint16_t>(n);
    be_.cast(f, b, zof::DType::BF16, n);
    return b;
  }

 private:
  zof::CudaBackend& be_;
  std::vector<void*> ptrs_;
};

struct BlockTimes {
  double total = 0, gemm = 0, attention = 0;
};

// A one-layer model of the block's shape with random weights (Model::random), its vocabulary
// tiny: only the layer runs. The context is the real models' 2048; the bench's longer sequences
// pass because only Forward::upload checks it and the layer reads no position table.
zof::Model one_layer_model(const Shape& s) {
  nlohmann::json j = {{"vocab_size", 64}, {"hidden_size", s.C}, {"num_hidden_layers", 1},
                      {"num_attention_heads", s.H}, {"max_position_embeddings", 2048},
                      {"bos_token_id", 1}, {"eos_token_id", 2}, {"tie_word_embeddings", false}};
  if (s.llama) {
    j.update({{"model_type", "llama"}, {"intermediate_size", s.I}, {"num_key_value_heads", s.Hkv},
              {"head_dim", s.D}, {"rope_theta", 10000.0}, {"rms_norm_eps", 1e-6},
              {"hidden_act", "silu"}});
  } else {
    ZOF_CHECK(s.Hkv == s.H && s.C == s.H * s.D, s.name + ": OPT has neither GQA nor a head_dim");
    j.update({{"model_type", "opt"}, {"ffn_dim", s.I}, {"do_layer_norm_before", true},
              {"activation_function", "relu"}, {"enable_bias", true}});
  }
  return zof::Model::random(zof::ModelConfig::from_json(j, s.name), 100);
}

// A streaming budget that keeps every block of m resident: at least the streamer's minimum, two
// slots of the largest block, which the one layer outweighs the rest of the model by far.
size_t resident_budget(const zof::Model& m) {
  return std::max(zof::BlockStreamer::all_resident_bytes(m), zof::BlockStreamer::min_bytes(m));
}

// One layer of the block's shape through zof::Forward::layer, its weights resident: compute
// F32 reads them as they are; BF16 reads bf16 copies of the matrix weights (Param::gemm, rounded
// to nearest even once, as the ZO pass writes its perturbed copies) and attends in bf16
// (Forward::set_compute).
class ProductBlock {
 public:
  ProductBlock(zof::CudaBackend& be, const Shape& s, int64_t max_tokens, zof::DType t)
      : be_(be),
        s_(s),
        t_(t),
        model_(one_layer_model(s)),
        weights_(model_, be, resident_budget(model_)),
        fwd_(model_, be, max_tokens) {
    fwd_.set_compute(t);
    weights_.begin_walk({1});
    weights_.acquire(1);  // held for the bench's life: resident, never written
    std::vector<zof::Weight> at(model_.params().size());
    for (int pi : model_.blocks()[1].params) {
      const zof::Param& p = model_.params()[size_t(pi)];
      const float* w = weights_.param(pi).f32();
      if (t == zof::DType::BF16 && p.gemm) {
        void* c = be_.alloc(size_t(p.numel) * 2);
        be_.cast(w, c, zof::DType::BF16, p.numel);
        copies_.push_back(c);
        at[size_t(pi)] = zof::Weight(c, zof::DType::BF16);
      } else {
        at[size_t(pi)] = zof::Weight(w);
      }
    }
    w_ = model_.layer(0, [&](int pi) { return at[size_t(pi)]; });
    be_.synchronize(nullptr);
  }
  ~ProductBlock() {
    be_.synchronize(nullptr);
    for (void* c : copies_) be_.free(c);
    weights_.release(1, false);
  }
  ProductBlock(const ProductBlock&) = delete;
  ProductBlock& operator=(const ProductBlock&) = delete;

  // Median seconds over T tokens of one sequence (no padding: no key mask) of the layer, then of
  // its matrix products alone and its attention alone: the Backend calls the layer makes, on
  // activations of the layer's shapes and dtype.
  BlockTimes time(Timer& timer, int64_t T, int iters) {
    Pool pool(be_);
    const int64_t C = s_.C, Hq = s_.H * s_.D, Hk = s_.Hkv * s_.D, I = s_.I;
    float* h = pool.normal_f32(T * C, 1.0f, 200);
    std::vector<int32_t> pos_h(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) pos_h[size_t(i)] = int32_t(i);
    int32_t* pos = pool.get<int32_t>(T);
    be_.copy_to_device(pos, pos_h.data(), size_t(T) * 4, nullptr);
    float* xn = pool.normal_f32(T * C, 1.0f, 201);
    float* att = pool.normal_f32(T * Hq, 1.0f, 202);
    float* f1 = pool.normal_f32(T * I, 1.0f, 203);
    float* q = pool.normal_f32(T * Hq, 1.0f, 204);
    float* k = pool.normal_f32(T * Hk, 1.0f, 205);
    float* v = pool.normal_f32(T * Hk, 1.0f, 206);
    float *tmp = pool.get<float>(T * C), *f2 = pool.get<float>(T * I);
    auto mm = [&](const float* x, zof::Weight w, zof::Weight b, float* y, int64_t N, int64_t K) {
      be_.matmul(x, w.p, w.dtype, b.f32(), y, T, N, K);
    };
    auto gemms = [&] {
      mm(xn, w_.q_w, w_.q_b, q, Hq, C);
      mm(xn, w_.k_w, w_.k_b, k, Hk, C);
      mm(xn, w_.v_w, w_.v_b, v, Hk, C);
      mm(att, w_.o_w, w_.o_b, tmp, C, Hq);
      mm(xn, w_.fc1_w, w_.fc1_b, f1, I, C);
      if (w_.up_w) mm(xn, w_.up_w, w_.up_b, f2, I, C);
      mm(f1, w_.fc2_w, w_.fc2_b, tmp, C, I);
    };
    BlockTimes r;
    zof::DeviceInputs in;
    in.pos = pos, in.B = 1, in.T = T, in.rows = T;
    r.total = timer.median(iters, [&] { fwd_.layer(0, w_, h, in); });
    r.gemm = timer.median(iters, gemms);
    r.attention = timer.median(iters, [&] {
      be_.attention(q, k, v, att, nullptr, 1, T, T, s_.H, s_.Hkv, s_.D, 0,
                    1.0f / std::sqrt(float(s_.D)), 0, 0.0f, t_);
    });
    return r;
  }

 private:
  zof::CudaBackend& be_;
  Shape s_;
  zof::DType t_;
  zof::Model model_;
  zof::BlockStreamer weights_;
  zof::Forward fwd_;
  std::vector<void*> copies_;
  zof::LayerWeights w_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"block_bench: forward TFLOP/s and MFU of LLaMA-7B / OPT-13B shaped blocks on a GPU"};
  std::string tokens_arg = "2048,8192,16384";
  int iters = 5;
  bool fp32 = true;
  double peak = 0;
  app.add_option("--tokens", tokens_arg, "token counts (one sequence each), comma-separated");
  app.add_option("--iters", iters, "timed runs per measurement (median)");
  app.add_option("--fp32", fp32, "also time the fp32 path (true/false)");
  app.add_option("--peak-tflops", peak, "dense bf16 peak for MFU (default: the device's datasheet value)");
  CLI11_PARSE(app, argc, argv);
  try {
    ZOF_CHECK(zof::cuda_device_count() > 0, "block_bench needs a CUDA device; none is visible");
    const zof::CudaDeviceInfo info = zof::cuda_device_info(0);
    if (peak <= 0) peak = info.bf16_dense_tflops;
    std::vector<int64_t> tokens;
    std::stringstream ss(tokens_arg);
    for (std::string t; std::getline(ss, t, ',');) tokens.push_back(std::stoll(t));
    ZOF_CHECK(!tokens.empty() && *std::min_element(tokens.begin(), tokens.end()) > 0,
              "--tokens: one or more positive token counts, comma-separated");
    auto be = zof::make_cuda_backend(0);
    Timer timer(cudaStream_t(be->native_stream(nullptr)));

    std::printf("GPU: %s (sm_%d%d, %d SMs, %.0f GiB), driver %s; MFU basis: %.1f dense bf16 TFLOP/s\n\n",
                info.name.c_str(), info.cc_major, info.cc_minor, info.sm_count,
                double(info.total_memory) / (1 << 30), info.driver.c_str(), peak);
    std::printf("| block | dtype | tokens | ms | TFLOP/s | MFU | GEMM TFLOP/s | attention TFLOP/s |\n");
    std::printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
    const int64_t max_tokens = *std::max_element(tokens.begin(), tokens.end());
    std::vector<zof::DType> dtypes{zof::DType::BF16};
    if (fp32) dtypes.push_back(zof::DType::F32);
    for (const Shape& s : {kLlama7B, kOpt13B}) {
      for (zof::DType t : dtypes) {
        ProductBlock block(*be, s, max_tokens, t);
        const bool bf = t == zof::DType::BF16;
        for (int64_t T : tokens) {
          const double fg = gemm_flops(s, T), fa = attention_flops(s, T), f = fg + fa;
          // fp32 is slow: half the runs, an odd count (the median is one of them).
          const BlockTimes b = block.time(timer, T, bf ? iters : std::max(1, iters / 2) | 1);
          std::printf("| %s | %s | %lld | %.2f | %.1f | %.1f%% | %.1f | %.1f |\n", s.name.c_str(),
                      bf ? "bf16" : "fp32 (no TF32)", (long long)T, b.total * 1e3,
                      f / b.total / 1e12, 100.0 * f / b.total / 1e12 / peak, fg / b.gemm / 1e12,
                      fa / b.attention / 1e12);
          std::fflush(stdout);
        }
      }
    }

    // Anchors: pinned copies both ways, and cuBLASLt bf16 GEMMs of the blocks' shapes.
    std::printf("\n| anchor | value |\n|---|---:|\n");
    const size_t bytes = size_t(512) << 20;
    void* host = be->alloc_host_pinned(bytes);
    void* dev = be->alloc(bytes);
    std::memset(host, 1, bytes);
    const double h2d = timer.median(iters, [&] { be->copy_to_device(dev, host, bytes, nullptr); });
    const double d2h = timer.median(iters, [&] { be->copy_to_host(host, dev, bytes, nullptr); });
    std::printf("| pinned H2D, 512 MiB | %.1f GB/s |\n", bytes / h2d / 1e9);
    std::printf("| pinned D2H, 512 MiB | %.1f GB/s |\n", bytes / d2h / 1e9);
    be->free(dev);
    be->free_host_pinned(host);
    struct Gemm {
      int64_t M, N, K;
    };
    // The product's bf16 GEMM (Backend::matmul: x fp32, rounded to bf16 on the stream, bf16
    // weights, y fp32) beside cuBLASLt's own at the limit (x, w and y bf16), same shapes.
    zof::cuda::Matmul raw;
    void* workspace = be->alloc(zof::cuda::Matmul::kWorkspaceBytes);
    const cudaStream_t stream = cudaStream_t(be->native_stream(nullptr));
    for (Gemm g : {Gemm{8192, 4096, 4096}, Gemm{8192, 11008, 4096}, Gemm{8192, 4096, 11008},
                   Gemm{8192, 5120, 5120}, Gemm{8192, 20480, 5120}, Gemm{8192, 5120, 20480},
                   Gemm{16384, 8192, 8192}}) {
      Pool pool(*be);
      float* x = pool.normal_f32(g.M * g.K, 1.0f, 1);
      uint16_t* x16 = pool.get<uint16_t>(g.M * g.K);
      be->cast(x, x16, zof::DType::BF16, g.M * g.K);
      uint16_t* w = pool.normal_bf16(g.N * g.K, 0.02f, 2);
      float* y = pool.get<float>(g.M * g.N);
      uint16_t* y16 = pool.get<uint16_t>(g.M * g.N);
      const double tp = timer.median(
          iters, [&] { be->matmul(x, w, zof::DType::BF16, nullptr, y, g.M, g.N, g.K); });
      const double tr = timer.median(iters, [&] {
        raw.run(zof::cuda::GemmType::BF16, x16, w, nullptr, y16, g.M, g.N, g.K, workspace, stream);
      });
      const double fp = 2.0 * g.M * g.N * g.K / tp / 1e12, fr = 2.0 * g.M * g.N * g.K / tr / 1e12;
      std::printf("| bf16 GEMM M=%lld N=%lld K=%lld: the product's / cuBLASLt's | %.1f / %.1f "
                  "TFLOP/s (%.1f%% / %.1f%% of peak) |\n",
                  (long long)g.M, (long long)g.N, (long long)g.K, fp, fr, 100.0 * fp / peak,
                  100.0 * fr / peak);
    }
    be->synchronize(nullptr);
    be->free(workspace);
    {
      Pool pool(*be);
      const int64_t M = 8192, N = 4096, K = 4096;
      float *x = pool.normal_f32(M * K, 1.0f, 1), *w = pool.normal_f32(N * K, 0.02f, 2);
      float* y = pool.get<float>(M * N);
      const double t = timer.median(iters, [&] { be->matmul(x, w, nullptr, y, M, N, K); });
      std::printf("| cuBLASLt fp32 GEMM (TF32 off) M=%lld N=%lld K=%lld | %.1f TFLOP/s |\n",
                  (long long)M, (long long)N, (long long)K, 2.0 * M * N * K / t / 1e12);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "block_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
