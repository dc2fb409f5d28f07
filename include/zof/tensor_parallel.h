// Tensor parallelism (Megatron-style) of the LLaMA family: each of T ranks holds a slice of every
// matrix and runs block_graph.h's one graph on it. q/k/v and gate/up are column-parallel (their
// output rows: whole heads, a range of the intermediate width), o and down row-parallel (their
// input columns) followed by one all-reduce each, the token table and the LM head
// vocab-parallel (rows of the vocabulary) with a parallel cross-entropy that exchanges each
// row's max, sum of exponentials and target logit, never the logits; norms are replicated.
// The slice model has the full model's parameters in the same order (the same tensor indices),
// so z of a slice's element is z of its GLOBAL element: a rank draws exactly the z a single
// process draws for the elements it holds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "zof/backend.h"
#include "zof/config.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/zkey.h"

namespace zof::tp {

// The tensor group's one exchange. Every rank of the group calls it in the same order with the
// same size (MPI over the ranks of one tensor group, threads in tests).
class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // out (size * bytes) <- every rank's in (bytes), rank 0's first; the same bytes on every rank.
  virtual void all_gather(const void* in, size_t bytes, void* out) = 0;
};

// v (n) <- v_0 + v_1 + ... + v_{T-1}, added left to right in fp32 on every rank from the
// gathered slices: the same bits on every rank and every run of a grid, whatever the timing
// (not the single process's sum, which forms the whole dot product in one accumulation).
void sum_ordered(Group& g, float* v, int64_t n);

// How one parameter is divided. Rows: this rank holds the rows of `ranges` of the (rows, cols)
// tensor, one range after the other (column-parallel projections, the vocabulary's tables,
// their biases; Phi-3's fused qkv_proj holds three ranges, its q rows, then k's, then v's, and
// gate_up_proj two); Columns: columns [begin, end) of every row (row-parallel o and down);
// Replicated: all of it (norms).
enum class Split { Replicated, Rows, Columns };
struct ParamSplit {
  Split split = Split::Replicated;
  int64_t rows = 0, cols = 1;  // the full tensor as held (Linear weights (out, in); vectors (n, 1))
  int64_t begin = 0, end = 0;  // Columns: the columns held; Replicated: [0, rows)
  int64_t width = 0;  // a matrix's full width (its low-rank z's V rows, zkey.h); 0: a vector
  std::vector<std::pair<int64_t, int64_t>> ranges;  // Rows: the row ranges held, in local order
  int64_t numel() const;       // elements held
};

// One rank's share of a model.
struct Plan {
  int rank = 0, size = 1;
  ModelConfig local;  // the config of the slice: num_heads, num_kv_heads, intermediate and vocab
  int64_t head_begin = 0, head_end = 0;    // query heads held
  int64_t kv_begin = 0, kv_end = 0;        // KV heads held
  bool kv_replicated = false;              // T > KV heads: each rank holds the one its q use
  int64_t inter_begin = 0, inter_end = 0;  // intermediate (FFN) width held
  int64_t vocab_begin = 0, vocab_end = 0;  // token ids held (the token table and LM head rows)
  int64_t vocab = 0;                       // the full vocabulary
  std::vector<ParamSplit> params;          // per parameter of the full model
  // The full tensor's element that local element j of parameter pi is.
  int64_t global_element(int pi, int64_t j) const;
};

// zof::Error unless T ranks can split a model of this config: one line naming
// --tensor-parallel, the config field or family, and the fix. Refused: OPT and GPT-2 (not split
// yet), biases on o or down (a row-parallel bias must be added once, not yet done), T not
// dividing the attention heads, KV heads neither a multiple of T nor dividing it, T above the
// intermediate width or vocabulary.
void check(const ModelConfig& c, int T);
// Rank `rank`'s plan of T (check() first). Heads split evenly; the intermediate width and the
// vocabulary in ranges as even as counts allow (rank t: [t*N/T, (t+1)*N/T)).
Plan plan(const ModelConfig& c, int rank, int T);

// This rank's slice of full (fp32 storage): a model of plan.local holding full's elements.
Model slice(const Model& full, const Plan& p);
// The slice's elements written back into full (fp32) where they came from: rank 0 assembles the
// full model from every rank's slice storage (local_storage: Model::storage() of slice(...)).
// params (null: every parameter): only those (a pipeline stage's, whose blocks are current).
void place(const Plan& p, const float* local_storage, Model& full,
           const std::vector<int>* params = nullptr);

// Every rank's slice gathered into full (a model of the full config with fp32 storage, e.g.
// Model::zeros(config)) on every rank of g: what rank 0 saves as the ordinary Hugging Face
// directory. Every rank calls it; the bytes are the slices' own, so full equals the single
// process's model wherever the slices equal its elements.
void gather(const Plan& p, Group& g, const Model& local, Model& full);

