// The JVP walk (jvp.h) as a template over a kernel set K (model/graph_ops.h): embed -> layers ->
// head, running block_graph.h's graphs with the primal ops once per layer (keeping that layer's
// values) and then, per direction, the tangent ops over the same graph. JVPEstimator is
// JVPWalk<graph::JvpBackendKernels> (fp32 through the Backend, its matrix products fp32 or
// bf16); the tests run it over plain float64
// loops as the oracle. K::T = float keeps every buffer in the backend's memory (the device, on a
// device backend); any other T lives in host vectors (host backends only).
#pragma once
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "model/block_graph.h"
#include "model/graph_ops.h"
#include "model/scored_rows.h"
#include "util/philox.h"
#include "zof/error.h"
#include "zo/jvp.h"
#include "zof/zo.h"
#include "zof/streaming.h"

namespace zof {

namespace jvp_detail {

// z(key, tensor, i) for i < n: philox.h's lane-parallel z_groups16 on whole chunks of 64, the
// scalar z_group on the tail, the same bits as Backend::zo_pass perturbs with.
inline void fill_z(float* z, int64_t n, uint32_t tensor, const ZKey& key) {
  constexpr int64_t kChunk = 64;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 64)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, m = std::min(kChunk, n - i0);
    const uint32_t g0 = (uint32_t)(i0 / 4);
    if (m == kChunk) {
      z_groups16(key, tensor, g0, z + i0);
      continue;
    }
    float t[kChunk];
    for (int64_t g = 0; g * 4 < m; ++g) z_group(key, tensor, g0 + (uint32_t)g, t + 4 * g);
    std::copy(t, t + m, z + i0);
  }
}

// The walk's memory: float64 (the oracle, host backends only) in host vectors, everything else
// (fp32, the inputs' ints) in the backend's memory (the device, on a device backend).
template <class T>
class Buf {
 public:
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept { swap(o); }
  Buf& operator=(Buf&& o) noexcept {
    swap(o);
    return *this;
  }
  ~Buf() {
    if (be_) be_->free(p_);
  }
  // At least n elements (old contents are not kept).
  void reserve(Backend& be, int64_t n) {
    n = std::max<int64_t>(n, 1);
    if (n <= n_) return;
    if constexpr (!std::is_same_v<T, double>) {
      if (be_) be_->free(p_);
      p_ = nullptr;
      be_ = &be;
      p_ = static_cast<T*>(be.alloc(size_t(n) * sizeof(T)));
    } else {
      host_.assign(size_t(n), T(0));
      p_ = host_.data();
    }
    n_ = n;
  }
  T* data() const { return p_; }

 private:
  void swap(Buf& o) {
    std::swap(be_, o.be_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    host_.swap(o.host_);
  }
  Backend* be_ = nullptr;
  T* p_ = nullptr;
  int64_t n_ = 0;
  std::vector<T> host_;
};

}  // namespace jvp_detail

template <class K>
class JVPWalk {
 public:
  using T = typename K::T;
  static constexpr bool kFp32 = std::is_same_v<T, float>;

  // max_rows: the most tokens (Batch::rows) of one micro-batch; directions: the per-direction buffers
  // allocated up front. k: the kernel set (its backend is `backend`).
  JVPWalk(const Model& model, Backend& backend, int64_t max_rows, int directions, K k)
      : model_(model), cfg_(model.config()), be_(backend), k_(std::move(k)), max_rows_(max_rows),
        d_(graph::Dims::of(model.config())) {
    ZOF_CHECK(max_rows >= 1, "the JVP estimator needs room for at least one token");
    allocate();
    reserve_directions(directions);
  }
  JVPWalk(const JVPWalk&) = delete;
  JVPWalk& operator=(const JVPWalk&) = delete;

  JVPSums directional_derivatives(const std::vector<ZKey>& keys,
                                  const std::vector<LossBatch>& micro) {
    ZOF_CHECK(!keys.empty(), "the JVP estimator needs at least one direction (--queries >= 1)");
    for (const LossBatch& lb : micro)
      ZOF_CHECK(lb.choices.empty(), "--estimator jvp differentiates the token loss only: use "
                                    "--objective lm with it, or --estimator spsa");
    return walk(keys, nullptr, 0.0, micro);
  }
  JVPSums loss_along(const ZKey& key, double shift, const std::vector<LossBatch>& micro) {
    return walk({}, &key, shift, micro);
  }
  void set_weights(BlockStreamer* s) {
    ZOF_CHECK(!s || kFp32, "only the float JVP walk reads streamed weights (not the float64 one)");
    weights_ = s;
  }

