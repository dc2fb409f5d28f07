// What the CPU benchmarks share: the built-in model configs, the analytic FLOP count, timing
// helpers and a Backend wrapper that times every op.
#pragma once
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zof/backend.h"
#include "zof/config.h"
#include "zof/error.h"
#include "zof/forward.h"

namespace zof_bench {

using json = nlohmann::json;

// GPT-2 small (124M) as Hugging Face's gpt2/config.json defines it.
const char* kGpt2_124m = R"({
  "model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768,
  "n_layer": 12, "n_head": 12, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
  "tie_word_embeddings": true, "bos_token_id": 50256, "eos_token_id": 50256
})";
// A LLaMA-style ~125M model: GQA (12 query heads, 4 kv heads), SwiGLU, untied LM head.
const char* kLlama_125m = R"({
  "model_type": "llama", "vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048,
  "num_hidden_layers": 12, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64,
  "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2
})";

// LLaMA-2-7B's shape (meta-llama/Llama-2-7b-hf's config.json): 6.74B parameters.
const char* kLlama2_7b = R"({
  "model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
  "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
  "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2
})";

// TinyLlama-1.1B's shape (its config.json: LLaMA-2's architecture, 22 layers of width 2048,
// GQA 32/4): a model whose Adam state (8.8 GB) outweighs its bf16 master (2.2 GB) four times.
const char* kTinyLlama_1b = R"({
  "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
  "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
  "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
  "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2
})";

// LLaMA-2-13B's shape (Meta's config.json) and LLaMA-1-30B's (LLaMA-30B: 60 layers, width 6656).
const char* kLlama2_13b = R"({
  "model_type": "llama", "vocab_size": 32000, "hidden_size": 5120, "intermediate_size": 13824,
  "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40,
  "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
  "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2
})";
const char* kLlama_30b = R"({
  "model_type": "llama", "vocab_size": 32000, "hidden_size": 6656, "intermediate_size": 17920,
  "num_hidden_layers": 60, "num_attention_heads": 52, "num_key_value_heads": 52,
  "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2
})";

zof::ModelConfig config_named(const std::string& name) {
  if (name == "gpt2-124m") return zof::ModelConfig::from_json(json::parse(kGpt2_124m), name);
  if (name == "llama-125m") return zof::ModelConfig::from_json(json::parse(kLlama_125m), name);
  if (name == "tinyllama-1b") return zof::ModelConfig::from_json(json::parse(kTinyLlama_1b), name);
  if (name == "llama2-7b") return zof::ModelConfig::from_json(json::parse(kLlama2_7b), name);
  if (name == "llama2-13b") return zof::ModelConfig::from_json(json::parse(kLlama2_13b), name);
  if (name == "llama-30b") return zof::ModelConfig::from_json(json::parse(kLlama_30b), name);
  ZOF_CHECK(std::filesystem::is_regular_file(name),
            "--model-config " + name + ": neither a built-in name (gpt2-124m, llama-125m, "
            "tinyllama-1b, llama2-7b, llama2-13b, llama-30b) nor a config.json file");
  return zof::ModelConfig::load(name);
}

// Parameters of the matrix products inside the transformer layers (no embeddings, no LM head).
int64_t layer_matmul_params(const zof::ModelConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  int64_t per_layer = 0;
  switch (c.arch) {
    case zof::Arch::Llama: per_layer = C * q + 2 * C * kv + q * C + 3 * C * I; break;
    case zof::Arch::OPT:
    case zof::Arch::GPT2: per_layer = 4 * C * C + 2 * C * I; break;
  }
  return c.num_layers * per_layer;
}

struct Flops {
  double layers = 0, attention = 0, head = 0;
  double total() const { return layers + attention + head; }
};

Flops count_flops(const zof::ModelConfig& c, int64_t B, int64_t T) {
  const double tokens = double(B) * T;
  const int64_t E = c.word_embed_proj_dim > 0 ? c.word_embed_proj_dim : c.hidden_size;
  Flops f;
  f.layers = 2.0 * layer_matmul_params(c) * tokens;
  f.attention = c.num_layers * 2.0 * 2.0 * B * c.num_heads * c.head_dim * (T * (T + 1) / 2.0);
  f.head = 2.0 * c.vocab_size * E * tokens;
  return f;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

// Median wall time of fn over iters runs, after warmup runs; after each timed run, between (not
// timed) runs.
double median_seconds(int warmup, int iters, const std::function<void()>& fn,
                      const std::function<void()>& between = {}) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(seconds_since(t0));
    if (between) between();
  }
  return median(t);
}