// A run of a slice's elements: local elements [local, local + n) of a parameter are its global
// elements [global, global + n).
struct ElementRun {
  int64_t local = 0, global = 0, n = 0;
};
// key as parameter pi's passes take it: with the full matrix's width (key.cols), so that a
// low-rank direction's factors are the whole matrix's (U's rows and V's rows at global indices)
// wherever the slice's elements lie.
ZKey param_key(const Plan& p, int pi, const ZKey& key);

// Parameter pi's local elements as runs of global ones, in local order: one run a row range
// for Rows (three for Phi-3's fused qkv_proj, two for gate_up_proj), one for Replicated, one a
// row for Columns. A ZO pass over each run at its global first element
// (Backend::zo_pass's `first`) draws and applies the single process's z on those elements.
std::vector<ElementRun> element_runs(const Plan& p, int pi);

// out (the slice's storage size) <- local at theta + sign * eps * z(key), every parameter by
// Backend::zo_pass over its element runs: the single process's perturbed copy (zo_pass's plus
// or minus stream) on the elements this rank holds, bit for bit. sign: +1 or -1. params (null:
// every parameter): only those (a pipeline stage's); the rest of out is left as it was.
void perturbed_copy(const Plan& p, Backend& be, const Model& local, const ZKey& key, float eps,
                    int sign, float* out, const std::vector<int>* params = nullptr);

// z of parameter pi's local elements (out: local numel), each z_element(param_key(p, pi, key),
// pi, its global element): the single process's z of the same elements, bit for bit.
void slice_z(const Plan& p, const Model& local, const ZKey& key, int pi, float* out);
// Every parameter of local moved by scale * z as the ZO passes move it (theta + scale * z,
// one fmaf): the single process's perturbed weights on the elements this rank holds.
void perturb(const Plan& p, Model& local, const ZKey& key, float scale);

// nll (rows) of targets from this rank's logits (rows, vocab_end - vocab_begin): the row's max,
// then the sums of exp(logit - max) and the target's logit (on the rank holding it) gathered,
// added in rank order in double. targets < 0 give 0. Host memory.
void parallel_cross_entropy(Group& g, const float* logits, int64_t rows, int64_t vocab_begin,
                            int64_t vocab_end, const int32_t* targets, float* nll);

// The forward of one rank's slice: the embedding, every layer and the head, by block_graph.h's
// graphs on the slice's dims, with the group's exchanges where the graph needs them. fp32,
// resident weights; every rank of the group calls the same methods with the same batch.
class TensorForward {
 public:
  TensorForward(const Model& local, const Plan& p, Backend& be, Group& g, int64_t max_rows);
  ~TensorForward();
  TensorForward(const TensorForward&) = delete;
  TensorForward& operator=(const TensorForward&) = delete;

  // This rank's logits (rows(), vocab_end - vocab_begin).
  void local_logits(const Batch& batch, std::vector<float>& out);
  // The full logits (rows(), V), every rank's slice gathered: for checks, not for the loss.
  void logits(const Batch& batch, std::vector<float>& out);
  // nll (rows()) of targets (< 0: not scored, 0) by the parallel cross-entropy.
  void nll(const Batch& batch, const int32_t* targets, float* nll);
  // nll (n) of (row, target) pairs: -log p(targets[i]) at position rows[i] (Batch::row); a position
  // may come more than once (as Forward::nll_at).
  void nll_at(const Batch& batch, const int32_t* rows, const int32_t* targets, int64_t n,
              float* nll);
  // Next-token NLL of the batch's own tokens (as Forward::next_token_nll).
  void next_token_nll(const Batch& batch, std::vector<float>& nll);
  // Bytes this rank has handed the group (each all_gather counts its `bytes` times T - 1: what
  // it sends to every other rank).
  uint64_t bytes_exchanged() const { return bytes_; }

  // A pipeline stage of the slice: blocks [first, last] of the walk's (0 = the embedding,
  // 1..L = the layers, L + 1 = the head; dist::stage_blocks). A stage without the embedding
  // takes its input hidden states (rows, C) from recv, one without the head hands its output to
  // send and nll() / nll_at() give zeros (the last stage has the loss). Every stage's ranks call nll with
  // the same batches in the same order.
  using Recv = std::function<void(float* h, int64_t n)>;
  using Send = std::function<void(const float* h, int64_t n)>;
  void set_stage(int first, int last, Recv recv, Send send);

 private:
  void hidden(const Batch& batch);  // into h_
  int layer_lo_ = 0, layer_hi_ = -1;  // the stage's layers [lo, hi); hi -1: all
  bool embed_ = true, head_ = true;
  Recv recv_;
  Send send_;
  friend class TensorPrimal;
  const Model& local_;
  Plan plan_;
  Backend& be_;
  Group& g_;
  int64_t max_rows_;
  std::vector<float*> bufs_;
  std::vector<int32_t*> ibufs_;
  uint8_t* mask_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace zof::tp
