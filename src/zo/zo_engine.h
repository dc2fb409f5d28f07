// ZOEngine's inside (zof/zo.h keeps only the interface): the walk's device buffers, its stage,
// the streamer and the optimizer state, with the helpers of the walk (zo_walk.cpp), the state
// (zo_state.cpp) and the updates (zo_update.cpp). Each public call of ZOEngine forwards here.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "zof/backend.h"
#include "zof/forward.h"
#include "zof/loss.h"
#include "zof/model.h"
#include "zof/zo.h"

namespace zof {

struct ZOEngine::Impl {
  Impl(Model& model, Backend& backend, int64_t max_rows, ZOStepOptions opt);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // The public calls, as zo.h describes them.
  QueryLosses perturbed_losses(uint32_t step, const std::vector<LossBatch>& micro);
  void set_stage(int first, int last, StageIO io);
  bool owns_block(int b) const;
  std::vector<double> projected_gradients(const QueryLosses& l) const;
  void schedule_update(uint32_t step, float lr, const std::vector<double>& g);
  void add_update(const PendingUpdate& u);
  void flush(bool to_host = true);
  void sync_to_host();
  double loss(const std::vector<LossBatch>& micro);
  void enable_streaming(size_t gpu_mem);
  void enable_disk_tier(uint64_t host_mem, const std::string& dir, int io_threads,
                        bool unwritten, const DiskStore* store);
  void round_weights(DType dtype);
  size_t streaming_minimum() const;
  size_t streaming_buffers() const;
  int state_planes() const;
  void read_state(std::vector<float>& m, std::vector<float>& v);
  void write_state(const std::vector<float>& m, const std::vector<float>& v);
  void read_state_blocks(const std::vector<int>& blocks, const ZOEngine::StateFn& fn);
  void write_state_blocks(const std::vector<int>& blocks, const ZOEngine::StateFn& fn);
  // Sparse MeZO's thresholds (mask_) from the host masters as they are now.
  void sparsity_thresholds();
  // The optimizer state's planes of `blocks`, one block at a time through the disk tier (where
  // there is one) and a block-sized buffer: into_engine, fn fills the buffer and it goes into
  // the engine's planes (a disk block written back); else the engine's values go to fn.
  void state_by_block(const std::vector<int>& blocks, bool into_engine, const ZOEngine::StateFn& fn);

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
  // Parameter pi's elements as runs of the elements z is drawn at: a tensor-parallel slice's
  // (set_tensor_slice), else one run of the whole tensor at element 0.
  std::vector<tp::ElementRun> element_runs(int pi) const;
  std::vector<std::vector<tp::ElementRun>> element_runs_;  // per parameter; empty: the identity
  const tp::Plan* slice_ = nullptr;  // set_tensor_slice's plan (its owner outlives the engine)
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
  // The disk tier's write-back window (ZOStepOptions::write_back_every): the updates, one per
  // step in step order, that the disk-resident blocks have not yet had written to their store;
  // wb_close_: this walk applies them in place and writes those blocks back.
  std::vector<PendingUpdate> wb_window_;
  bool wb_close_ = false;
  void* wb_scratch_ = nullptr;  // held_n_ elements of the storage's type
  // Whether block b is in the write-back window: a disk-resident block of a run with one.
  bool windowed(int block) const;
  // The window's steps a pass must apply: all of them, but none after a closing walk's first
  // pass applied them in place (apply: this is that pass, or a flush).
  int window_steps(bool apply) const;
  // Steps [0, k) of the window applied to elements [first, first + n) of parameter pi at t, one
  // pass each as block_pass applies a step (the terms, the decay, a bf16 master's rounding),
  // then the copies of cur (may be null) in type ct, fused with the last pass; theta_out (may be
  // null) receives the result in ct (a one-sided walk's second stream).
  void window_passes(const Theta& t, int64_t n, int pi, int64_t first, int k, const ZKey* cur,
                     void* plus, void* minus, DType ct, void* theta_out);
  // The copies of cur from elements [first, first + n) of pi as the window makes them, the
  // master (th, at element first) only read: through wb_scratch_ chunks while steps are held.
  void window_read(const Theta& th, int64_t n, int pi, int64_t first, const ZKey& cur,
                   void* plus, void* minus, DType ct, void* theta_out);
  // Block b's pass in the window: apply (a closing walk's first pass, or a flush) applies the
  // window's steps in place (every parameter); else the copied parameters read through it (the
  // token table and LM head read it in perturb_rows and head_sums).
  void window_pass(int block, bool apply, const ZKey* cur, float* plus, float* minus);
  // Optimizer state in storage layout: without streaming m_/v_ in device memory (allocated by
  // the first update or write_state(), so that an engine about to stream never holds it whole
  // on the device); with streaming state_host_, the pinned host masters (m, then v) that stream_
  // carries as its planes 1 and 2.
  float *m_ = nullptr, *v_ = nullptr;
  std::vector<float*> state_host_;
  size_t buffer_bytes_ = 0;
  int lm_block_ = -1;                     // the block holding the LM head matrix
  std::unique_ptr<BlockStreamer> stream_;  // null: the walk works on the model's storage
  // The host masters' disk tier (null: all in host memory). Without streaming the walk's
  // acquire/release reach it; with streaming the streamer's uploads and write-backs do.
  std::unique_ptr<DiskTier> disk_;
  std::vector<int> disk_keep() const;  // blocks the disk tier keeps resident
  // Materialized (keep_weights), then gone.
  void drop_disk_tier(bool keep_weights = true);
  void check_disk_budget(uint64_t host_mem) const;  // --host-mem's least, refused below it
};

}  // namespace zof