std::vector<float> random_floats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A Backend that forwards every call to another and adds up the wall time of each op, matmuls
// keyed by shape: where a forward's time goes, without a profiler that cannot see into oneDNN's
// JIT code. The CPU backend runs ops inline, so a call's wall time is its op's time. It adds up
// the process's CPU time (all threads) too: on a machine shared with other jobs, run with
// OMP_WAIT_POLICY=passive so that waiting threads do not spin, that is the op's work without
// the time its threads spent preempted or waiting for each other.
class TimingBackend : public zof::Backend {
 public:
  struct Entry {
    double seconds = 0, flop = 0, cpu_seconds = 0;
    int64_t calls = 0;
  };
  explicit TimingBackend(zof::Backend& inner) : in_(inner) {}
  std::map<std::string, Entry> entries;
  void reset() { entries.clear(); }

  std::string name() const override { return in_.name(); }
  // Device memory handed out through this wrapper: live now and at most.
  size_t live_bytes = 0, peak_bytes = 0;
  void* alloc(size_t b) override {
    void* p = in_.alloc(b);
    sizes_[p] = b;
    live_bytes += b;
    peak_bytes = std::max(peak_bytes, live_bytes);
    return p;
  }
  void free(void* p) override {
    if (auto it = sizes_.find(p); it != sizes_.end()) {
      live_bytes -= it->second;
      sizes_.erase(it);
    }
    in_.free(p);
  }
  void* alloc_host_pinned(size_t b) override { return in_.alloc_host_pinned(b); }
  void free_host_pinned(void* p) override { in_.free_host_pinned(p); }
  bool register_host(void* p, size_t b) override { return in_.register_host(p, b); }
  void unregister_host(void* p) override { in_.unregister_host(p); }
  size_t free_memory() const override { return in_.free_memory(); }
  zof::Stream* default_stream() override { return in_.default_stream(); }
  zof::Stream* create_stream() override { return in_.create_stream(); }
  void copy_to_device(void* d, const void* s, size_t b, zof::Stream* st) override {
    timed("copy", 0, [&] { in_.copy_to_device(d, s, b, st); });
  }
  void copy_to_host(void* d, const void* s, size_t b, zof::Stream* st) override {
    timed("copy", 0, [&] { in_.copy_to_host(d, s, b, st); });
  }
  void copy_device(void* d, const void* s, size_t b, zof::Stream* st) override {
    timed("copy", 0, [&] { in_.copy_device(d, s, b, st); });
  }
  void copy_device_2d(void* d, size_t dp, const void* s, size_t sp, size_t w, size_t rows,
                      zof::Stream* st) override {
    timed("copy", 0, [&] { in_.copy_device_2d(d, dp, s, sp, w, rows, st); });
  }
  zof::Event* create_event() override { return in_.create_event(); }
  void record(zof::Event* e, zof::Stream* s) override { in_.record(e, s); }
  void wait(zof::Stream* s, zof::Event* e) override { in_.wait(s, e); }
  void synchronize(zof::Stream* s) override { in_.synchronize(s); }