 private:
  template <class U>
  using Buf = jvp_detail::Buf<U>;
  using Frame = graph::Frame<T>;

  void allocate() {
    const auto& blocks = model_.blocks();
    int64_t span = 1;
    for (size_t i = 1; i < blocks.size(); ++i) span = std::max(span, blocks[i].span);
    z_block_.reserve(be_, span);
    zf_.assign(std::max(span, blocks[0].span), 0.f);
    const int64_t R = max_rows_, CE = std::max(d_.C, d_.E);
    for (auto* b : {&h_, &hin_, &xn1_, &h1_, &x2_, &h2_, &tmp_, &dx_, &dtmp_, &dh1_, &dx2_, &dh2_})
      b->reserve(be_, R * CE);
    for (auto* b : {&q_, &att_, &dq_, &datt_}) b->reserve(be_, R * d_.Hq);
    for (auto* b : {&k_buf_, &v_, &dk_, &dv_}) b->reserve(be_, R * d_.Hk);
    for (auto* b : {&f1_, &f2_, &a_, &df1_, &df2_, &da_}) b->reserve(be_, R * d_.I);
    if (cfg_.arch == Arch::GPT2) {
      qkv_.reserve(be_, R * 3 * d_.C);
      dqkv_.reserve(be_, R * 3 * d_.C);
    }
    if (d_.qk_norm) {  // Qwen3: q and k before their norms, kept for the tangent
      for (auto* b : {&qp_, &dqp_}) b->reserve(be_, R * d_.Hq);
      for (auto* b : {&kp_, &dkp_}) b->reserve(be_, R * d_.Hk);
    }
    if (d_.sandwich) {  // Gemma: the FFN's output kept beside the attention's (their norms'
      // tangents read both); the normed outputs, primal and tangent, are used once each
      for (auto* b : {&ffo_, &normed_, &dnormed_}) b->reserve(be_, R * d_.C);
    }
    // RoPE's tables, once (fp32 in every walk: the angle is fp32, backend.h).
    for (auto [inv, buf] : {std::pair{&cfg_.rope_inv_freq, &inv_freq_},
                            std::pair{&cfg_.rope_local_inv_freq, &inv_freq_local_}}) {
      buf->reserve(be_, std::max<int64_t>(1, (int64_t)inv->size()));
      if (!inv->empty())
        be_.copy_to_device(buf->data(), inv->data(), inv->size() * sizeof(float), nullptr);
    }
    be_.synchronize(nullptr);
    const int64_t HC = kHeadChunk;
    if constexpr (kFp32) {
      // The largest product: a layer's (R rows) or the LM head's (kHeadChunk rows of V).
      mmtmp_.reserve(be_, std::max(R * std::max({3 * d_.C, d_.I, d_.Hq, CE}), HC * d_.V));
      if constexpr (requires { k_.mmtmp; }) k_.mmtmp = mmtmp_.data();
      // The largest tensor's worth of zeros, for z.
      int64_t most = 1;
      for (const Param& p : model_.params()) most = std::max(most, p.numel);
      zeros_.reserve(be_, most);
      if constexpr (requires { k_.products; }) {  // a bf16 walk's rounded weights and z
        if (k_.products == DType::BF16) {
          // What one block's products multiply by, each copy from a multiple of 64 elements:
          // a layer's matrices, the embedding's (OPT's project_in), the head's and, tied, the
          // token table beside them. The weights are rounded once a block, a direction's z
          // once a block and direction; neither region starts over within a block.
          const auto& params = model_.params();
          const int table = model_.token_table();
          const bool tied = model_.lm_head() == table;
          int64_t need = 0;
          for (size_t b = 0; b < model_.blocks().size(); ++b) {
            int64_t n = 0;
            for (int pi : model_.blocks()[b].params)
              if (params[size_t(pi)].gemm) n += params[size_t(pi)].numel + 64;
            if (b + 1 == model_.blocks().size() && tied) n += params[size_t(table)].numel + 64;
            need = std::max(need, n);
          }
          const int64_t wn = need + 64, zn = need + 64;
          w16_.reserve(be_, wn);
          z16_.reserve(be_, zn);
          k_.weights.base = w16_.data(), k_.weights.capacity = wn;
          k_.z.base = z16_.data(), k_.z.capacity = zn;
        }
      }
      const std::vector<float> z0(size_t(std::min<int64_t>(most, 1 << 20)), 0.f);
      for (int64_t i = 0; i < most; i += (int64_t)z0.size())
        be_.copy_to_device(zeros_.data() + i, z0.data(),
                           size_t(std::min<int64_t>((int64_t)z0.size(), most - i)) * sizeof(float),
                           nullptr);
      be_.synchronize(nullptr);
    }
    for (auto* b : {&hs_, &dhs_, &hn_, &dhn_, &ho_, &dho_}) b->reserve(be_, HC * CE);
    logits_.reserve(be_, HC * d_.V);
    dlogits_.reserve(be_, HC * d_.V);
    if (d_.final_softcap != 0.f) {  // Gemma 2: the logits before the cap, for its tangent
      raw_logits_.reserve(be_, HC * d_.V);
      draw_logits_.reserve(be_, HC * d_.V);
    }
    nll_.reserve(be_, HC);
    dnll_.reserve(be_, HC);
    for (auto [b, n] : {std::pair{&ids_, R}, {&pos_, R}, {&tok_pos_, R}, {&sel_, HC}, {&tg_, HC}})
      b->reserve(be_, n);
    mask_.reserve(be_, R);
  }
  // Per direction: the embedding block's z and the tangent hidden state.
  void reserve_directions(int q) {
    while ((int)z_embed_.size() < q) {
      Buf<T> z, d;  // both allocated before either is kept: the lists stay the same length
      z.reserve(be_, model_.blocks()[0].span);
      d.reserve(be_, max_rows_ * d_.C);
      z_embed_.push_back(std::move(z));
      dh_.push_back(std::move(d));
    }
  }

