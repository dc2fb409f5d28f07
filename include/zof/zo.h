// The zeroth-order step (two-point SPSA as MeZO, or one-sided; ZO-SGD, momentum or Adam updates)
// written as one walk over blocks that carries both perturbed hidden states (+eps and -eps, for
// each of q directions) through each block while its weights are at hand (ZO2's "dual
// forward"). The previous step's update is applied
// to a block as the walk reaches it, fused with the next perturbation in one memory pass; z is
// regenerated from (seed, step, query, tensor, element), never stored. Streaming, pipelining
// and the GPU are schedules of this same walk. Momentum's and Adam's state (m, v) is laid out
// as the weights and goes where they go: whole on the device, or, with streaming, in host memory
// with each block's share travelling with the block.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "zof/backend.h"
#include "zof/forward.h"
#include "zof/loss.h"
#include "zof/model.h"

namespace zof {

// Sums over micro-batches, kept as sums so that data-parallel ranks can add them.
struct QueryLosses {
  std::vector<double> sum_plus, sum_minus;  // (q) summed NLL at theta +/- eps z_j
  double count = 0;                         // scored tokens, or examples (LossBatch::units)
};

struct ZOStepOptions {
  float eps = 1e-3f;
  float weight_decay = 0.f;
  int queries = 1;
  uint64_t seed = 0;
  // Rows of the LM head perturbed and multiplied at once (0: about 4 MB of them). Only the
  // memory and the GEMM shape change; the losses agree to fp32 rounding.
  int64_t vocab_chunk = 0;
  // The estimator: z Gaussian (kZGaussian) or Rademacher (kZRademacher); one-sided differences
  // g_j = (L(theta + eps z_j) - L(theta)) / eps (q + 1 forwards) instead of two-point ones (2q).
  uint32_t dist = kZGaussian;
  bool one_sided = false;
  // Sparse MeZO (Liu et al. 2024): z is zeroed where |theta_t| > h, so that the entries of
  // each weight matrix with large magnitudes are neither perturbed nor moved by z (weight decay
  // still applies); 0: dense. Vectors (norms, biases) stay dense. The decision, as the paper's
  // on-the-fly mask: h is fixed per matrix, the (1 - sparsity) quantile of |theta| of the
  // weights the engine is built from (the base model: a resumed run and `zof replay` build it
  // from the base too, never from a checkpoint), and the mask is evaluated from the current
  // weights at every step, the same theta_t for a step's perturbation and for its update. So
  // entries move in and out of the mask as the weights move (tested against a plain reference
  // through such moves), and no mask is stored.
  float sparsity = 0.f;
  // The optimizer the pending update goes through: ZO-SGD (MeZO), ZO-SGD with momentum, ZO-Adam.
  enum class Optimizer { SGD, Momentum, Adam } optimizer = Optimizer::SGD;
  float beta1 = 0.9f, beta2 = 0.999f, adam_eps = 1e-8f;
  // false: the engine only applies updates whose g another estimator computed (the JVP walk):
  // none of the perturbed walk's buffers are allocated, and perturbed_losses refuses. (Last, so
  // that brace-initialized options keep their meaning.)
  bool perturb = true;
  // The walks' matrix products (--dtype): F32, or BF16, whose perturbed copies theta +/- eps z
  // of the matrix weights are written in bf16 (rounded to nearest even from the fp32 value, so
  // from the untouched fp32 master every time) and multiplied with fp32 accumulation; the
  // evaluation's Forward reads bf16 copies of the same weights. Updates, z, g and the master
  // weights are the same code in both.
  DType compute = DType::F32;
  // The master weights (--master): F32, or BF16: the engine rounds the model to bf16 (nearest
  // even) when it is built, and every update is computed in fp32 and rounded back to bf16
  // stochastically with bits of (seed, step, tensor, element) (Backend::round_bf16_stochastic),
  // so resume, data parallel and replay stay exact and updates far below a bf16 ulp are kept on
  // average. The perturbed copies are built from that master, which they never change. The
  // model may hold them in bf16 (Model::storage_dtype, 2 bytes each: the walk reads and updates
  // them so) or in fp32 storage (streaming; the same values and bits).
  DType master = DType::F32;
  // A bf16 master's rounding window (--round-every): 1, every update is rounded as it lands;
  // K > 1, the updates of steps [kK, kK + K) are summed in fp32 on top of the stored master and
  // rounded once, by the walk of step (k + 1) K (or a flush). Until then the master is never
  // written: each pass rebuilds theta = master - sum of the window's updates from their seeds
  // and makes its copies from that, so the walks see every update at once, as with K = 1. The
  // rounding's variance is paid once per window, on a sum of K updates, instead of once per
  // update: far less noise where updates are about an ulp (measured in bench/RESULTS.md), for
  // up to K z's regenerated per pass. A flush closes a window early; the trainer flushes where
  // its options say (evaluations, checkpoints, the end: train::window_closes_after), so a
  // resumed run and its replay round where the run did (a stop inside a window checkpoints it
  // open: RunCounters::window_from).
  // ZO-SGD only (a stateful optimizer's update is not a sum of z's). Sparse MeZO in a window
  // masks every term of the window by |theta| at the window's start (not at each step's
  // theta), the same in the held walks and the closing pass. `zof replay --steps N` closes the
  // window at N, as a run of N steps would: it equals checkpoint-N only at a window's end.
  int round_every = 1;
};

// The update waiting to be applied. ZO-SGD: theta -= sum_j coef_j z_j + lr_wd theta (decayed
// tensors), coef_j = lr g_j / q; in a bf16 master's rounding window (round_every > 1) the terms
// and lr_wd of every step of the window so far, in step order (join()). Momentum and Adam: gh = sum_j coef_j z_j with coef_j = g_j / q
// goes through the optimizer state with lr, wd and the update count t (Backend::zo_update_state).
struct PendingUpdate {
  std::vector<ZOUpdateTerm> terms;
  float lr_wd = 0.f;
  float lr = 0.f, wd = 0.f;  // stateful optimizers
  // Stateful optimizers: Adam's bias corrections use t = step + 1, the step number (counting
  // steps whose update was skipped as non-finite; replay counts the same way).
  uint32_t t = 0;
  bool empty() const { return terms.empty(); }
  // ZO-SGD: adds a later step's update (its terms after these; its decay summed, applied to
  // the window's starting weights).
  void join(const PendingUpdate& later);
};

// Where a pipeline stage's hidden states come from and go to: stream 2j is query j's +eps
// state, 2j+1 its -eps state, each (rows, C) for the current micro-batch, in walk order.
struct StageIO {
  std::function<void(int stream, float* h, int64_t n)> recv;        // from the previous stage
  std::function<void(int stream, const float* h, int64_t n)> send;  // to the next stage
};

class BlockStreamer;  // streaming.h

class ZOEngine {
 public:
  ZOEngine(Model& model, Backend& backend, int64_t max_rows, ZOStepOptions opt);
  ~ZOEngine();

