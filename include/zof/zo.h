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
#include <string>
#include <vector>

#include "zof/backend.h"
#include "zof/disk_tier.h"
#include "zof/forward.h"
#include "zof/loss.h"
#include "zof/model.h"
#include "zof/tensor_parallel.h"

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
  // The disk tier's write-back window (--write-back-every): 1, a disk-resident block is
  // written back by every walk that updates it; N > 1, it is written once every N steps: the
  // walks between read its stored (older) bytes and rebuild its current weights from the
  // window's updates, step by step from their seeds, in a scratch chunk (the arithmetic of the
  // in-place update, so no bit changes wherever a window closes), at the cost of up to N - 1 z's
  // regenerated per element and pass. Resident blocks update in place every step. A flush
  // closes the window. ZO-SGD with round_every 1 on the host backend (no streaming); without a
  // disk tier it does nothing.
  int write_back_every = 1;
  // Low-rank directions (LOZO, Chen et al. 2024; --low-rank): 0, z drawn element by element;
  // r > 0, each weight matrix's z is U V^T / sqrt(r) with Gaussian factors U (rows x r, new
  // every step) and V (cols x r, new every low_rank_every steps; LOZO's lazy V), vectors
  // dense (zkey.h, philox.h's z_lowrank_element). The estimate and the update are MeZO's with
  // that z: a direction in the span of few rank-one matrices, regenerated from the seed as
  // any z is.
  uint32_t low_rank = 0;
  uint32_t low_rank_every = 50;
};

// The key of direction j of a step under the options (its dist and low rank; the per-tensor
// fields, a mask and a matrix's width, are set where a tensor's pass takes it).
inline ZKey direction_key(const ZOStepOptions& o, uint32_t step, uint32_t j) {
  ZKey k{o.seed, step, j};
  k.dist = o.dist;
  k.rank = o.low_rank;
  k.rank_every = o.low_rank_every;
  return k;
}

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
  // max_rows: the most tokens (Batch::rows) and the most (position, target) pairs a micro-batch brings
  // (a shared prompt scores one position once per candidate); buffers are sized for it.
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
  const PendingUpdate& pending() const;
  void set_pending(PendingUpdate p);

  // Mean loss at the current (flushed) weights.
  double loss(const std::vector<LossBatch>& micro);

  Forward& forward();
  const ZOStepOptions& options() const;

  // Parameter streaming (streaming.h): the blocks pass through device memory within gpu_mem
  // bytes for everything this engine keeps on the device, its own buffers included (0: what the
  // device has free); the blocks that fit stay resident. A stateful optimizer's state moves to
  // pinned host memory and streams with its blocks (each block then takes 2 or 3 times its
  // weights' bytes on the device). Below the minimum (those buffers plus two slots of the
  // largest block) it throws a zof::Error naming --gpu-mem. The Model's storage stays the master
  // copy and is current after flush(). Not with pipeline stages. Enable it before the first walk
  // and before write_state(), once the Model's storage holds the weights to start from.
  void enable_streaming(size_t gpu_mem);
  BlockStreamer* streamer();
  // Device bytes of the engine's own buffers (how far free_memory() fell while allocating them
  // in the constructor; the optimizer state comes later).
  size_t buffer_bytes() const;
  // Device memory another part of the run allocated on this backend for its walks (the JVP
  // estimator's buffers): counted with the engine's buffers in the streaming minimum and budget.
  void add_buffer_bytes(size_t bytes);
  // Rounds the master weights to dtype in place (Model::round_to) after the pending update, and
  // makes every copy read them: the device's streamed blocks and the forward's bf16 copies.
  void round_weights(DType dtype);
  // The least gpu_mem that enable_streaming() accepts.
  size_t streaming_minimum() const;

  // The disk tier (disk_tier.h): the host masters of the blocks that do not fit host_mem bytes
  // (their weights, and a stateful optimizer's state with them) live in a file under dir and
  // pass through host memory as the walks reach them; the block holding a tied LM head stays
  // resident (the walk reads it twice). Below disk_tier_minimum() it throws a zof::Error naming
  // --host-mem; at or above every block's bytes it does nothing. The host masters are never
  // whole while the tier lives: whoever reads or writes the Model's storage goes through
  // host_blocks() block by block (Model's methods that take a BlockAccess; the engine's
  // forward() does so itself, and read_state()/write_state() too). After enable_streaming()
  // (the tiers compose) and before the first walk; not with pipeline stages.
  // unwritten: the Model's storage does not hold the weights yet (laid out, nothing read): the
  // store is not written now, and the caller writes every block through host_blocks() before
  // anything reads one (Model::read_weights with the tier: a model larger than RAM loaded
  // straight into it).
  // store: a run's store (DiskStore: checkpoints name its slots; null: a scratch store in dir);
  // one that adopts a checkpoint's slots makes a tier even where every block fits host_mem.
  void enable_disk_tier(uint64_t host_mem, const std::string& dir, int io_threads = 2,
                        bool unwritten = false, const DiskStore* store = nullptr);
  DiskTier* disk_tier();
  // Sparse MeZO's thresholds (--sparsity) from the weights as they are now. The constructor
  // takes them from the Model's storage; a caller that writes the weights after (through the
  // disk tier, unwritten) calls this once they are in.
  void set_sparsity_from_weights();
  // The tier as a BlockAccess for the Model's methods; null without one.
  BlockAccess* host_blocks();
  // Every block back in host memory, the store removed. keep_weights false: the store goes and
  // the weights with it (the Model's disk blocks are then zeros): a run that saved its model
  // and ends, which RAM could not hold whole.
  void disable_disk_tier(bool keep_weights = true);
  uint64_t disk_tier_minimum() const;
  // What host_mem keeps in RAM (DiskTier::plan), for a check before anything is created.
  DiskTierPlan disk_tier_plan(uint64_t host_mem) const;
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
  // The optimizer state of some blocks only, one block at a time (through the disk tier where
  // there is one, so never whole in RAM): fn(b, m, v) gets block b's planes, blocks()[b].span
  // floats each in storage layout (v null without Adam). read_state_blocks hands fn the
  // engine's values (the pending update applied first, as read_state); with write_state_blocks
  // fn fills them and they become the engine's (as write_state, for those blocks only).
  using StateFn = std::function<void(int block, float* m, float* v)>;
  void read_state_blocks(const std::vector<int>& blocks, const StateFn& fn);
  void write_state_blocks(const std::vector<int>& blocks, const StateFn& fn);
  // Sparse MeZO's threshold of each parameter (infinity: dense).
  const std::vector<float>& masks() const;
  // The model is the tensor-parallel slice `plan` holds (zof/tensor_parallel.h): every update
  // draws z at the global elements the slice's are (tp::element_runs; a low-rank direction
  // from the whole matrix's factors, tp::param_key), so the slice takes exactly the single
  // process's update on the elements it holds. Only for an engine that applies updates
  // (ZOStepOptions::perturb off, no Sparse MeZO mask, fp32 master, no streaming or disk
  // tier): the perturbed passes of a slice are the tensor-parallel forward's.
  void set_tensor_slice(const tp::Plan& plan);  // plan outlives the engine
  void set_tensor_slice(const tp::Plan&& plan) = delete;

 private:
  // The walk's state, its device buffers and helpers (src/zo/zo_engine.h).
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zof