  // ---- weights and directions of a block, in T ----
  // z(key) of block b into out (laid out as the block's span in storage).
  void block_z(int b, const ZKey& key, Buf<T>& out) {
    forget_z();
    const Block& blk = model_.blocks()[b];
    out.reserve(be_, blk.span);
    const auto& params = model_.params();
    if constexpr (kFp32) {
      // On the backend: theta = 0, eps = 1 gives z exactly, the same bits as fill_z.
      for (int pi : blk.params) {
        const int64_t off = (params[pi].data - model_.storage()) - blk.offset;
        be_.zo_pass(zeros_.data(), params[pi].numel, (uint32_t)pi, 0, nullptr, 0, 0.f, &key, 1.f,
                    out.data() + off, nullptr);
      }
    } else {
      for (int pi : blk.params) {
        const int64_t off = (params[pi].data - model_.storage()) - blk.offset;
        jvp_detail::fill_z(zf_.data() + off, params[pi].numel, (uint32_t)pi, key);
      }
      for (int64_t i = 0; i < blk.span; ++i) out.data()[i] = T(zf_[i]);
    }
  }
  // Block b's weights in T: theta + shift z(shift_key) (formed in double, then rounded to T).
  // fp32 without a shift: the weights themselves (a streamer's device block, held until
  // done_with(b)). Otherwise formed on the host: host backends only.
  const T* block_weights(int b, Buf<T>& out, const ZKey* shift_key, double shift) {
    forget_weights();
    const Block& blk = model_.blocks()[b];
    if constexpr (kFp32)
      if (!shift_key) return weights_ ? weights_->acquire(b) : model_.storage() + blk.offset;
    ZOF_CHECK(!weights_, "the shifted (finite-difference) JVP walk runs on host backends only");
    const float* src = model_.storage() + blk.offset;
    out.reserve(be_, blk.span);
    if (shift_key) {
      const auto& params = model_.params();
      std::fill(zf_.begin(), zf_.begin() + blk.span, 0.f);
      for (int pi : blk.params) {
        const int64_t off = (params[pi].data - model_.storage()) - blk.offset;
        jvp_detail::fill_z(zf_.data() + off, params[pi].numel, (uint32_t)pi, *shift_key);
      }
    }
    for (int64_t i = 0; i < blk.span; ++i)
      out.data()[i] = T(double(src[i]) + (shift_key ? shift * double(zf_[i]) : 0.0));
    return out.data();
  }
  // Weights or z may change at the pointers the kernels have seen: a bf16 walk rounds them anew.
  void forget_weights() {
    if constexpr (requires { k_.forget_weights(); }) k_.forget_weights();
  }
  void forget_z() {
    if constexpr (requires { k_.forget_z(); }) k_.forget_z();
  }
  void done_with(int b, const ZKey* shift_key) {
    if (kFp32 && weights_ && !shift_key) weights_->release(b, false);
  }
  // The sum of n per-row values in double. fp32 (the product's walk): read back, each rounded
  // to the row quantum (zo.h), so that the total does not depend on the order of rows, chunks
  // or ranks. The float64 oracle keeps every digit (its central differences need them).
  double sum_of(const T* x, int64_t n) {
    std::vector<double> hx(size_t(std::max<int64_t>(n, 0)));
    if constexpr (kFp32) {
      std::vector<float> f(hx.size());
      be_.copy_to_host(f.data(), x, f.size() * sizeof(float), nullptr);
      be_.synchronize(nullptr);
      std::copy(f.begin(), f.end(), hx.begin());
    } else {
      std::copy(x, x + n, hx.begin());
    }
    double s = 0;
    for (double v : hx) s += kFp32 ? row_quantized(v) : v;
    return s;
  }

