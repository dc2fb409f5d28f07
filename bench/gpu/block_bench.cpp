// Forward throughput of one transformer block on the GPU, random weights: LLaMA-7B-shaped
// (RMSNorm, RoPE, MHA, SwiGLU) and OPT-13B-shaped (LayerNorm, biases, ReLU) blocks at several
// token counts. fp32: src's own layer, zof::Forward::layer, over the CUDA backend's fp32 entries
// (TF32 off), the block the trainer's walks run. bf16: the CudaBackend bf16 entries (cuBLASLt
// bf16 GEMMs, the tensor-core flash attention) composed into a block here, since src has no bf16
// block yet; a peer measurement of those kernels. Prints TFLOP/s and MFU against the GPU's dense
// bf16 peak, the split between GEMMs and attention, and the anchors: pinned host<->device
// bandwidth and cuBLASLt bf16 GEMM TFLOP/s at LLM shapes. Markdown on stdout.
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
#include "zof/cuda.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/philox.h"
#include "zof/streaming.h"

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
    be_.to_bf16(f, b, n);
    return b;
  }
  float* fill(int64_t n, float v) {
    std::vector<float> h(size_t(n), v);
    float* p = get<float>(n);
    be_.copy_to_device(p, h.data(), h.size() * 4, nullptr);
    return p;
  }

 private:
  zof::CudaBackend& be_;
  std::vector<void*> ptrs_;
};

struct BlockTimes {
  double total = 0, gemm = 0, attention = 0;
};

// One bf16 block over T tokens (batch 1). Times the whole block, then the GEMMs and the attention
// alone (the rest is norms, RoPE, activations and residual adds).
BlockTimes bf16_block(zof::CudaBackend& be, const Shape& s, int64_t T, int iters) {
  Pool pool(be);
  const int64_t C = s.C, Hq = s.H * s.D, Hk = s.Hkv * s.D, I = s.I;
  uint32_t t = 0;
  uint16_t *wq = pool.normal_bf16(Hq * C, 0.02f, t++), *wk = pool.normal_bf16(Hk * C, 0.02f, t++);
  uint16_t *wv = pool.normal_bf16(Hk * C, 0.02f, t++), *wo = pool.normal_bf16(C * Hq, 0.02f, t++);
  uint16_t *w1 = pool.normal_bf16(I * C, 0.02f, t++), *w2 = pool.normal_bf16(C * I, 0.02f, t++);
  uint16_t* wu = s.llama ? pool.normal_bf16(I * C, 0.02f, t++) : nullptr;
  uint16_t *bq = nullptr, *bk = nullptr, *bv = nullptr, *bo = nullptr, *b1 = nullptr, *b2 = nullptr;
  if (!s.llama) {
    bq = pool.normal_bf16(Hq, 0.02f, t++), bk = pool.normal_bf16(Hk, 0.02f, t++);
    bv = pool.normal_bf16(Hk, 0.02f, t++), bo = pool.normal_bf16(C, 0.02f, t++);
    b1 = pool.normal_bf16(I, 0.02f, t++), b2 = pool.normal_bf16(C, 0.02f, t++);
  }
  float *ln_w = pool.fill(C, 1.0f), *ln_b = pool.fill(C, 0.0f);
  uint16_t* h = pool.normal_bf16(T * C, 1.0f, t++);
  uint16_t *xn = pool.get<uint16_t>(T * C), *q = pool.get<uint16_t>(T * Hq);
  uint16_t *k = pool.get<uint16_t>(T * Hk), *v = pool.get<uint16_t>(T * Hk);
  uint16_t *att = pool.get<uint16_t>(T * Hq), *tmp = pool.get<uint16_t>(T * C);
  uint16_t *f1 = pool.get<uint16_t>(T * I), *f2 = pool.get<uint16_t>(T * I);
  std::vector<int32_t> pos_h(T);
  for (int64_t i = 0; i < T; ++i) pos_h[i] = int32_t(i);
  int32_t* pos = pool.get<int32_t>(T);
  be.copy_to_device(pos, pos_h.data(), size_t(T) * 4, nullptr);
  const std::vector<float> inv_h = zof::rope_default_inv_freq(10000.0f, s.D);
  float* inv_freq = pool.get<float>((int64_t)inv_h.size());
  be.copy_to_device(inv_freq, inv_h.data(), inv_h.size() * sizeof(float), nullptr);
  const float scale = 1.0f / std::sqrt(float(s.D));

  auto norm = [&](const uint16_t* x, uint16_t* y) {
    if (s.llama)
      be.rms_norm_bf16(x, ln_w, y, T, C, 1e-6f);
    else
      be.layer_norm_bf16(x, ln_w, ln_b, y, T, C, 1e-5f);
  };
  auto gemms = [&] {
    be.matmul_bf16(xn, wq, bq, q, T, Hq, C);
    be.matmul_bf16(xn, wk, bk, k, T, Hk, C);
    be.matmul_bf16(xn, wv, bv, v, T, Hk, C);
    be.matmul_bf16(att, wo, bo, tmp, T, C, Hq);
    be.matmul_bf16(xn, w1, b1, f1, T, I, C);
    if (wu) be.matmul_bf16(xn, wu, nullptr, f2, T, I, C);
    be.matmul_bf16(f1, w2, b2, tmp, T, C, I);
  };
  auto attention = [&] { be.attention_bf16(q, k, v, att, nullptr, 1, T, T, s.H, s.Hkv, s.D, 0, scale); };
  auto block = [&] {
    norm(h, xn);
    be.matmul_bf16(xn, wq, bq, q, T, Hq, C);
    be.matmul_bf16(xn, wk, bk, k, T, Hk, C);
    be.matmul_bf16(xn, wv, bv, v, T, Hk, C);
    if (s.llama) {
      be.rope_bf16(q, pos, T, s.H, s.D, s.D, inv_freq);
      be.rope_bf16(k, pos, T, s.Hkv, s.D, s.D, inv_freq);
    }
    attention();
    be.matmul_bf16(att, wo, bo, tmp, T, C, Hq);
    be.add_bf16(h, tmp, T * C);
    norm(h, xn);
    be.matmul_bf16(xn, w1, b1, f1, T, I, C);
    if (s.llama) {
      be.matmul_bf16(xn, wu, nullptr, f2, T, I, C);
      be.silu_mul_bf16(f1, f2, f1, T * I);
    } else {
      be.relu_bf16(f1, T * I);
    }
    be.matmul_bf16(f1, w2, b2, tmp, T, C, I);
    be.add_bf16(h, tmp, T * C);
  };
  Timer timer(cudaStream_t(be.native_stream(nullptr)));
  BlockTimes r;
  r.total = timer.median(iters, block);
  r.gemm = timer.median(iters, gemms);
  r.attention = timer.median(iters, attention);
  return r;
}

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

