// The forward pass over the Backend interface, block by block: block_graph.h's graphs run by the
// primal ops on Forward's buffers, the hidden state updated in place; the whole-model walks
// (logits, NLL, incremental decoding) and the row-chunked LM head.
#include "zof/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/graph_ops.h"
#include "model/scored_rows.h"
#include "zof/error.h"
#include "zof/loss.h"
#include "zof/streaming.h"

namespace zof {
namespace {
// ROPE: the model's RoPE frequency table (ModelConfig::rope_inv_freq), uploaded once;
// ROPE_LOCAL: the sliding layers' own (Gemma 3's rope_local_inv_freq), when it has one.
enum Buf { XN, Q, K, V, ATT, TMP, FF1, FF2, LOGITS, HID, HS, NLL, ROPE, ROPE_LOCAL, NBUF };
}  // namespace

Batch Batch::from_sequences(const std::vector<std::vector<int32_t>>& seqs, int32_t pad_id) {
  Batch b;
  b.B = (int64_t)seqs.size();
  for (auto& s : seqs) {
    ZOF_ASSERT(!s.empty());
    b.T = std::max<int64_t>(b.T, (int64_t)s.size());
  }
  b.ids.assign(b.B * b.T, pad_id);
  for (int64_t i = 0; i < b.B; ++i) {
    std::copy(seqs[i].begin(), seqs[i].end(), b.ids.begin() + i * b.T);
    b.lengths.push_back((int32_t)seqs[i].size());
  }
  return b;
}

Batch Batch::pack() const {
  if (packed()) return *this;
  Batch p;
  p.B = B, p.T = 0, p.lengths = lengths;
  p.starts.assign(size_t(B + 1), 0);
  for (int64_t i = 0; i < B; ++i) {
    ZOF_ASSERT(lengths[size_t(i)] > 0 && lengths[size_t(i)] <= T);
    p.T = std::max<int64_t>(p.T, lengths[size_t(i)]);
    p.starts[size_t(i + 1)] = p.starts[size_t(i)] + lengths[size_t(i)];
    p.ids.insert(p.ids.end(), ids.begin() + i * T, ids.begin() + i * T + lengths[size_t(i)]);
  }
  return p;
}

Forward::Forward(const Model& model, Backend& backend, int64_t max_rows)
    : model_(model), cfg_(model.config()), be_(backend), max_rows_(max_rows) {
  const int64_t C = cfg_.hidden_size, E = std::max(C, cfg_.word_embed_proj_dim);
  const int64_t Hq = cfg_.num_heads * cfg_.head_dim, Hk = cfg_.num_kv_heads * cfg_.head_dim;
  const int64_t F = std::max(cfg_.intermediate_size, 3 * C);
  const int64_t R = std::max(max_rows, kHeadChunk);  // rows of the head's gathers
  const int64_t sizes[NBUF] = {max_rows * E,  max_rows * Hq, max_rows * Hk,
                               max_rows * Hk, max_rows * Hq, max_rows * E,
                               max_rows * F,  max_rows * F,  kHeadChunk * cfg_.vocab_size,
                               max_rows * C,  R * C,         R,
                               std::max<int64_t>(1, (int64_t)cfg_.rope_inv_freq.size()),
                               std::max<int64_t>(1, (int64_t)cfg_.rope_local_inv_freq.size())};
  const int64_t isizes[kNIBuf] = {max_rows, max_rows, max_rows, max_rows, R, R};
  try {
    for (int i = 0; i < NBUF; ++i) bufs_.push_back((float*)be_.alloc(sizes[i] * sizeof(float)));
    for (int i = 0; i < kNIBuf; ++i)
      ibufs_.push_back((int32_t*)be_.alloc(isizes[i] * sizeof(int32_t)));
    mask_ = (uint8_t*)be_.alloc(max_rows);
    fresh_.assign(model_.blocks().size() + 1, false);
    if (!cfg_.rope_inv_freq.empty())
      be_.copy_to_device(bufs_[ROPE], cfg_.rope_inv_freq.data(),
                         cfg_.rope_inv_freq.size() * sizeof(float), nullptr);
    if (!cfg_.rope_local_inv_freq.empty())
      be_.copy_to_device(bufs_[ROPE_LOCAL], cfg_.rope_local_inv_freq.data(),
                         cfg_.rope_local_inv_freq.size() * sizeof(float), nullptr);
    be_.synchronize(nullptr);
  } catch (...) {  // a device budget ran out part way: give back what was taken
    for (float* p : bufs_) be_.free(p);
    for (int32_t* p : ibufs_) be_.free(p);
    throw;
  }
}

Forward::~Forward() {
  for (float* p : bufs_) be_.free(p);
  for (int32_t* p : ibufs_) be_.free(p);
  be_.free(mask_);
  be_.free(copies_);
  be_.free(wide_);
}

void Forward::drop_copies() {
  be_.free(copies_);
  copies_ = nullptr;
  be_.free(wide_);
  wide_ = nullptr;
}

void Forward::set_weights(BlockStreamer* s) {
  ZOF_ASSERT(!s || !host_);
  if (s != weights_) drop_copies();  // the copies' layout follows where the weights live
  weights_ = s;
  weights_changed();
}

void Forward::set_host_blocks(BlockAccess* host) {
  ZOF_ASSERT(!host || !weights_);
  if (host != host_) drop_copies();  // per block under a tier
  host_ = host;
  weights_changed();
}

void Forward::set_compute(DType t) {
  ZOF_CHECK(t == DType::F32 || t == DType::BF16,
            std::string("the forward computes in fp32 or bf16, not ") + dtype_name(t));
  if (t != compute_) {  // a bf16 master's fp32 scratch holds a block's matrices in fp32 walks
    be_.free(wide_);
    wide_ = nullptr;
  }
  compute_ = t;
  weights_changed();
}

void Forward::weights_changed() {
  fresh_.assign(model_.blocks().size() + 1, false);
  wide_fresh_ = false;
}

namespace {
int64_t max_block_span(const Model& m) {
  int64_t n = 0;
  for (const Block& b : m.blocks()) n = std::max(n, b.span);
  return n;
}
// Elements of the LM head's bf16 copy outside the blocks' copies: a tied head is the token
// table, which the blocks' copies leave out (it is gathered in fp32); an untied one is a matrix
// of the head block.
int64_t tied_lm_numel(const Model& m) {
  const Param& lm = m.params()[m.lm_head()];
  return lm.gemm ? 0 : lm.numel;
}
}  // namespace

size_t Forward::streamed_compute_bytes() const {
  if (model_.storage_dtype() == DType::BF16)
    return size_t(std::max<int64_t>(wide_floats(true), 1)) * sizeof(float);
  if (compute_ != DType::BF16) return 0;
  return size_t(max_block_span(model_) + tied_lm_numel(model_)) * sizeof(uint16_t);
}

uint16_t* Forward::copy_of(int pi, int block) {
  const int64_t n = per_block() ? max_block_span(model_) + tied_lm_numel(model_)
                               : model_.storage_size();
  if (!copies_) copies_ = (uint16_t*)be_.alloc(std::max<int64_t>(n, 1) * sizeof(uint16_t));
  const Param& p = model_.params()[pi];
  const int64_t off = p.data - model_.storage();
  if (!per_block()) return copies_ + off;                   // resident: at its storage offset
  if (!p.gemm) return copies_ + max_block_span(model_);     // the tied head, after the block
  return copies_ + (off - model_.blocks()[block].offset);  // streamed: one block at a time
}

int64_t Forward::wide_floats(bool streamed) const {
  // Streamed: one block at a time (every parameter at its offset in the block), then a tied
  // head's token table (block 0's, read by the head). Resident: every vector and table, kept
  // until the weights change, then an fp32 walk's current block of matrices.
  if (streamed) return max_block_span(model_) + (model_.config().tie_embeddings ? tied_lm_numel(model_) : 0);
  int64_t n = 0;
  for (const Param& p : model_.params())
    if (!p.gemm) n += (p.numel + 15) / 16 * 16;
  return n + (compute_ == DType::F32 ? max_block_span(model_) : 0);
}

Theta Forward::held(int pi) const {
  if (weights_) return weights_->param(pi);
  return Theta(model_.param_ptr(pi), model_.storage_dtype());
}

float* Forward::wide_of(int pi, int block) {
  const bool streamed = per_block();
  if (!wide_) {
    const auto& params = model_.params();
    wide_off_.assign(params.size(), -1);
    wide_resident_ = 0;
    if (!streamed)
      for (size_t i = 0; i < params.size(); ++i)
        if (!params[i].gemm) {
          wide_off_[i] = wide_resident_;
          wide_resident_ += (params[i].numel + 15) / 16 * 16;
        }
    wide_ = (float*)be_.alloc(std::max<int64_t>(wide_floats(streamed), 1) * sizeof(float));
  }
  const Param& p = model_.params()[pi];
  const Block& b = model_.blocks()[block];
  if (streamed) {
    const bool in_block = p.offset >= b.offset && p.offset < b.offset + b.span;
    if (!in_block) {  // a tied head's token table
      ZOF_ASSERT(pi == model_.lm_head() && block == (int)model_.blocks().size() - 1);
      return wide_ + max_block_span(model_);
    }
    return wide_ + (p.offset - b.offset);
  }
  if (wide_off_[pi] >= 0) return wide_ + wide_off_[pi];
  ZOF_ASSERT(compute_ == DType::F32);
  return wide_ + wide_resident_ + (p.offset - b.offset);
}

void Forward::widen(int block, bool tied_head) {
  const auto& params = model_.params();
  auto widen_param = [&](int pi) {
    const Theta h = held(pi);
    be_.widen(h.p, h.dtype, wide_of(pi, block), params[pi].numel);
  };
  if (!per_block()) {  // resident: every vector and table once, until the weights change
    if (!wide_fresh_) {
      for (int pi = 0; pi < (int)params.size(); ++pi)
        if (!params[pi].gemm) widen_param(pi);
      wide_fresh_ = true;
    }
  } else {  // streamed: the block's, as it arrives (and a tied head's table, block 0's, held)
    for (int pi : model_.blocks()[block].params)
      if (!params[pi].gemm) widen_param(pi);
    if (tied_head && compute_ == DType::F32) widen_param(model_.lm_head());  // bf16: read as held
  }
  if (compute_ == DType::F32)
    for (int pi : model_.blocks()[block].params)
      if (params[pi].gemm) widen_param(pi);
}

void Forward::convert(int block, bool tied_head) {
  const int slot = tied_head ? (int)model_.blocks().size() : block;
  if (!per_block() && fresh_[slot]) return;  // resident copies stay until weights_changed()
  auto cast = [&](int pi) {
    const float* src = weights_ ? weights_->param(pi).f32() : model_.params()[pi].data;
    be_.cast(src, copy_of(pi, block), DType::BF16, model_.params()[pi].numel);
  };
  if (tied_head)
    cast(model_.lm_head());
  else
    for (int pi : model_.blocks()[block].params)
      if (model_.params()[pi].gemm) cast(pi);
  fresh_[slot] = true;
}

DeviceInputs Forward::upload(const Batch& b, const int32_t* ids) {
  check_batch_layout(b);
  const int64_t rows = b.rows(), V = cfg_.vocab_size;
  ZOF_CHECK(rows <= max_rows_, "batch of " + std::to_string(rows) +
                                   " tokens exceeds this forward's capacity of " +
                                   std::to_string(max_rows_));
  ZOF_CHECK(b.T <= cfg_.max_position,
            "a sequence of " + std::to_string(b.T) + " tokens is beyond the model's context of " +
                std::to_string(cfg_.max_position) + " tokens (max_position_embeddings)");
  for (int64_t i = 0; i < rows; ++i)
    ZOF_CHECK(b.ids[i] >= 0 && b.ids[i] < V, "token id " + std::to_string(b.ids[i]) +
                                                 " is outside the model's vocabulary of " +
                                                 std::to_string(V));
  std::vector<int32_t> pos(rows), embed_pos(rows);
  std::vector<uint8_t> mask(rows);
  const int32_t offset = cfg_.arch == Arch::OPT ? 2 : 0;  // OPTLearnedPositionalEmbedding's
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t t = 0; t < (b.packed() ? b.lengths[size_t(i)] : b.T); ++t) {
      pos[b.row(i, t)] = (int32_t)t;
      embed_pos[b.row(i, t)] = (int32_t)t + offset;
      mask[b.row(i, t)] = t < b.lengths[size_t(i)];
    }
  // From pageable host memory: the copies are staged before the calls return, so the vectors
  // may go at the end of this function.
  int32_t* dids = ibuf(ids ? kLocal : kIds);
  be_.copy_to_device(dids, ids ? ids : b.ids.data(), rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(ibuf(kPos), pos.data(), rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(ibuf(kEmbedPos), embed_pos.data(), rows * sizeof(int32_t), nullptr);
  if (!b.packed()) be_.copy_to_device(mask_, mask.data(), rows, nullptr);
  be_.synchronize(nullptr);
  starts_ = b.starts;
  return DeviceInputs{dids,       ibuf(kPos), ibuf(kEmbedPos),
                      b.packed() ? nullptr : mask_,
                      b.B,        b.T,        rows,
                      b.packed() ? starts_.data() : nullptr};
}

namespace {
// Forward's buffers for one layer: the hidden state updated in place, one normed copy, the
// attention's q/k/v/out, one projection output and the FFN's two halves (the fused QKV shares the
// first; an ungated activation runs in place); RoPE's table.
graph::Frame<float> layer_frame(const graph::Dims& d, float* const* bufs, float* h,
                                const DeviceInputs& in) {
  graph::Frame<float> f;
  using namespace graph;
  f.set({kHIn, kH1, kH2, kHOut}, h);
  f.v[kXn1] = bufs[XN];
  // Pre-norm: LN2(h1) beside h1 (the residual); post-norm: h1 normed in place is the residual.
  f.v[kX2] = d.pre_norm ? bufs[XN] : h;
  f.set({kQKV, kF1, kAct}, bufs[FF1]);
  f.set({kAttOut, kFfnOut, kAttN, kFfnN}, bufs[TMP]);  // Gemma's output norms run in place
  f.v[kQ] = bufs[Q], f.v[kK] = bufs[K], f.v[kV] = bufs[V], f.v[kAtt] = bufs[ATT];
  f.v[kQp] = bufs[Q], f.v[kKp] = bufs[K];  // Qwen3's q_norm and k_norm run in place
  f.v[kF2] = bufs[FF2];
  f.rows = in.rows, f.B = in.B, f.S = in.T, f.pos = in.pos, f.key_mask = in.key_mask;
  f.starts = in.starts;
  f.inv_freq = bufs[ROPE];
  f.inv_freq_local = bufs[ROPE_LOCAL];
  return f;
}

// The primal ops with attention over a KV cache (incremental decoding): the layer's keys and
// values are appended at cache.length and each query attends to all length + T keys.
class CachedPrimal : public graph::Primal<graph::BackendKernels> {
 public:
  CachedPrimal(graph::BackendKernels& k, const graph::Dims& d, graph::Frame<float>& f,
               KVCache& cache, int layer)
      : Primal(k, d, f), cache_(cache), layer_(layer) {}
  void attention(graph::Value out, graph::Value q, graph::Value kk, graph::Value vv) {
    const int64_t B = f_.B, T = f_.S, Hq = d_.Hq, Hk = d_.Hk;
    const int64_t start = cache_.length, Tk = start + T;
    ZOF_CHECK(Tk <= cache_.capacity, "generation ran past the KV cache capacity of " +
                                         std::to_string(cache_.capacity) + " tokens");
    float* kc = cache_.k[layer_];
    float* vc = cache_.v[layer_];
    for (int64_t b = 0; b < B; ++b) {
      float* kb = kc + b * cache_.capacity * Hk;
      float* vb = vc + b * cache_.capacity * Hk;
      k_.be.copy_device(kb + start * Hk, v(kk) + b * T * Hk, T * Hk * sizeof(float), nullptr);
      k_.be.copy_device(vb + start * Hk, v(vv) + b * T * Hk, T * Hk * sizeof(float), nullptr);
      k_.be.attention(v(q) + b * T * Hq, kb, vb, v(out) + b * T * Hq, nullptr, 1, T, Tk, d_.H,
                      d_.Hkv, d_.D, start, graph::attn_scale<graph::BackendKernels>(d_),
                      d_.window, d_.attn_softcap, k_.attn);
    }
  }

 private:
  KVCache& cache_;
  int layer_;
};
}  // namespace

void Forward::embed(const EmbedWeights& w, const int32_t* ids, const int32_t* embed_pos,
                    int64_t rows, float* h) {
  const graph::Dims d = graph::Dims::of(cfg_);
  graph::Frame<float> f;
  f.v[graph::kEmb] = buf(XN);
  f.v[graph::kHOut] = h;
  f.rows = rows, f.ids = ids, f.embed_pos = embed_pos;
  graph::BackendKernels k{be_};
  k.attn = compute_;
  graph::Primal o(k, d, f);
  graph::embed(o, d, w);
}

void Forward::layer(int li, const LayerWeights& w, float* h, const DeviceInputs& in,
                    KVCache* cache) {
  ZOF_ASSERT(in.rows <= max_rows_ && (!cache || !in.starts));
  const graph::Dims d = graph::Dims::of(cfg_, li);
  graph::Frame<float> f = layer_frame(d, bufs_.data(), h, in);
  graph::BackendKernels k{be_};
  k.attn = compute_;
  if (cache) {
    CachedPrimal o(k, d, f, *cache, li);
    graph::layer(o, d, w);
  } else {
    graph::Primal o(k, d, f);
    graph::layer(o, d, w);
  }
}

void Forward::head_logits(const HeadWeights& w, const float* h, int64_t rows, float* logits) {
  const graph::Dims d = graph::Dims::of(cfg_);
  graph::BackendKernels k{be_};
  k.attn = compute_;
  for (int64_t r0 = 0; r0 < rows; r0 += max_rows_) {
    graph::Frame<float> f;
    f.rows = std::min(max_rows_, rows - r0);
    f.v[graph::kHIn] = const_cast<float*>(h) + r0 * d.C;  // read only
    f.v[graph::kHn] = buf(XN);
    f.v[graph::kHo] = buf(TMP);
    f.set({graph::kLogitsRaw, graph::kLogits}, logits + r0 * d.V);  // the soft-cap in place
    graph::Primal o(k, d, f);
    graph::head_logits(o, d, w);
  }
}

int64_t Forward::head_width() const { return graph::Dims::of(cfg_).E; }

void Forward::head_features(const HeadWeights& w, const float* h, int64_t rows, float* x) {
  ZOF_ASSERT(rows <= max_rows_ && x != h);
  const graph::Dims d = graph::Dims::of(cfg_);
  graph::Frame<float> f;
  f.rows = rows;
  f.v[graph::kHIn] = const_cast<float*>(h);  // read only
  f.v[graph::kHn] = w.project_out ? buf(XN) : x;
  f.v[graph::kHo] = x;
  graph::BackendKernels k{be_};
  k.attn = compute_;
  graph::Primal o(k, d, f);
  const graph::Value out = graph::head_features(o, d, w);
  if (f.v[out] != x) be_.copy_device(x, f.v[out], rows * d.C * sizeof(float), nullptr);
}

void Forward::head_nll(const HeadWeights& w, const float* h, int64_t rows, const int32_t* targets,
                       float* nll) {
  // Only rows with a target need logits.
  const ScoredRows scored(targets, rows, cfg_.vocab_size);
  std::fill(nll, nll + rows, 0.f);
  std::vector<float> out(scored.rows.size());
  head_nll_at(w, h, scored.rows.data(), scored.targets.data(), scored.size(), out.data());
  for (int64_t i = 0; i < scored.size(); ++i) nll[scored.rows[i]] = out[i];
}

void Forward::head_nll_at(const HeadWeights& w, const float* h, const int32_t* sel,
                          const int32_t* tg, int64_t n_pairs, float* nll) {
  const graph::Dims d = graph::Dims::of(cfg_);
  const int64_t C = d.C;
  // The rows are gathered (the embedding op, with h as the table; a row may come more than
  // once), then logits formed kHeadChunk at a time.
  graph::BackendKernels k{be_};
  k.attn = compute_;
  for (int64_t s0 = 0; s0 < n_pairs; s0 += kHeadChunk) {
    const int64_t m = std::min<int64_t>(kHeadChunk, n_pairs - s0);
    // A lone pair runs twice: a product of one row is the backends' decoding path, whose sums
    // may differ in the last bits from the same row among others (Backend::matmul).
    const int64_t n = std::max<int64_t>(m, 2);
    const int32_t one_sel[2] = {sel[s0], sel[s0]}, one_tg[2] = {tg[s0], tg[s0]};
    be_.copy_to_device(ibuf(kSel), m == 1 ? one_sel : sel + s0, n * sizeof(int32_t), nullptr);
    be_.copy_to_device(ibuf(kTargets), m == 1 ? one_tg : tg + s0, n * sizeof(int32_t), nullptr);
    be_.embedding(ibuf(kSel), h, buf(HS), n, C, false);
    head_logits(w, buf(HS), n, buf(LOGITS));
    graph::Frame<float> f;
    f.rows = n, f.targets = ibuf(kTargets);
    f.v[graph::kLogits] = buf(LOGITS), f.v[graph::kNll] = buf(NLL);
    graph::Primal o(k, d, f);
    o.cross_entropy(graph::kNll, graph::kLogits);
    be_.copy_to_host(nll + s0, buf(NLL), m * sizeof(float), nullptr);
    be_.synchronize(nullptr);
  }
}

// ---- the whole-model methods: the walk over blocks at the model's weights --------------------

void Forward::acquire(int block) {
  if (weights_) weights_->acquire(block);
  if (host_) host_->acquire(block, false);
}
void Forward::release(int block) {
  if (weights_) weights_->release(block, false);
  if (host_) host_->release(block, false);
}
// The views of block b: fp32 from the model or the streamer, the matrices (and a tied LM head,
// in the head's views) from the bf16 copies in a bf16 walk.
Model::ParamLocator Forward::locator(int block) {
  const bool bf16 = compute_ == DType::BF16;
  const bool head = block == (int)model_.blocks().size() - 1;
  const int lm = model_.lm_head();
  const bool tied = !model_.params()[lm].gemm;
  if (model_.storage_dtype() == DType::BF16) {  // a bf16 master: read as held, or widened
    widen(block, head && tied);
    return [this, block, bf16, head, lm](int pi) -> Weight {
      if (bf16 && (model_.params()[pi].gemm || (head && pi == lm)))
        return Weight(held(pi).p, DType::BF16);
      return wide_of(pi, block);
    };
  }
  if (bf16) {
    convert(block, false);
    if (head && tied) convert(block, true);
  }
  return [this, block, bf16, head, lm](int pi) -> Weight {
    const float* f = weights_ ? weights_->param(pi).f32() : model_.params()[pi].data;
    if (!bf16 || !(model_.params()[pi].gemm || (head && pi == lm))) return f;
    return Weight(copy_of(pi, block), DType::BF16);
  };
}
EmbedWeights Forward::embed_weights() { return model_.embed(locator(0)); }
LayerWeights Forward::layer_weights(int li) { return model_.layer(li, locator(li + 1)); }
HeadWeights Forward::head_weights() {
  return model_.head(locator((int)model_.blocks().size() - 1));
}
std::vector<int> Forward::head_blocks() const {
  const int last = (int)model_.blocks().size() - 1;
  if (cfg_.tie_embeddings) return {last, 0};
  return {last};
}

// The embedding and every layer into buf(HID), reading the model's storage, or block by block
// from the streamer (a device backend); with a cache, attention over it (decode_step).
void Forward::walk_blocks(const DeviceInputs& in, KVCache* cache) {
  float* h = buf(HID);
  if (per_block()) {
    std::vector<int> order;
    for (int b = 0; b <= (int)cfg_.num_layers; ++b) order.push_back(b);
    for (int b : head_blocks()) order.push_back(b);
    if (weights_)
      weights_->begin_walk(std::move(order));
    else
      host_->begin_walk(std::move(order));
  }
  acquire(0);
  embed(embed_weights(), in.ids, in.embed_pos, in.rows, h);
  release(0);
  for (int i = 0; i < cfg_.num_layers; ++i) {
    acquire(i + 1);
    layer(i, layer_weights(i), h, in, cache);
    release(i + 1);
  }
}

void Forward::hidden(const Batch& batch) {
  const DeviceInputs in = upload(batch);
  walk_blocks(in, nullptr);
}

void Forward::logits_to_host(const float* h, int64_t n, float* out) {
  const int64_t V = cfg_.vocab_size;
  const std::vector<int> hb = head_blocks();
  for (int b : hb) acquire(b);
  const HeadWeights w = head_weights();
  for (int64_t r0 = 0; r0 < n; r0 += kHeadChunk) {
    const int64_t m = std::min(kHeadChunk, n - r0);
    // A last chunk of one row runs with the row before it: a product of one row is the
    // backends' decoding path (Backend::matmul), with other bits than the row has in any batch.
    const int64_t lead = m == 1 && r0 > 0 ? 1 : 0;
    head_logits(w, h + (r0 - lead) * cfg_.hidden_size, m + lead, buf(LOGITS));
    be_.copy_to_host(out + r0 * V, buf(LOGITS) + lead * V, m * V * sizeof(float), nullptr);
  }
  be_.synchronize(nullptr);
  for (int b : hb) release(b);
}

void Forward::logits(const Batch& batch, std::vector<float>& out) {
  hidden(batch);
  const int64_t rows = batch.rows();
  out.resize(rows * cfg_.vocab_size);
  logits_to_host(buf(HID), rows, out.data());
}

void Forward::nll(const Batch& batch, const int32_t* targets, float* nll) {
  hidden(batch);
  const std::vector<int> hb = head_blocks();
  for (int b : hb) acquire(b);
  head_nll(head_weights(), buf(HID), batch.rows(), targets, nll);
  for (int b : hb) release(b);
}

void Forward::nll_at(const Batch& batch, const int32_t* rows, const int32_t* targets, int64_t n,
                     float* nll) {
  const int64_t total = batch.rows();
  for (int64_t i = 0; i < n; ++i) {
    ZOF_CHECK(rows[i] >= 0 && rows[i] < total,
              "scored row " + std::to_string(rows[i]) + " is outside the batch's " +
                  std::to_string(total) + " positions");
    ZOF_CHECK(targets[i] >= 0 && targets[i] < cfg_.vocab_size,
              "target token id " + std::to_string(targets[i]) + " is outside the vocabulary of " +
                  std::to_string(cfg_.vocab_size));
  }
  if (n == 0) return;
  hidden(batch);
  const std::vector<int> hb = head_blocks();
  for (int b : hb) acquire(b);
  head_nll_at(head_weights(), buf(HID), rows, targets, n, nll);
  for (int b : hb) release(b);
}

void Forward::next_token_nll(const Batch& batch, std::vector<float>& out) {
  std::vector<int32_t> targets(batch.rows(), -1);
  for (int64_t b = 0; b < batch.B; ++b)
    for (int64_t t = 0; t + 1 < batch.lengths[b]; ++t)
      targets[batch.row(b, t)] = batch.ids[batch.row(b, t + 1)];
  out.resize(batch.rows());
  nll(batch, targets.data(), out.data());
}

KVCache& KVCache::operator=(KVCache&& o) noexcept {
  if (this != &o) {
    release();
    B = o.B, capacity = o.capacity, length = o.length;
    k = std::move(o.k), v = std::move(o.v);
    backend = o.backend;
    o.k.clear(), o.v.clear();
    o.backend = nullptr;
  }
  return *this;
}

void KVCache::release() {
  if (backend) {
    for (float* p : k) backend->free(p);
    for (float* p : v) backend->free(p);
  }
  k.clear(), v.clear();
}

KVCache::~KVCache() { release(); }

KVCache Forward::make_cache(int64_t B, int64_t capacity) const {
  KVCache c;
  c.B = B;
  c.capacity = std::min(capacity, cfg_.max_position);
  c.backend = &be_;
  const size_t bytes = (size_t)(B * c.capacity * cfg_.num_kv_heads * cfg_.head_dim) * sizeof(float);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    c.k.push_back((float*)be_.alloc(std::max<size_t>(bytes, 4)));
    c.v.push_back((float*)be_.alloc(std::max<size_t>(bytes, 4)));
  }
  return c;
}

void Forward::decode_step(const int32_t* ids, int64_t B, int64_t T, KVCache& cache,
                          std::vector<float>& last_logits) {
  const int64_t rows = B * T, C = cfg_.hidden_size, V = cfg_.vocab_size;
  ZOF_CHECK(B == cache.B, "batch size differs from the KV cache's");
  ZOF_CHECK(rows <= max_rows_, "decode step of " + std::to_string(rows) +
                                   " tokens exceeds this forward's capacity");
  for (int64_t i = 0; i < rows; ++i)
    ZOF_CHECK(ids[i] >= 0 && ids[i] < V, "token id " + std::to_string(ids[i]) +
                                             " is outside the model's vocabulary of " +
                                             std::to_string(V));
  ZOF_CHECK(cache.length + T <= cfg_.max_position,
            "position " + std::to_string(cache.length + T - 1) +
                " is beyond the model's context of " + std::to_string(cfg_.max_position) +
                " tokens (max_position_embeddings)");
  std::vector<int32_t> pos(rows), embed_pos(rows);
  const int32_t offset = cfg_.arch == Arch::OPT ? 2 : 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      pos[b * T + t] = (int32_t)(cache.length + t);
      embed_pos[b * T + t] = pos[b * T + t] + offset;
    }
  be_.copy_to_device(ibuf(kIds), ids, rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(ibuf(kPos), pos.data(), rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(ibuf(kEmbedPos), embed_pos.data(), rows * sizeof(int32_t), nullptr);
  DeviceInputs in;
  in.ids = ibuf(kIds), in.pos = ibuf(kPos), in.embed_pos = ibuf(kEmbedPos);
  in.B = B, in.T = T, in.rows = rows;
  walk_blocks(in, &cache);
  float* h = buf(HID);
  cache.length += T;
  // Each row's last position.
  be_.copy_device_2d(buf(HS), C * sizeof(float), h + (T - 1) * C, T * C * sizeof(float),
                     C * sizeof(float), B, nullptr);
  last_logits.resize(B * V);
  logits_to_host(buf(HS), B, last_logits.data());
}

}  // namespace zof