  // ---- the model's views moved into a block's copy (base) or the embedding's (embed_base) ----
  const T* at(const float* p, int b, const T* base, const T* embed_base) const {
    if (!p) return nullptr;
    const auto& blocks = model_.blocks();
    const int64_t off = p - model_.storage();
    if (off >= blocks[b].offset && off < blocks[b].offset + blocks[b].span)
      return base + (off - blocks[b].offset);
    ZOF_ASSERT(embed_base && off >= blocks[0].offset && off < blocks[0].offset + blocks[0].span);
    return embed_base + (off - blocks[0].offset);
  }
  EmbedT<const T*> embed_view(const T* base) const {
    return map_slots(model_.embed(), [&](Weight p) { return at(p.f32(), 0, base, nullptr); });
  }
  LayerT<const T*> layer_view(int li, const T* base) const {
    return map_slots(model_.layer(li),
                     [&](Weight p) { return at(p.f32(), li + 1, base, nullptr); });
  }
  HeadT<const T*> head_view(const T* base, const T* embed_base) const {
    const int b = (int)model_.blocks().size() - 1;
    return map_slots(model_.head(), [&](Weight p) { return at(p.f32(), b, base, embed_base); });
  }
  // A weight view paired with its z view, the tangent ops' weights.
  template <template <class> class View>
  static View<graph::Dual<T>> dual(const View<const T*>& w, const View<const T*>& z) {
    return zip_slots(w, z, [](const T* a, const T* b) { return graph::Dual<T>{a, b}; });
  }