// The same block in fp32 through src's own definition, zof::Forward::layer over the CUDA
// backend's fp32 entries (strict fp32 GEMMs, TF32 off; the generic attention): the layer every
// walk of the trainer runs, its weights resident in device memory.
class Fp32Block {
 public:
  Fp32Block(zof::CudaBackend& be, const Shape& s, int64_t max_tokens)
      : be_(be),
        model_(one_layer_model(s)),
        weights_(model_, be, resident_budget(model_)),
        fwd_(model_, be, max_tokens) {}

  // Median seconds of the layer over T tokens of one sequence (no padding: no key mask).
  double time(Timer& timer, int64_t T, int iters) {
    Pool pool(be_);
    float* h = pool.normal_f32(T * model_.config().hidden_size, 1.0f, 200);
    std::vector<int32_t> pos_h(T);
    for (int64_t i = 0; i < T; ++i) pos_h[i] = int32_t(i);
    int32_t* pos = pool.get<int32_t>(T);
    be_.copy_to_device(pos, pos_h.data(), size_t(T) * 4, nullptr);
    weights_.begin_walk({1});
    weights_.acquire(1);
    const zof::LayerWeights w =
        model_.layer(0, [&](int pi) -> const float* { return weights_.param(pi).f32(); });
    const double t =
        timer.median(iters, [&] { fwd_.layer(0, w, h, 1, T, pos, nullptr, nullptr); });
    weights_.release(1, false);
    return t;
  }

 private:
  zof::CudaBackend& be_;
  zof::Model model_;
  zof::BlockStreamer weights_;
  zof::Forward fwd_;
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
    for (const Shape& s : {kLlama7B, kOpt13B}) {
      std::unique_ptr<Fp32Block> block32;
      if (fp32) block32 = std::make_unique<Fp32Block>(*be, s, max_tokens);
      for (int64_t T : tokens) {
        const double fg = gemm_flops(s, T), fa = attention_flops(s, T), f = fg + fa;
        const BlockTimes b = bf16_block(*be, s, T, iters);
        std::printf("| %s | bf16 | %lld | %.2f | %.1f | %.1f%% | %.1f | %.1f |\n", s.name.c_str(),
                    (long long)T, b.total * 1e3, f / b.total / 1e12, 100.0 * f / b.total / 1e12 / peak,
                    fg / b.gemm / 1e12, fa / b.attention / 1e12);
        std::fflush(stdout);
        if (fp32) {
          const double t32 = block32->time(timer, T, std::max(1, iters / 2));
          std::printf("| %s | fp32 (no TF32) | %lld | %.2f | %.1f | — | — | — |\n", s.name.c_str(),
                      (long long)T, t32 * 1e3, f / t32 / 1e12);
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
    for (Gemm g : {Gemm{8192, 4096, 4096}, Gemm{8192, 11008, 4096}, Gemm{8192, 4096, 11008},
                   Gemm{8192, 5120, 5120}, Gemm{8192, 20480, 5120}, Gemm{8192, 5120, 20480},
                   Gemm{16384, 8192, 8192}}) {
      Pool pool(*be);
      uint16_t *x = pool.normal_bf16(g.M * g.K, 1.0f, 1), *w = pool.normal_bf16(g.N * g.K, 0.02f, 2);
      uint16_t* y = pool.get<uint16_t>(g.M * g.N);
      const double t = timer.median(iters, [&] { be->matmul_bf16(x, w, nullptr, y, g.M, g.N, g.K); });
      const double tf = 2.0 * g.M * g.N * g.K / t / 1e12;
      std::printf("| cuBLASLt bf16 GEMM M=%lld N=%lld K=%lld | %.1f TFLOP/s (%.1f%% of peak) |\n",
                  (long long)g.M, (long long)g.N, (long long)g.K, tf, 100.0 * tf / peak);
    }
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