  // Losses at theta + eps z_j and theta - eps z_j for the q directions of `step`, summed over
  // the micro-batches. The pending update (if any) is applied to each block as the first
  // micro-batch's walk reaches it; theta is otherwise unchanged.
  QueryLosses perturbed_losses(uint32_t step, const std::vector<LossBatch>& micro);

  // Makes this engine one pipeline stage: it walks (perturbs, updates, runs) only blocks
  // [first, last] of the walk (0 = embedding, L+1 = head), receives the hidden states before
  // its first layer unless it has the embedding, and sends them after its last layer unless it
  // has the head (only the head's stage returns losses; the others return zero sums). With tied
  // embeddings the head's stage also keeps the embedding block: it applies the same updates to
  // its own copy (z is regenerated from the seed), so the tied weights never cross ranks.
  // Blocks outside the stage go stale; flush() leaves them alone.
  void set_stage(int first, int last, StageIO io);
  // Whether this engine keeps block b up to date.
  bool owns_block(int b) const;

  // Projected gradients g_j = (L+_j - L-_j) / 2 eps from (possibly all-reduced) sums.
  std::vector<double> projected_gradients(const QueryLosses& l) const;

  // Schedules theta <- theta - lr (mean_j g_j z_j + wd theta); applied lazily by the next walk
  // or by flush(). In an open rounding window (round_every > 1) it joins the window's updates.
  void schedule_update(uint32_t step, float lr, const std::vector<double>& g);
  // Adds an update as schedule_update does (replay: made by make_update).
  void add_update(const PendingUpdate& u);
  // Applies a pending update now (before evaluation, saving and at the end of a run); it closes
  // a rounding window, so a run calls it only where windows end (multiples of round_every) and
  // at its end. With
  // streaming, to_host also writes the device copies back to the Model's storage; false leaves
  // them on the device (a walk that reads the streamer next, as the JVP step does, needs no
  // host copy).
  void flush(bool to_host = true);
  // With streaming, writes the device copies back to the Model's storage without applying
  // the pending update (a checkpoint inside a rounding window: the master stays the window's).
  void sync_to_host();
  const PendingUpdate& pending() const { return pending_; }
  void set_pending(PendingUpdate p) { pending_ = std::move(p); }

  // Mean loss at the current (flushed) weights.
  double loss(const std::vector<LossBatch>& micro);