  using zof::Backend::matmul;
  using zof::Backend::zo_pass;
  ComputeInfo compute_info() const override { return in_.compute_info(); }
  void matmul(const float* x, const void* w, zof::DType wt, const float* bias, float* y,
              int64_t M, int64_t N, int64_t K, zof::Stream* s) override {
    char key[112];
    std::snprintf(key, sizeof key, "matmul%s M=%ld N=%ld K=%ld",
                  wt == zof::DType::BF16 ? " bf16" : "", long(M), long(N), long(K));
    timed(key, 2.0 * M * N * K, [&] { in_.matmul(x, w, wt, bias, y, M, N, K, s); });
  }
  void cast(const float* x, void* y, zof::DType yt, int64_t n, zof::Stream* s) override {
    timed("cast", 0, [&] { in_.cast(x, y, yt, n, s); });
  }
  void widen(const void* x, zof::DType xt, float* y, int64_t n, zof::Stream* s) override {
    timed("cast", 0, [&] { in_.widen(x, xt, y, n, s); });
  }
  using zof::Backend::attention;
  using zof::Backend::attention_jvp;
  using zof::Backend::rms_norm;
  using zof::Backend::rms_norm_jvp;
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                float w_offset, zof::Stream* s) override {
    timed("rms_norm", 0, [&] { in_.rms_norm(x, w, y, rows, dim, eps, w_offset, s); });
  }
  void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                  int64_t dim, float eps, zof::Stream* s) override {
    timed("layer_norm", 0, [&] { in_.layer_norm(x, w, b, y, rows, dim, eps, s); });
  }
  void rope(float* x, const int32_t* pos, int64_t rows, int64_t nh, int64_t hd, int64_t rd,
            const float* inv_freq, zof::Stream* s) override {
    timed("rope", 0, [&] { in_.rope(x, pos, rows, nh, hd, rd, inv_freq, s); });
  }
  void attention(const float* q, const float* k, const float* v, float* out, const uint8_t* mask,
                 int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D,
                 int64_t q_offset, float scale, int64_t window, float softcap, zof::DType t,
                 zof::Stream* s) override {
    // Causal pairs (a sliding window's are fewer: the count is an upper bound there).
    const double flop = 4.0 * B * H * D * (Tq * (Tq + 1) / 2.0 + Tq * q_offset);
    timed("attention", flop, [&] {
      in_.attention(q, k, v, out, mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, window, softcap, t,
                    s);
    });
  }
  void attention_packed(const float* q, const float* k, const float* v, float* out,
                        const int32_t* starts, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                        float scale, int64_t window, float softcap, zof::DType t,
                        zof::Stream* s) override {
    double flop = 0;  // as attention(), sequence by sequence
    for (int64_t b = 0; b < B; ++b) {
      const double T = starts[b + 1] - starts[b];
      flop += 4.0 * H * D * (T * (T + 1) / 2.0);
    }
    timed("attention", flop, [&] {
      in_.attention_packed(q, k, v, out, starts, B, H, Hkv, D, scale, window, softcap, t, s);
    });
  }
  void silu_mul(const float* g, const float* u, float* o, int64_t n, zof::Stream* s) override {
    timed("silu_mul", 0, [&] { in_.silu_mul(g, u, o, n, s); });
  }
  void gelu_tanh_mul(const float* g, const float* u, float* o, int64_t n,
                     zof::Stream* s) override {
    timed("gelu_tanh_mul", 0, [&] { in_.gelu_tanh_mul(g, u, o, n, s); });
  }
  void mul_scalar(float* x, float a, int64_t n, zof::Stream* s) override {
    timed("mul_scalar", 0, [&] { in_.mul_scalar(x, a, n, s); });
  }
  void softcap(const float* x, float* y, float cap, int64_t n, zof::Stream* s) override {
    timed("softcap", 0, [&] { in_.softcap(x, y, cap, n, s); });
  }
  void gelu_tanh(float* x, int64_t n, zof::Stream* s) override {
    timed("gelu_tanh", 0, [&] { in_.gelu_tanh(x, n, s); });
  }
  void gelu_erf(float* x, int64_t n, zof::Stream* s) override {
    timed("gelu_erf", 0, [&] { in_.gelu_erf(x, n, s); });
  }
  void relu(float* x, int64_t n, zof::Stream* s) override {
    timed("relu", 0, [&] { in_.relu(x, n, s); });
  }
  void add(float* y, const float* x, int64_t n, zof::Stream* s) override {
    timed("add", 0, [&] { in_.add(y, x, n, s); });
  }
  void embedding(const int32_t* ids, const float* table, float* out, int64_t n, int64_t dim,
                 bool acc, zof::Stream* s) override {
    timed("embedding", 0, [&] { in_.embedding(ids, table, out, n, dim, acc, s); });
  }
  void cross_entropy(const float* logits, const int32_t* t, float* nll, int64_t rows,
                     int64_t vocab, zof::Stream* s) override {
    timed("cross_entropy", 0, [&] { in_.cross_entropy(logits, t, nll, rows, vocab, s); });
  }
  void cross_entropy_chunk(const float* logits, const int32_t* t, int64_t rows, int64_t n,
                           int64_t v0, float* mx, float* sum, float* tgt, zof::Stream* s) override {
    timed("cross_entropy", 0,
          [&] { in_.cross_entropy_chunk(logits, t, rows, n, v0, mx, sum, tgt, s); });
  }
  // Keyed "zo_pass" whatever the tensor: the passes over parameters (update, perturbation).
  void zo_pass(zof::Theta theta, int64_t n, uint32_t tensor, int64_t first,
               const zof::ZOUpdateTerm* upd, int n_update, float lr_wd, const zof::ZKey* round,
               const zof::ZKey* cur, float eps, void* plus, void* minus, zof::DType copy_t,
               zof::Stream* s) override {
    timed(kZOPass, 0, [&] {
      in_.zo_pass(theta, n, tensor, first, upd, n_update, lr_wd, round, cur, eps, plus, minus,
                  copy_t, s);
    });
  }
  static constexpr const char* kZOPass = "zo_pass";
  // Forwarded untimed, as before the Backend interface made them pure: the token-table rows, the
  // optimizer-state update and the tangents are not among the columns the benchmarks report.
  void zo_rows(zof::Theta theta, int64_t width, const int32_t* rows, int64_t n_rows,
               uint32_t tensor, const zof::ZKey& cur, float eps, float* plus, float* minus,
               zof::Stream* s) override {
    in_.zo_rows(theta, width, rows, n_rows, tensor, cur, eps, plus, minus, s);
  }
  void zo_update_state(zof::Theta theta, float* m, float* v, int64_t n, uint32_t tensor,
                       int64_t first, const zof::ZOUpdateTerm* upd, int n_update,
                       const zof::ZOOptimizer& o, const zof::ZKey* round,
                       zof::Stream* s) override {
    in_.zo_update_state(theta, m, v, n, tensor, first, upd, n_update, o, round, s);
  }
  void round_bf16_stochastic(float* x, int64_t n, uint32_t tensor, int64_t first,
                             const zof::ZKey& key, zof::Stream* s) override {
    timed(kZOPass, 0, [&] { in_.round_bf16_stochastic(x, n, tensor, first, key, s); });
  }
  void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                    int64_t rows, int64_t dim, float eps, float w_offset,
                    zof::Stream* s) override {
    in_.rms_norm_jvp(x, dx, w, dw, dy, rows, dim, eps, w_offset, s);
  }
  void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                      const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                      zof::Stream* s) override {
    in_.layer_norm_jvp(x, dx, w, dw, db, dy, rows, dim, eps, s);
  }
  void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                     const float* v, const float* dv, float* dout, const uint8_t* mask, int64_t B,
                     int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale, int64_t window,
                     float softcap, zof::Stream* s) override {
    in_.attention_jvp(q, dq, k, dk, v, dv, dout, mask, B, S, H, Hkv, D, scale, window, softcap, s);
  }
  void gelu_tanh_mul_jvp(const float* g, const float* dg, const float* u, const float* du,
                         float* o, int64_t n, zof::Stream* s) override {
    in_.gelu_tanh_mul_jvp(g, dg, u, du, o, n, s);
  }
  void softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n,
                   zof::Stream* s) override {
    in_.softcap_jvp(x, dx, dy, cap, n, s);
  }
  void silu_mul_jvp(const float* g, const float* dg, const float* u, const float* du, float* o,
                    int64_t n, zof::Stream* s) override {
    in_.silu_mul_jvp(g, dg, u, du, o, n, s);
  }
  void gelu_tanh_jvp(const float* x, const float* dx, float* dy, int64_t n,
                     zof::Stream* s) override {
    in_.gelu_tanh_jvp(x, dx, dy, n, s);
  }
  void gelu_erf_jvp(const float* x, const float* dx, float* dy, int64_t n,
                    zof::Stream* s) override {
    in_.gelu_erf_jvp(x, dx, dy, n, s);
  }
  void relu_jvp(const float* x, const float* dx, float* dy, int64_t n, zof::Stream* s) override {
    in_.relu_jvp(x, dx, dy, n, s);
  }
  void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* t, float* dnll,
                         int64_t rows, int64_t vocab, zof::Stream* s) override {
    in_.cross_entropy_jvp(logits, dlogits, t, dnll, rows, vocab, s);
  }

 private:
  template <class F>
  void timed(const std::string& key, double flop, F&& f) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    f();
    Entry& e = entries[key];
    e.cpu_seconds += process_cpu_seconds() - c0;
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    e.flop += flop;
    ++e.calls;
  }
  static double process_cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  }
  zof::Backend& in_;
  std::map<void*, size_t> sizes_;
};

