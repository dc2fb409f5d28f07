// The one small interface every compute backend implements (CPU now, CUDA later).
// Three separate concerns: memory (device buffers, pinned host buffers), streams (ordered queues
// of async copies and ops, with events) and ops (the math of a transformer forward pass).
// Backends know no model: ops take raw buffers and sizes; the model graph lives in src/model.
// Every op is asynchronous with respect to the host on its stream; the CPU backend runs it inline.
// All tensors are row-major, fp32 activations; shapes are given in comments as (rows, cols).
// Precision: activations, norms, softmax and every reduction are fp32; the weights a matrix
// product reads, and the perturbed copies the ZO pass writes for it, may be bf16 (the compute
// dtype of a run, --dtype): the product then rounds its fp32 input to bf16 and accumulates in
// fp32, which is what AMX tiles and tensor cores do.
// Every op is pure virtual: a backend implements all of them (the host backends share theirs
// through cpu::HostBackend, src/cpu/host_backend.h), so a device backend that misses one does
// not compile, instead of running a host loop on device pointers. The only slots with a default
// are marked optional below, and their defaults touch no memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zof/dtype.h"
#include "zof/zkey.h"

namespace zof {

// One direction's share of a ZO update: theta -= coef * z(key).
struct ZOUpdateTerm {
  ZKey key;
  float coef = 0.f;  // lr * g_j / q
};

// A stateful ZO optimizer's constants for one update (ZO-SGD with momentum, ZO-Adam).
struct ZOOptimizer {
  enum Kind : int { Momentum = 1, Adam = 2 };
  int kind = Momentum;
  float lr = 0.f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float wd = 0.f;                // weight decay of this tensor (0 for norms and biases)
  float bc1 = 1.f, bc2 = 1.f;    // Adam's bias corrections 1 / (1 - beta^t)
};

// A master tensor where it is held: fp32, or bf16 (a bf16 master, --master bf16, held in 2 bytes
// a parameter). The ZO passes read it as fp32 and, when they update it, write it back in its
// type (a bf16 master's update is rounded stochastically, so the value written is exact).
struct Theta {
  void* p = nullptr;
  DType dtype = DType::F32;
  Theta() = default;
  Theta(float* f) : p(f) {}  // NOLINT(google-explicit-constructor): an fp32 master
  explicit Theta(const float* f) : p(const_cast<float*>(f)) {}  // read-only uses (zo_rows)
  Theta(void* q, DType t) : p(q), dtype(t) {}
  // Element i of the tensor.
  Theta at(int64_t i) const {
    return Theta(static_cast<char*>(p) + i * (int64_t)dtype_size(dtype), dtype);
  }
  float* f32() const { return dtype == DType::F32 ? static_cast<float*>(p) : nullptr; }
  uint16_t* bf16() const { return dtype == DType::BF16 ? static_cast<uint16_t*>(p) : nullptr; }
};

// Opaque handles owned by the backend that created them. No backend defines these types: each
// keeps its own and casts (two definitions of zof::Stream in one library would break the ODR).
struct Stream;
struct Event;

class Backend {
 public:
  virtual ~Backend() = default;
  // What the backend runs on, for logs and errors ("cpu", "reference", "cuda:0", "sim:cpu").
  virtual std::string name() const = 0;