  // ---- the frames: which buffer holds each value ----
  // A layer's primal keeps every value it needs later (the tangent reads them); its input is a
  // copy of h (hin) and its output lands in h.
  Frame layer_primal_frame() {
    using namespace graph;
    Frame f;
    f.v[kHIn] = hin_.data(), f.v[kXn1] = xn1_.data(), f.v[kQKV] = qkv_.data();
    f.v[kQ] = q_.data(), f.v[kK] = k_buf_.data(), f.v[kV] = v_.data(), f.v[kAtt] = att_.data();
    f.v[kQp] = qp_.data(), f.v[kKp] = kp_.data();
    f.set({kAttOut, kFfnOut}, tmp_.data());
    if (d_.sandwich) f.v[kFfnOut] = ffo_.data(), f.set({kAttN, kFfnN}, normed_.data());
    f.v[kH1] = h1_.data(), f.v[kX2] = x2_.data(), f.v[kF1] = f1_.data(), f.v[kF2] = f2_.data();
    f.v[kAct] = a_.data(), f.v[kH2] = h2_.data(), f.v[kHOut] = h_.data();
    f.v[kEmb] = xn1_.data();
    return f;
  }
  // A layer's tangent reads and writes direction j's hidden tangent dh in place.
  Frame layer_tangent_frame(T* dh) {
    using namespace graph;
    Frame f;
    f.set({kHIn, kHOut}, dh);
    f.v[kXn1] = dx_.data(), f.v[kQKV] = dqkv_.data();
    f.v[kQ] = dq_.data(), f.v[kK] = dk_.data(), f.v[kV] = dv_.data(), f.v[kAtt] = datt_.data();
    f.v[kQp] = dqp_.data(), f.v[kKp] = dkp_.data();
    f.set({kAttOut, kFfnOut}, dtmp_.data());
    if (d_.sandwich) f.set({kAttN, kFfnN}, dnormed_.data());
    f.v[kH1] = dh1_.data(), f.v[kX2] = dx2_.data(), f.v[kF1] = df1_.data();
    f.v[kF2] = df2_.data(), f.v[kAct] = da_.data();
    // Pre-norm: the last add writes the output tangent in place (kHIn is last read before it).
    f.v[kH2] = d_.pre_norm ? dh : dh2_.data();
    f.v[kEmb] = dx_.data();
    return f;
  }
  Frame head_frame(bool tangent) {
    using namespace graph;
    Frame f;
    f.v[kHIn] = (tangent ? dhs_ : hs_).data(), f.v[kHn] = (tangent ? dhn_ : hn_).data();
    f.v[kHo] = (tangent ? dho_ : ho_).data();
    f.v[kLogits] = (tangent ? dlogits_ : logits_).data(), f.v[kNll] = (tangent ? dnll_ : nll_).data();
    f.v[kLogitsRaw] = (tangent ? draw_logits_ : raw_logits_).data();
    return f;
  }
  // The batch's inputs (upload's), its sequences (a packed batch's starts are host memory).
  void set_inputs(Frame& f, const Batch& b) {
    f.rows = b.rows(), f.B = b.B, f.S = b.T;
    f.ids = ids_.data(), f.embed_pos = tok_pos_.data(), f.pos = pos_.data();
    f.inv_freq = inv_freq_.data(), f.inv_freq_local = inv_freq_local_.data();
    f.key_mask = b.packed() ? nullptr : mask_.data();
    f.starts = b.packed() ? b.starts.data() : nullptr;
  }

  // ---- the head: rows hs (n, C) -> logits (n, V) -> nll; with z, their tangents ----
  // Returns the sum of nll; *dsum gets the sum of its tangent when z is given.
  // The first `used` rows are summed.
  double head_chunk(const HeadT<const T*>& w, const HeadT<const T*>* z, int64_t n, int64_t used,
                    double* dsum) {
    Frame p = head_frame(false);
    p.rows = n, p.targets = tg_.data();
    graph::Primal<K> po(k_, d_, p);
    graph::head_loss(po, d_, w);
    const double s = sum_of(nll_.data(), used);
    if (!z) return s;
    Frame t = head_frame(true);
    graph::Tangent<K> to(k_, d_, p, t);
    graph::head_loss(to, d_, dual(w, *z));
    *dsum = sum_of(dnll_.data(), used);
    return s;
  }

  void upload(const Batch& b);
  void micro_batch(const LossBatch& lb, const std::vector<ZKey>& keys, const ZKey* shift_key,
                   double shift, const T* w_emb, JVPSums& out);
  JVPSums walk(const std::vector<ZKey>& keys, const ZKey* shift_key, double shift,
               const std::vector<LossBatch>& micro);

  const Model& model_;
  const ModelConfig& cfg_;
  Backend& be_;
  K k_;
  int64_t max_rows_;
  graph::Dims d_;