// The machine's practical fp32 GEMM rate through a backend: the MLP up-projection of a 768-wide
// model at 1024 tokens (M=1024 N=3072 K=768), best of 5 per sample. Sampled between the timed
// runs of a benchmark and reported as the median of the samples, so that the rate and the
// benchmark see the same stretch of a shared machine's load.
class GemmRate {
 public:
  static constexpr int64_t M = 1024, N = 3072, K = 768;
  // t: the weights' dtype (BF16: bf16 weights, the backend's bf16 product).
  explicit GemmRate(zof::Backend& be, zof::DType t = zof::DType::F32)
      : be_(be), t_(t), x_(random_floats(M * K, 1)), w_(random_floats(N * K, 2)), y_(M * N) {
    for (float v : w_) wb_.push_back(zof::f32_to_bf16(v));
    sample();  // warm-up: primitive creation
    samples_.clear();
  }
  void sample() {
    double best = 1e30;
    const void* w = t_ == zof::DType::BF16 ? (const void*)wb_.data() : (const void*)w_.data();
    for (int r = 0; r < 5; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      be_.matmul(x_.data(), w, t_, nullptr, y_.data(), M, N, K);
      best = std::min(best, seconds_since(t0));
    }
    samples_.push_back(best);
  }
  void clear() { samples_.clear(); }
  double gflops() const { return 2.0 * M * N * K / median(samples_) * 1e-9; }