  // ---- memory ----------------------------------------------------------------------------
  // Device memory (on the CPU backend: 64-byte aligned host memory). Never returns null: throws
  // zof::Error when the budget is exhausted.
  virtual void* alloc(size_t bytes) = 0;
  // Returns memory from alloc() once the work queued so far on every stream is done; null is
  // ignored.
  virtual void free(void* ptr) = 0;
  // alloc() of memory that reads as zeros. Host backends take its pages fresh from the system,
  // so that what is never written costs no memory (the optimizer state of a model under a disk
  // tier is never whole in RAM); the default clears it with copies.
  virtual void* alloc_zeroed(size_t bytes);
  // Page-locked host memory, the source/target of async copies (CPU backend: aligned memory).
  virtual void* alloc_host_pinned(size_t bytes) = 0;
  // alloc_host_pinned() of memory that reads as zeros (fresh pages on host backends, as
  // alloc_zeroed; the default clears it).
  virtual void* alloc_host_pinned_zeroed(size_t bytes);
  // Returns memory from alloc_host_pinned(); the caller makes sure no copy still uses it.
  virtual void free_host_pinned(void* ptr) = 0;
  // Bytes of device memory still free (CPU backend: available physical memory).
  virtual size_t free_memory() const = 0;
  // Optional. Page-locks existing host memory (cudaHostRegister), so that async copies from and
  // to it do not stage through a bounce buffer and serialize. false when the backend has nothing
  // to do (host backends) or could not (the copies still work, synchronously). The default does
  // nothing and answers false.
  virtual bool register_host(void* ptr, size_t bytes) { return false; }
  // Optional: undoes a register_host that answered true (the default, nothing to undo).
  virtual void unregister_host(void* ptr) {}

  // ---- streams and events --------------------------------------------------------------------
  // Work on one stream runs in the order it was queued; streams are ordered only by events.
  // The stream every op runs on when given nullptr.
  virtual Stream* default_stream() = 0;
  virtual Stream* create_stream() = 0;  // owned by the backend, lives until it is destroyed
  // Async copies of bytes on stream s: host (pinned for overlap) to device, device to host,
  // device to device. The host buffer must stay valid until s has reached the copy.
  virtual void copy_to_device(void* dst, const void* src, size_t bytes, Stream* s) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes, Stream* s) = 0;
  virtual void copy_device(void* dst, const void* src, size_t bytes, Stream* s) = 0;
  // rows strided rows of width bytes, device to device: row r from src + r * spitch to
  // dst + r * dpitch (splitting GPT-2's fused QKV, gathering columns).
  virtual void copy_device_2d(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t rows, Stream* s) = 0;
  virtual Event* create_event() = 0;  // owned by the backend
  virtual void record(Event* e, Stream* s) = 0;      // e completes when s reaches this point
  virtual void wait(Stream* s, Event* e) = 0;        // s waits for e, the host does not
  virtual void synchronize(Stream* s) = 0;           // the host waits for s

  // ---- ops (on stream s; nullptr = default stream) -------------------------------------------
  // What this backend's bf16 matrix products run on, for `--dtype auto` and the run summary:
  // bf16_fast when they beat fp32 here (AMX on a CPU, tensor cores on a GPU), and the unit in
  // words ("oneDNN avx512_core_amx", "NVIDIA H200 (sm_90) tensor cores", ...).
  struct ComputeInfo {
    bool bf16_fast = false;
    std::string isa;
  };
  virtual ComputeInfo compute_info() const = 0;