  // Where fp32 weights come from: the model's storage, or a streamer's device blocks.
  BlockStreamer* weights_ = nullptr;
  // Weights in T (float without a shift reads the model's own storage instead), z in T.
  Buf<T> w_embed_, w_block_, z_block_;
  std::vector<Buf<T>> z_embed_;  // per direction: the tied LM head needs it at the end
  std::vector<float> zf_;        // fp32 z from Philox on the host (float64 walk, shifted weights)
  Buf<float> zeros_;             // fp32 z on the backend: Backend::zo_pass of 0 + 1 * z
  Buf<uint16_t> w16_, z16_;      // a bf16 walk's rounded weights and z (JvpBackendKernels)
  // The current layer's primal values and their tangents (max_rows rows each).
  Buf<T> h_, hin_, xn1_, q_, k_buf_, v_, att_, h1_, x2_, f1_, f2_, a_, h2_, qkv_, tmp_;
  Buf<T> dx_, dq_, dk_, dv_, datt_, dtmp_, dh1_, dx2_, df1_, df2_, da_, dh2_, dqkv_, mmtmp_;
  Buf<T> qp_, kp_, dqp_, dkp_;  // Qwen3: q and k before q_norm/k_norm
  Buf<T> ffo_, normed_, dnormed_;  // Gemma: the FFN's output; the outputs' norms
  Buf<float> inv_freq_, inv_freq_local_;  // RoPE's tables (the sliding layers' own: Gemma 3)
  std::vector<Buf<T>> dh_;  // per direction
  // The head's chunk of rows.
  Buf<T> hs_, dhs_, hn_, dhn_, ho_, dho_, logits_, dlogits_, nll_, dnll_;
  Buf<T> raw_logits_, draw_logits_;  // Gemma 2: before final_logit_softcapping
  // A micro-batch's inputs and the head's scored rows, in the backend's memory.
  Buf<int32_t> ids_, pos_, tok_pos_, sel_, tg_;
  Buf<uint8_t> mask_;
};

// A micro-batch's ids, positions and key mask to the backend (staged before the calls return).
template <class K>
void JVPWalk<K>::upload(const Batch& b) {
  const int64_t rows = b.rows();
  std::vector<int32_t> pos(rows), tok_pos(rows);
  std::vector<uint8_t> mask(rows);
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t t = 0; t < (b.packed() ? b.lengths[size_t(i)] : b.T); ++t) {
      pos[b.row(i, t)] = (int32_t)t;
      tok_pos[b.row(i, t)] = (int32_t)t + (cfg_.arch == Arch::OPT ? 2 : 0);  // OPT's offset
      mask[b.row(i, t)] = t < b.lengths[size_t(i)];
    }
  be_.copy_to_device(ids_.data(), b.ids.data(), size_t(rows) * 4, nullptr);
  be_.copy_to_device(pos_.data(), pos.data(), size_t(rows) * 4, nullptr);
  be_.copy_to_device(tok_pos_.data(), tok_pos.data(), size_t(rows) * 4, nullptr);
  be_.copy_to_device(mask_.data(), mask.data(), size_t(rows), nullptr);
}