  Forward& forward() { return fwd_; }
  const ZOStepOptions& options() const { return opt_; }

  // Parameter streaming (streaming.h): the blocks pass through device memory within gpu_mem
  // bytes for everything this engine keeps on the device, its own buffers included (0: what the
  // device has free); the blocks that fit stay resident. A stateful optimizer's state moves to
  // pinned host memory and streams with its blocks (each block then takes 2 or 3 times its
  // weights' bytes on the device). Below the minimum (those buffers plus two slots of the
  // largest block) it throws a zof::Error naming --gpu-mem. The Model's storage stays the master
  // copy and is current after flush(). Not with pipeline stages. Enable it before the first walk
  // and before write_state(), once the Model's storage holds the weights to start from.
  void enable_streaming(size_t gpu_mem);
  BlockStreamer* streamer() { return stream_.get(); }
  // Device bytes of the engine's own buffers (how far free_memory() fell while allocating them
  // in the constructor; the optimizer state comes later, see m_).
  size_t buffer_bytes() const { return buffer_bytes_; }
  // Device memory another part of the run allocated on this backend for its walks (the JVP
  // estimator's buffers): counted with the engine's buffers in the streaming minimum and budget.
  void add_buffer_bytes(size_t bytes) { buffer_bytes_ += bytes; }
  // Rounds the master weights to dtype in place (Model::round_to) after the pending update, and
  // makes every copy read them: the device's streamed blocks and the forward's bf16 copies.
  void round_weights(DType dtype);
  // The least gpu_mem that enable_streaming() accepts.
  size_t streaming_minimum() const;
  // The device bytes streaming keeps apart from the blocks: the engine's buffers, and a bf16
  // evaluation's scratch for the streamed blocks' copies.
  size_t streaming_buffers() const;

  // The update of one step (see PendingUpdate).
  static PendingUpdate make_update(const ZOStepOptions& opt, uint32_t step, float lr,
                                   const std::vector<double>& g);

  // Arrays of optimizer state: 0 (ZO-SGD), 1 (momentum: m), 2 (Adam: m and v).
  int state_planes() const;
  // The optimizer state, laid out as Model::storage(), for checkpoints: m and v resized to
  // storage_size() floats each (or to 0 where the optimizer has none). read_state() applies the
  // pending update first (flush()), so that the state matches the weights; write_state() takes
  // the state to continue from (the pending update, if any, applies to it), sizes as read_state
  // gives. Both work with and without streaming.
  void read_state(std::vector<float>& m, std::vector<float>& v);
  void write_state(const std::vector<float>& m, const std::vector<float>& v);
  // Sparse MeZO's threshold of each parameter (infinity: dense).
  const std::vector<float>& masks() const { return mask_; }