 private:
  zof::Backend& be_;
  zof::DType t_;
  std::vector<float> x_, w_, y_;
  std::vector<uint16_t> wb_;
  std::vector<double> samples_;
};

// B sequences of T uniformly random token ids below vocab, all of full length.
inline zof::Batch random_batch(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  zof::Batch batch;
  batch.B = B;
  batch.T = T;
  batch.lengths.assign(B, int32_t(T));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, int32_t(vocab - 1));
  batch.ids.resize(B * T);
  for (auto& id : batch.ids) id = tok(rng);
  return batch;
}

// The ops a TimingBackend saw over `runs` runs that took `total` seconds each, slowest first:
// calls and milliseconds per run, share of the run, GFLOP/s where counted; the CPU time of all
// threads per run and GFLOP per CPU second (per thread: times the thread count, the rate the op
// would run at alone on balanced threads); then the time outside backend ops.
inline void print_op_table(const TimingBackend& tb, double total, int runs) {
  std::vector<std::pair<std::string, TimingBackend::Entry>> v(tb.entries.begin(), tb.entries.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  std::printf("  %-34s %8s %10s %7s %9s %10s %9s\n", "op", "calls", "ms/run", "share", "GFLOP/s",
              "CPU ms/run", "GF/CPU-s");
  double in_ops = 0;
  for (auto& [k, e] : v) {
    const double s = e.seconds / runs;
    in_ops += s;
    std::printf("  %-34s %8ld %10.1f %6.1f%% ", k.c_str(), long(e.calls / runs), s * 1e3,
                100 * s / total);
    if (e.flop > 0)
      std::printf("%9.1f", e.flop / e.seconds * 1e-9);
    else
      std::printf("%9s", "");
    std::printf(" %10.1f", e.cpu_seconds / runs * 1e3);
    if (e.flop > 0 && e.cpu_seconds > 0) std::printf(" %9.1f", e.flop / e.cpu_seconds * 1e-9);
    std::printf("\n");
  }
  std::printf("  %-34s %8s %10.1f %6.1f%%\n", "(outside backend ops)", "", (total - in_ops) * 1e3,
              100 * (total - in_ops) / total);
}

// A field of /proc/self/status in bytes (VmRSS: resident now, VmHWM: peak resident); 0 where
// /proc is missing.
inline double proc_status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) * 1024.0;
  return 0;
}

}  // namespace zof_bench