template <class K>
void JVPWalk<K>::micro_batch(const LossBatch& lb, const std::vector<ZKey>& keys,
                             const ZKey* shift_key, double shift, const T* w_emb, JVPSums& out) {
  const Batch& b = lb.batch;
  const int64_t rows = b.rows();
  const int q = (int)keys.size();
  const int nblocks = (int)model_.blocks().size();
  upload(b);
  // Block 0: the embedding, its primal then each direction's tangent.
  Frame p = layer_primal_frame();
  set_inputs(p, b);
  const EmbedT<const T*> ew = embed_view(w_emb);
  {
    graph::Primal<K> po(k_, d_, p);
    graph::embed(po, d_, ew);
  }
  for (int j = 0; j < q; ++j) {
    Frame t = layer_tangent_frame(dh_[j].data());
    set_inputs(t, b);
    graph::Tangent<K> to(k_, d_, p, t);
    graph::embed(to, d_, dual(ew, embed_view(z_embed_[j].data())));
  }
  // The layers: the primal once (on a copy of h, kept with every value the tangent reads), then
  // each direction's tangent from those values.
  for (int li = 0; li < (int)cfg_.num_layers; ++li) {
    const LayerT<const T*> w = layer_view(li, block_weights(li + 1, w_block_, shift_key, shift));
    k_.copy(hin_.data(), h_.data(), rows * d_.C);
    const graph::Dims dl = graph::Dims::of(cfg_, li);  // the layer's window and RoPE table
    {
      graph::Primal<K> po(k_, dl, p);
      graph::layer(po, dl, w);
    }
    for (int j = 0; j < q; ++j) {
      block_z(li + 1, keys[j], z_block_);
      Frame t = layer_tangent_frame(dh_[j].data());
      set_inputs(t, b);
      graph::Tangent<K> to(k_, dl, p, t);
      graph::layer(to, dl, dual(w, layer_view(li, z_block_.data())));
    }
    done_with(li + 1, shift_key);
  }
  // The head over the scored rows, kHeadChunk at a time; the primal is recomputed for each
  // direction rather than keeping every chunk's logits.
  const HeadT<const T*> hw =
      head_view(block_weights(nblocks - 1, w_block_, shift_key, shift), w_emb);
  const std::vector<int32_t>&sel = lb.score_rows, &tg = lb.score_targets;
  for (int j = 0; j < std::max(q, 1); ++j) {
    HeadT<const T*> hz;
    if (q > 0) {
      block_z(nblocks - 1, keys[j], z_block_);
      hz = head_view(z_block_.data(), z_embed_[j].data());
    }
    for (size_t s0 = 0; s0 < sel.size(); s0 += kHeadChunk) {
      const int64_t m = std::min<int64_t>(kHeadChunk, (int64_t)(sel.size() - s0));
      // A lone pair runs twice, its copy not summed: a product of one row is the backends'
      // decoding path (Backend::matmul), and a micro-batch must score a pair as the whole batch.
      const int64_t n = std::max<int64_t>(m, 2);
      const int32_t one_sel[2] = {sel[s0], sel[s0]}, one_tg[2] = {tg[s0], tg[s0]};
      // The chunk's rows gathered by the embedding op (the hidden states as its table).
      be_.copy_to_device(sel_.data(), m == 1 ? one_sel : sel.data() + s0, size_t(n) * 4, nullptr);
      be_.copy_to_device(tg_.data(), m == 1 ? one_tg : tg.data() + s0, size_t(n) * 4, nullptr);
      k_.embedding(sel_.data(), h_.data(), hs_.data(), n, d_.C, false);
      if (q > 0) k_.embedding(sel_.data(), dh_[j].data(), dhs_.data(), n, d_.C, false);
      double ds = 0;
      const double s = head_chunk(hw, q > 0 ? &hz : nullptr, n, m, &ds);
      if (j == 0) out.sum_loss += s;
      if (q > 0) out.sum_dir[j] += ds;
    }
  }
  done_with(nblocks - 1, shift_key);
  out.count += (double)sel.size();
}

template <class K>
JVPSums JVPWalk<K>::walk(const std::vector<ZKey>& keys, const ZKey* shift_key, double shift,
                         const std::vector<LossBatch>& micro) {
  // Every input is checked before any work.
  ZOF_CHECK(!micro.empty(), "a JVP step needs at least one batch");
  check_loss_batches(micro, cfg_, max_rows_, "the JVP estimator");
  const int q = (int)keys.size();
  const int nblocks = (int)model_.blocks().size();
  JVPSums out;
  out.sum_dir.assign(q, 0.0);
  forget_weights();  // the weights may have changed since the last walk
  forget_z();
  // Streamed weights: the blocks in walk order (the embedding held throughout).
  if (weights_ && !shift_key) {
    std::vector<int> order{0};
    for (size_t mb = 0; mb < micro.size(); ++mb)
      for (int blk = 1; blk < nblocks; ++blk) order.push_back(blk);
    weights_->begin_walk(std::move(order));
  }
  // The embedding block's weights and z stay for the whole walk: the tied LM head reads them.
  const T* w_emb = block_weights(0, w_embed_, shift_key, shift);
  reserve_directions(q);
  for (int j = 0; j < q; ++j) block_z(0, keys[j], z_embed_[j]);
  for (const LossBatch& lb : micro) micro_batch(lb, keys, shift_key, shift, w_emb, out);
  done_with(0, shift_key);
  return out;
}

}  // namespace zof