 private:
  // One block's pass: the pending update (when apply_update) and the perturbations of `cur`
  // into plus/minus at the block's copy layout. The token table and the LM head matrix get
  // their update here but are never copied whole (see embed_rows and head_sums).
  void block_pass(int block, bool apply_update, const ZKey* cur, float* plus, float* minus);
  // The bits of a bf16 master's rounding of the pending update: its first term's (seed, step).
  ZKey round_key() const;
  // A pass of an open rounding window over elements [first, first + n) of tensor pi (th points
  // at element first): the copies at (master - the window's updates) +/- eps z(cur), through
  // held_ in chunks; the master is only read. theta_out (may be null) receives that theta in
  // type ct (a one-sided walk's second stream).
  void held_pass(const Theta& th, int64_t n, int pi, int64_t first, const ZKey& cur, void* plus,
                 void* minus, DType ct, void* theta_out);
  // One step's walk: the queries' keys and the stage's share of the blocks.
  struct StepWalk {
    std::vector<ZKey> keys;
    int nblocks = 0, li_lo = 0, li_hi = 0;  // layers [li_lo, li_hi)
    bool has_embed = true, has_head = true;
  };
  StepWalk step_walk(uint32_t step) const;
  // One-sided: query 0's second stream runs at theta and serves every query; the others have
  // only their +eps stream.
  bool has_minus(int j) const { return !opt_.one_sided || j == 0; }
  // The three parts of one micro-batch's walk (the first applies the pending update; dirty: the
  // blocks change and must be written back).
  void walk_embed(const StepWalk& w, const DeviceInputs& in, int64_t n_uniq, bool first,
                  bool dirty);
  void walk_layers(const StepWalk& w, const DeviceInputs& in, bool first, bool dirty);
  void walk_head(const StepWalk& w, const LossBatch& lb, bool first, bool dirty,
                 QueryLosses& out);
  // The batch's rows of the token table: its unique ids in order, and each id's index among them.
  static void token_rows(const int32_t* ids, int64_t rows, std::vector<int32_t>& uniq,
                         std::vector<int32_t>& local);
  // Those rows (the first n_uniq ids in uniq_dev_) at theta +/- eps z(key) into
  // tok_plus_/tok_minus_, row k from id uniq_dev_[k].
  void perturb_rows(const ZKey& key, int64_t n_uniq);
  // Summed NLL at theta +/- eps z(key) of the scored rows of hp/hm (hidden states after the
  // last layer), with the head block's small parameters already in blk_plus_/blk_minus_: the
  // LM head is perturbed and multiplied one vocabulary chunk at a time with an online softmax.
  void head_sums(const ZKey& key, const float* hp, const float* hm, const LossBatch& lb,
                 double& sum_plus, double& sum_minus);
  Model::ParamLocator copy_locator(const float* base, const float* tokens) const;
  // The type of parameter pi's perturbed copies: the compute dtype for matrices, else fp32.
  DType copy_dtype(int pi) const;
  void release_buffers();  // frees every buffer allocated so far
  // The key of query j at step with this engine's distribution, and a key's copy with tensor
  // pi's Sparse MeZO mask.
  ZKey key(uint32_t step, int j) const;
  ZKey masked(const ZKey& k, int pi) const;
  // Where the walk finds parameter pi's weights: the model's storage, or the device copy of its
  // block while streaming (the block must be acquired). acquire/release: no-ops unless streaming.
  // In the storage's type: a bf16 master held in 2 bytes is read and updated as bf16.
  Theta theta(int pi) const;
  // n elements of a master as its copy of type ct (the one-sided walk's unperturbed stream).
  void copy_theta(const Theta& th, void* dst, DType ct, int64_t n);
  // Parameter pi's optimizer state on the device, plane 1 (m) or 2 (v): the whole-model arrays
  // (allocated at first use), or its block's planes while streaming (the block must be acquired).
  float* state(int pi, int plane);
  void alloc_device_state();  // m_ (and v_), zeroed
  void acquire(int block);
  void release(int block, bool dirty);
  std::vector<int> walk_order(size_t micro_batches) const;  // blocks in acquire order

  Model& model_;
  Backend& be_;
  size_t free0_ = 0;  // be_.free_memory() before the buffers (declared before fwd_)
  Forward fwd_;
  ZOStepOptions opt_;
  PendingUpdate pending_;
  int64_t max_rows_;
  int first_block_ = 0, last_block_ = -1;  // the stage's blocks; -1: the last block
  StageIO io_;
  int tok_ = -1, lm_ = -1;           // parameter indices of the token table and LM head matrix
  std::vector<int64_t> copy_off_;    // per parameter: byte offset in a block copy (-1: never copied)
  // Buffers, allocated once: one perturbed pair of the current block's copied parameters, the
  // batch's rows of the token table, a vocabulary chunk of the LM head and its logits, the 2q
  // hidden-state streams, the head's input features and the online-softmax state.
  float *blk_plus_ = nullptr, *blk_minus_ = nullptr;
  float *tok_plus_ = nullptr, *tok_minus_ = nullptr;
  float *w_plus_ = nullptr, *w_minus_ = nullptr, *logit_plus_ = nullptr, *logit_minus_ = nullptr;
  float *x_plus_ = nullptr, *x_minus_ = nullptr, *ce_state_ = nullptr;
  float* h_sel_ = nullptr;       // the scored rows of a hidden state, gathered for the head
  int32_t* targets_ = nullptr;   // their targets, on the device
  int32_t* uniq_dev_ = nullptr;  // the batch's distinct token ids, on the device
  std::vector<int32_t> uniq_host_;  // the same on the host
  std::vector<float*> h_plus_, h_minus_;
  int64_t vocab_chunk_ = 0;
  std::vector<float> mask_;            // per parameter (Sparse MeZO)
  // An open rounding window (round_every > 1): the walk of this step reads the master through
  // held_pass, held_ chunks of held_n_ floats at a time.
  bool hold_ = false;
  float* held_ = nullptr;
  int64_t held_n_ = 0;
  // Optimizer state in storage layout: without streaming m_/v_ in device memory (allocated by
  // the first update or write_state(), so that an engine about to stream never holds it whole
  // on the device); with streaming state_host_, the pinned host masters (m, then v) that stream_
  // carries as its planes 1 and 2.
  float *m_ = nullptr, *v_ = nullptr;
  std::vector<float*> state_host_;
  size_t buffer_bytes_ = 0;
  int lm_block_ = -1;                     // the block holding the LM head matrix
  std::unique_ptr<BlockStreamer> stream_;  // null: the walk works on the model's storage
};

}  // namespace zof