  // y(M,N) = x(M,K) · w(N,K)^T + bias(N); bias may be null. w is in nn.Linear layout (out, in),
  // of type wt: F32 (strict fp32, no TF32) or BF16 (x is rounded to bf16, nearest even, and the
  // products of bf16 values accumulate in fp32). x, bias and y are fp32. On the CPU a row's
  // outputs have the same bits whatever M and the thread count, except that M = 1 (decoding)
  // runs its own faster path: callers that must match a row among others bit for bit (the
  // training walk's heads) run a lone row as two. (GPU libraries choose kernels by shape, M
  // included: no such promise there.)
  virtual void matmul(const float* x, const void* w, DType wt, const float* bias, float* y,
                      int64_t M, int64_t N, int64_t K, Stream* s = nullptr) = 0;
  void matmul(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t N,
              int64_t K, Stream* s = nullptr) {
    matmul(x, w, DType::F32, bias, y, M, N, K, s);
  }
  // y(n) = x(n) in dtype yt (BF16 and F16 round to nearest even; F32 copies).
  virtual void cast(const float* x, void* y, DType yt, int64_t n, Stream* s = nullptr) = 0;
  // y(n) = x(n) as fp32, x of type xt (F32 copies, BF16 widens: exact).
  virtual void widen(const void* x, DType xt, float* y, int64_t n, Stream* s = nullptr) = 0;
  // y(rows,dim) = x / sqrt(mean(x^2) + eps) * (w + w_offset): w_offset is 0, or 1 for Gemma's
  // RMSNorm (its weights are stored as offsets from 1; the sum is formed in fp32 first, as
  // transformers' (1 + w.float())). y may alias x.
  virtual void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
                        float eps, float w_offset, Stream* s = nullptr) = 0;
  void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                Stream* s = nullptr) {
    rms_norm(x, w, y, rows, dim, eps, 0.f, s);
  }
  // y(rows,dim) = (x - mean) / sqrt(var + eps) * w + b (biased variance). y may alias x.
  virtual void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows,
                          int64_t dim, float eps, Stream* s = nullptr) = 0;
  // Rotary embedding in place, Hugging Face rotate_half convention over the first rotary_dim
  // dims of each head: the pairs are (i, i + rotary_dim/2) for i < rotary_dim/2, rotated by
  // angle = pos * inv_freq[i]; dims [rotary_dim, head_dim) pass through (partial rotary).
  // x (rows, n_heads, head_dim), pos (rows), inv_freq (rotary_dim/2) fp32 in device memory: the
  // model's table (ModelConfig::rope_inv_freq, theta^(-2i/rotary_dim) and any rope scaling),
  // computed once at load. rotary_dim even and <= head_dim. As in Hugging Face the angle is an
  // fp32 product, float(pos) * inv_freq[i], so every backend rotates by the same rounded angle
  // (at pos ~4000 the rounding is ~1e-4 rad, more than the fp32 tolerance between backends).
  virtual void rope(float* x, const int32_t* pos, int64_t rows, int64_t n_heads,
                    int64_t head_dim, int64_t rotary_dim, const float* inv_freq,
                    Stream* s = nullptr) = 0;
  // Causal softmax attention with grouped-query heads (query head h reads kv head
  // h / (H / Hkv)). q (B,Tq,H,D), k and v (B,Tk,Hkv,D), out (B,Tq,H,D). Query i sits at position
  // q_offset + i and sees key j iff j <= q_offset + i and key_mask[b*Tk + j] != 0 (key_mask null:
  // all keys valid). A query that sees no key gets zeros.
  // Gemma's variants: window > 0 is a sliding window, the query at position p sees only keys
  // j > p - window (transformers' sliding_window; 0: no window); softcap > 0 replaces each
  // scaled score x by softcap * tanh(x / softcap) before the mask and the softmax (0: none).
  // t, the inputs' precision (a bf16 walk's, --dtype): F32; or BF16, where q * scale, k, v and
  // the softmax's probabilities are rounded to bf16 (nearest even) before they are multiplied,
  // and every product is summed in fp32, as are the scores, the softmax (its normalizer sums
  // the unrounded probabilities) and out. CUDA differs: its kernels write out in bf16, and the
  // generic kernel (a window, a soft-cap, a head_dim other than 64 or 128) keeps the
  // probabilities in fp32.
  virtual void attention(const float* q, const float* k, const float* v, float* out,
                         const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                         int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
                         float softcap, DType t, Stream* s = nullptr) = 0;
  void attention(const float* q, const float* k, const float* v, float* out,
                 const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                 int64_t Hkv, int64_t D, int64_t q_offset, float scale, int64_t window,
                 float softcap, Stream* s = nullptr) {
    attention(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, window, softcap,
              DType::F32, s);
  }
  void attention(const float* q, const float* k, const float* v, float* out,
                 const uint8_t* key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                 int64_t Hkv, int64_t D, int64_t q_offset, float scale, Stream* s = nullptr) {
    attention(q, k, v, out, key_mask, B, Tq, Tk, H, Hkv, D, q_offset, scale, 0, 0.f, DType::F32,
              s);
  }
  // attention over a packed batch (Batch::starts): sequence b's queries, keys and values are
  // rows starts[b] .. starts[b + 1] - 1 of q (rows, H, D), k and v (rows, Hkv, D), and it
  // attends causally to its own keys from position 0, no mask. starts (B + 1) is host memory.
  // The same result as one attention() call per sequence, which is what this default runs; the
  // CPU backend runs all the sequences' heads in one parallel region, with the same bits.
  virtual void attention_packed(const float* q, const float* k, const float* v, float* out,
                                const int32_t* starts, int64_t B, int64_t H, int64_t Hkv,
                                int64_t D, float scale, int64_t window, float softcap, DType t,
                                Stream* s = nullptr) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = starts[b], len = starts[b + 1] - starts[b];
      attention(q + r * H * D, k + r * Hkv * D, v + r * Hkv * D, out + r * H * D, nullptr, 1,
                len, len, H, Hkv, D, 0, scale, window, softcap, t, s);
    }
  }
  // out(n) = silu(gate) * up. out may alias gate or up.
  virtual void silu_mul(const float* gate, const float* up, float* out, int64_t n,
                        Stream* s = nullptr) = 0;
  // out(n) = gelu_tanh(gate) * up (Gemma's GeGLU). out may alias gate or up.
  virtual void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n,
                             Stream* s = nullptr) = 0;
  // x(n) *= a (Gemma's embedding normalizer).
  virtual void mul_scalar(float* x, float a, int64_t n, Stream* s = nullptr) = 0;
  // y(n) = cap * tanh(x / cap) (Gemma 2's final-logit soft-capping). y may alias x.
  virtual void softcap(const float* x, float* y, float cap, int64_t n, Stream* s = nullptr) = 0;
  // In place: tanh-approximated GELU ("gelu_new"/"gelu_pytorch_tanh"), exact erf GELU, ReLU.
  virtual void gelu_tanh(float* x, int64_t n, Stream* s = nullptr) = 0;
  virtual void gelu_erf(float* x, int64_t n, Stream* s = nullptr) = 0;
  virtual void relu(float* x, int64_t n, Stream* s = nullptr) = 0;
  // y(n) += x(n)
  virtual void add(float* y, const float* x, int64_t n, Stream* s = nullptr) = 0;
  // out(n,dim) = table[ids[i]] (+= when accumulate). ids must be in range (checked by caller).
  virtual void embedding(const int32_t* ids, const float* table, float* out, int64_t n,
                         int64_t dim, bool accumulate, Stream* s = nullptr) = 0;
  // nll(rows) = logsumexp(logits[r]) - logits[r][targets[r]]; targets[r] < 0 gives 0.
  // logits (rows, vocab).
  virtual void cross_entropy(const float* logits, const int32_t* targets, float* nll,
                             int64_t rows, int64_t vocab, Stream* s = nullptr) = 0;

  // ---- zeroth-order passes over one parameter tensor (id `tensor`) ---------------------------
  // Elements [first, first + n) of the tensor; theta, plus and minus point at element `first`
  // (a pass over a sub-range gives the same bits as the same range of a whole-tensor pass).
  // One memory pass that fuses what MeZO does in several:
  //  1. when n_update > 0: theta[i] <- theta[i] - (sum_j upd[j].coef * z(upd[j].key, tensor, i)
  //     + lr_wd * theta[i]), accumulated with fmaf in j order from lr_wd * theta[i];
  //  2. when cur: plus[i] = theta[i] + eps * z(cur, tensor, i), minus[i] = theta[i] - eps * z.
  // plus/minus may be null (update only). z is z_group() of src/util/philox.h, so every backend
  // produces the same bits. The copies are of type copy_t: F32, or BF16 (the fp32 value of step
  // 2 rounded to nearest even: the perturbed weights of a bf16 matrix product).
  // round (a bf16 master, --master bf16; null: fp32): when n_update > 0, step 1's result is
  // rounded to bf16 stochastically, as round_bf16_stochastic(theta, ..., *round) would after
  // it, and step 2 reads the rounded value: the same bits as those three passes, in one.
  // theta is held in fp32, or in bf16 (a bf16 master in 2-byte storage: an update then needs
  // round, and its rounded value is stored exactly).
  virtual void zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first,
                       const ZOUpdateTerm* upd, int n_update, float lr_wd, const ZKey* round,
                       const ZKey* cur, float eps, void* plus, void* minus, DType copy_t,
                       Stream* s = nullptr) = 0;
  // A pass without rounding (no update, or an fp32 master's).
  void zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
               int n_update, float lr_wd, const ZKey* cur, float eps, void* plus, void* minus,
               DType copy_t, Stream* s = nullptr) {
    zo_pass(theta, n, tensor, first, upd, n_update, lr_wd, nullptr, cur, eps, plus, minus, copy_t,
            s);
  }
  void zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
               int n_update, float lr_wd, const ZKey* cur, float eps, float* plus, float* minus,
               Stream* s = nullptr) {
    zo_pass(theta, n, tensor, first, upd, n_update, lr_wd, nullptr, cur, eps, plus, minus,
            DType::F32, s);
  }
  // Rows of a (rows, width) tensor at theta +/- eps z(cur), in one launch: for k < n_rows, row
  // rows[k] (elements [rows[k] * width, (rows[k] + 1) * width) of the tensor; theta points at
  // its element 0) goes to plus + k * width and minus + k * width (minus may be null). The same
  // bits as zo_pass over each row. rows in device memory (the batch's distinct token ids: the
  // ZO walk perturbs only the token-table rows a batch reads).
  virtual void zo_rows(Theta theta, int64_t width, const int32_t* rows, int64_t n_rows,
                       uint32_t tensor, const ZKey& cur, float eps, float* plus, float* minus,
                       Stream* s = nullptr) = 0;
  // The pending update through optimizer state, elements [first, first + n) of the tensor
  // (theta, m and v point at element first; v is unused by momentum):
  //   gh = sum_j upd[j].coef * z(upd[j].key, tensor, i)   (coef = g_j / q; fmaf in j order from 0;
  //        z masked as in zo_pass, by |theta| before the update)
  //   momentum: m = beta1 m + (gh + wd theta);  theta -= lr m
  //   adam:     m = beta1 m + (1 - beta1) gh;  v = beta2 v + (1 - beta2) gh^2;
  //             theta -= lr (m bc1 / (sqrt(v bc2) + eps) + wd theta)
  // round (a bf16 master; null: fp32): the new theta rounded as in zo_pass; theta held as in
  // zo_pass.
  virtual void zo_update_state(Theta theta, float* m, float* v, int64_t n, uint32_t tensor,
                               int64_t first, const ZOUpdateTerm* upd, int n_update,
                               const ZOOptimizer& o, const ZKey* round, Stream* s = nullptr) = 0;
  // A bf16 master's rounding after an update (--master bf16): elements [first, first + n) of
  // tensor `tensor` (x points at element first) become bf16 values, held as fp32, rounded
  // stochastically with the bits of (key.seed, key.step, tensor, element): src/util/philox.h's
  // bf16_round_stochastic and round_bits_group, so every backend gives the same bits.
  virtual void round_bf16_stochastic(float* x, int64_t n, uint32_t tensor, int64_t first,
                                     const ZKey& key, Stream* s = nullptr) = 0;
  // Online softmax over a vocabulary split into column chunks: folds logits (rows, n), columns
  // [v0, v0 + n) of the full rows, into per-row running state (max, sum of exp(logit - max),
  // logit of the target; targets < 0 are skipped). Start from max = -inf, sum = 0, target = 0;
  // after the last chunk nll = max + log(sum) - target. Each row is folded in column order, so
  // the result does not depend on threads.
  virtual void cross_entropy_chunk(const float* logits, const int32_t* targets, int64_t rows,
                                   int64_t n, int64_t v0, float* max, float* sum, float* target,
                                   Stream* s = nullptr) = 0;

  // ---- tangents: forward-mode AD of the ops above (jvp.h's estimator) ------------------------
  // Each takes the primal inputs and their tangents along one direction (a null tangent is
  // zero) and writes only the output tangent, fp32 in and out. Matrix products, RoPE and the
  // embedding are linear and need no rule of their own: their tangent is the op applied to the
  // tangents. The host backends run jvp_ops.h's loops (double accumulation); device backends
  // are tested against them.
  // dy = (dx r + x dr) (w + w_offset) + x r dw, r = (mean(x^2) + eps)^-1/2,
  // dr = -r^3 mean(x dx).
  virtual void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                            float* dy, int64_t rows, int64_t dim, float eps, float w_offset,
                            Stream* s = nullptr) = 0;
  void rms_norm_jvp(const float* x, const float* dx, const float* w, const float* dw, float* dy,
                    int64_t rows, int64_t dim, float eps, Stream* s = nullptr) {
    rms_norm_jvp(x, dx, w, dw, dy, rows, dim, eps, 0.f, s);
  }
  // dy = ((dx - dmean) r + (x - mean) dr) w + (x - mean) r dw + db, dr = -r^3 cov(x, dx).
  virtual void layer_norm_jvp(const float* x, const float* dx, const float* w, const float* dw,
                              const float* db, float* dy, int64_t rows, int64_t dim, float eps,
                              Stream* s = nullptr) = 0;
  // The tangent of attention() with Tq = Tk = S and q_offset = 0 (a whole causal sequence):
  // with p = softmax(s), s_j = scale q.k_j: dout = sum_j p_j (dv_j + (ds_j - sum_l p_l ds_l) v_j),
  // ds_j = scale (dq.k_j + q.dk_j). Shapes, the key mask, window and softcap as attention()
  // (with a softcap, s_j = c tanh(x_j / c) and ds_j is that times 1 - tanh^2); D <= 256.
  virtual void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                             const float* v, const float* dv, float* dout, const uint8_t* key_mask,
                             int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                             int64_t window, float softcap, Stream* s = nullptr) = 0;
  void attention_jvp(const float* q, const float* dq, const float* k, const float* dk,
                     const float* v, const float* dv, float* dout, const uint8_t* key_mask,
                     int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t D, float scale,
                     Stream* s = nullptr) {
    attention_jvp(q, dq, k, dk, v, dv, dout, key_mask, B, S, H, Hkv, D, scale, 0, 0.f, s);
  }
  // dout = silu'(gate) dgate up + silu(gate) dup.
  virtual void silu_mul_jvp(const float* gate, const float* dgate, const float* up,
                            const float* dup, float* dout, int64_t n, Stream* s = nullptr) = 0;
  // dout = gelu_tanh'(gate) dgate up + gelu_tanh(gate) dup.
  virtual void gelu_tanh_mul_jvp(const float* gate, const float* dgate, const float* up,
                                 const float* dup, float* dout, int64_t n,
                                 Stream* s = nullptr) = 0;
  // dy = (1 - tanh(x / cap)^2) dx, the tangent of softcap() at its input x.
  virtual void softcap_jvp(const float* x, const float* dx, float* dy, float cap, int64_t n,
                           Stream* s = nullptr) = 0;
  // dy = act'(x) dx for the in-place activations above (ReLU's slope is 0 at 0, as torch's).
  virtual void gelu_tanh_jvp(const float* x, const float* dx, float* dy, int64_t n,
                             Stream* s = nullptr) = 0;
  virtual void gelu_erf_jvp(const float* x, const float* dx, float* dy, int64_t n,
                            Stream* s = nullptr) = 0;
  virtual void relu_jvp(const float* x, const float* dx, float* dy, int64_t n,
                        Stream* s = nullptr) = 0;
  // dnll(rows) = sum_v softmax(logits[r])_v dlogits[r][v] - dlogits[r][targets[r]]; targets < 0
  // give 0.
  virtual void cross_entropy_jvp(const float* logits, const float* dlogits, const int32_t* targets,
                                 float* dnll, int64_t rows, int64_t vocab,
                                 Stream* s = nullptr) = 0;
};

// The CPU backend (oneDNN matrix products, OpenMP elsewhere). threads <= 0: OpenMP's default.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// The plain scalar reference backend: every op written once, never optimized; the oracle that
// the fast backends are tested against.
std::unique_ptr<Backend> make_reference_backend();

}  // namespace zof
