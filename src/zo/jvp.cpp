// Forward-mode AD of the transformer forward (see jvp.h): the walk over blocks that runs the
// primal once per layer (keeping that layer's intermediates) and the tangent of every direction
// from them, with the op rules of jvp_ops.h.
#include "zof/jvp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu/jvp_ops.h"
#include "zof/error.h"
#include "zof/streaming.h"

namespace zof {

std::vector<double> JVPSums::gradients() const {
  ZOF_CHECK(count > 0, "the batch has no scored tokens (every target is masked)");
  std::vector<double> g(sum_dir.size());
  for (size_t j = 0; j < g.size(); ++j) g[j] = sum_dir[j] / count;
  return g;
}

// ---- the walk ----------------------------------------------------------------------------------

namespace {
constexpr int64_t kHeadChunk = 256;  // rows of logits formed at once, as Forward::head_nll

// z(key, tensor, i) for i < n: philox.h's lane-parallel z_groups16 on whole chunks of 64, the
// scalar z_group on the tail, the same bits as Backend::zo_pass perturbs with.
void fill_z(float* z, int64_t n, uint32_t tensor, const ZKey& key) {
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

// Model's weight views with T pointers (into a block's weights or into its z).
template <class T>
struct EmbedT {
  const T *tokens = nullptr, *positions = nullptr, *project_in = nullptr;
};
template <class T>
struct LayerT {
  const T *ln1_w = nullptr, *ln1_b = nullptr;
  const T *q_w = nullptr, *q_b = nullptr, *k_w = nullptr, *k_b = nullptr;
  const T *v_w = nullptr, *v_b = nullptr, *qkv_w = nullptr, *qkv_b = nullptr;
  const T *o_w = nullptr, *o_b = nullptr;
  const T *ln2_w = nullptr, *ln2_b = nullptr;
  const T *fc1_w = nullptr, *fc1_b = nullptr, *up_w = nullptr, *up_b = nullptr;
  const T *fc2_w = nullptr, *fc2_b = nullptr;
};
template <class T>
struct HeadT {
  const T *norm_w = nullptr, *norm_b = nullptr, *project_out = nullptr, *lm_head = nullptr;
};

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
}  // namespace

template <class T>
struct BasicJVPEstimator<T>::Impl {
  const Model& model;
  const ModelConfig& cfg;
  Backend& be;
  int64_t max_rows;
  bool backend_ops = true;
  bool llama, pre_norm;
  int64_t C, E, H, Hkv, D, Hq, Hk, I, V;

  // Where fp32 weights come from: the model's storage, or a streamer's device blocks.
  BlockStreamer* weights = nullptr;
  // Weights in T (float without a shift reads the model's own storage instead), z in T.
  Buf<T> w_embed, w_block, z_block;
  std::vector<Buf<T>> z_embed;  // per direction: the tied LM head needs it at the end
  std::vector<float> zf;        // fp32 z from Philox on the host (float64 walk, shifted weights)
  Buf<float> zeros;             // fp32 z on the backend: Backend::zo_pass of 0 + 1 * z
  // The current layer's saved primal intermediates and their tangents (max_rows rows each).
  Buf<T> h, hin, xn1, q, k, v, att, h1, x2, f1, f2, a, h2, qkv, tmp;
  Buf<T> dx, dq, dk, dv, datt, dtmp, dh1, dx2, df1, df2, da, dh2, dqkv, mmtmp;
  std::vector<Buf<T>> dh;  // per direction
  // The head's chunk of rows.
  Buf<T> hs, dhs, hn, dhn, ho, dho, logits, dlogits, nll, dnll;
  // A micro-batch's inputs and the head's scored rows, in the backend's memory.
  Buf<int32_t> ids_b, pos_b, tok_pos_b, sel_b, tg_b;
  Buf<uint8_t> mask_b;
  int32_t *ids_d = nullptr, *pos_d = nullptr, *tok_pos_d = nullptr, *sel_d = nullptr,
          *tg_d = nullptr;
  uint8_t* mask_d = nullptr;

  Impl(const Model& m, Backend& b, int64_t rows)
      : model(m), cfg(m.config()), be(b), max_rows(rows) {
    llama = cfg.arch == Arch::Llama;
    pre_norm = llama || cfg.arch == Arch::GPT2 || cfg.do_layer_norm_before;
    C = cfg.hidden_size;
    E = cfg.word_embed_proj_dim > 0 ? cfg.word_embed_proj_dim : C;
    H = cfg.num_heads;
    Hkv = cfg.num_kv_heads;
    D = cfg.head_dim;
    Hq = H * D;
    Hk = Hkv * D;
    I = cfg.intermediate_size;
    V = cfg.vocab_size;
    const auto& blocks = model.blocks();
    int64_t span = 1;
    for (size_t i = 1; i < blocks.size(); ++i) span = std::max(span, blocks[i].span);
    z_block.reserve(be, span);
    zf.assign(std::max(span, blocks[0].span), 0.f);
    const int64_t R = max_rows, CE = std::max(C, E);
    for (auto* b : {&h, &hin, &xn1, &h1, &x2, &h2, &tmp, &dx, &dtmp, &dh1, &dx2, &dh2})
      b->reserve(be, R * CE);
    for (auto* b : {&q, &att, &dq, &datt}) b->reserve(be, R * Hq);
    for (auto* b : {&k, &v, &dk, &dv}) b->reserve(be, R * Hk);
    for (auto* b : {&f1, &f2, &a, &df1, &df2, &da}) b->reserve(be, R * I);
    if (cfg.arch == Arch::GPT2) {
      qkv.reserve(be, R * 3 * C);
      dqkv.reserve(be, R * 3 * C);
    }
    if constexpr (std::is_same_v<T, float>) {
      // The largest product: a layer's (R rows) or the LM head's (kHeadChunk rows of V).
      mmtmp.reserve(be, std::max(R * std::max({3 * C, I, Hq, CE}), kHeadChunk * V));
      // The largest tensor's worth of zeros, for z.
      int64_t most = 1;
      for (const Param& p : model.params()) most = std::max(most, p.numel);
      zeros.reserve(be, most);
      const std::vector<float> z0(size_t(std::min<int64_t>(most, 1 << 20)), 0.f);
      for (int64_t i = 0; i < most; i += (int64_t)z0.size())
        be.copy_to_device(zeros.data() + i, z0.data(),
                          size_t(std::min<int64_t>((int64_t)z0.size(), most - i)) * sizeof(float),
                          nullptr);
      be.synchronize(nullptr);
    }
    for (auto* b : {&hs, &dhs, &hn, &dhn, &ho, &dho}) b->reserve(be, kHeadChunk * CE);
    logits.reserve(be, kHeadChunk * V);
    dlogits.reserve(be, kHeadChunk * V);
    nll.reserve(be, kHeadChunk);
    dnll.reserve(be, kHeadChunk);
    for (auto [buf, n] : {std::pair{&ids_b, R}, {&pos_b, R}, {&tok_pos_b, R},
                          {&sel_b, kHeadChunk}, {&tg_b, kHeadChunk}})
      buf->reserve(be, n);
    mask_b.reserve(be, R);
    ids_d = ids_b.data(), pos_d = pos_b.data(), tok_pos_d = tok_pos_b.data();
    sel_d = sel_b.data(), tg_d = tg_b.data(), mask_d = mask_b.data();
  }
  // Per direction: the embedding block's z and the tangent hidden state.
  void reserve_directions(int q) {
    while ((int)z_embed.size() < q) {
      Buf<T> z, d;  // both allocated before either is kept: the lists stay the same length
      z.reserve(be, model.blocks()[0].span);
      d.reserve(be, max_rows * C);
      z_embed.push_back(std::move(z));
      dh.push_back(std::move(d));
    }
  }

  // ---- weights and directions of a block, in T ----
  // z(key) of block b into out (laid out as the block's span in storage).
  void block_z(int b, const ZKey& key, Buf<T>& out) {
    const Block& blk = model.blocks()[b];
    out.reserve(be, blk.span);
    const auto& params = model.params();
    if constexpr (std::is_same_v<T, float>) {
      // On the backend: theta = 0, eps = 1 gives z exactly, the same bits as fill_z.
      for (int pi : blk.params) {
        const int64_t off = (params[pi].data - model.storage()) - blk.offset;
        be.zo_pass(zeros.data(), params[pi].numel, (uint32_t)pi, 0, nullptr, 0, 0.f, &key, 1.f,
                   out.data() + off, nullptr);
      }
    } else {
      for (int pi : blk.params) {
        const int64_t off = (params[pi].data - model.storage()) - blk.offset;
        fill_z(zf.data() + off, params[pi].numel, (uint32_t)pi, key);
      }
      for (int64_t i = 0; i < blk.span; ++i) out.data()[i] = T(zf[i]);
    }
  }
  // Block b's weights in T: theta + shift z(shift_key) (formed in double, then rounded to T).
  // fp32 without a shift: the weights themselves (a streamer's device block, held until
  // done_with(b)). Otherwise formed on the host: host backends only.
  const T* block_weights(int b, Buf<T>& buf, const ZKey* shift_key, double shift) {
    const Block& blk = model.blocks()[b];
    if constexpr (std::is_same_v<T, float>)
      if (!shift_key) return weights ? weights->acquire(b) : model.storage() + blk.offset;
    ZOF_CHECK(!weights, "the shifted (finite-difference) JVP walk runs on host backends only");
    const float* src = model.storage() + blk.offset;
    buf.reserve(be, blk.span);
    if (shift_key) {
      const auto& params = model.params();
      std::fill(zf.begin(), zf.begin() + blk.span, 0.f);
      for (int pi : blk.params) {
        const int64_t off = (params[pi].data - model.storage()) - blk.offset;
        fill_z(zf.data() + off, params[pi].numel, (uint32_t)pi, *shift_key);
      }
    }
    for (int64_t i = 0; i < blk.span; ++i)
      buf.data()[i] = T(double(src[i]) + (shift_key ? shift * double(zf[i]) : 0.0));
    return buf.data();
  }
  void done_with(int b, const ZKey* shift_key) {
    if (std::is_same_v<T, float> && weights && !shift_key) weights->release(b, false);
  }
  // dst = src, n elements.
  void copy(T* dst, const T* src, int64_t n) {
    if constexpr (std::is_same_v<T, float>) return be.copy_device(dst, src, size_t(n) * sizeof(T), nullptr);
    std::copy(src, src + n, dst);
  }
  // The sum of n values in double (fp32: read back from the backend first).
  double sum_of(const T* x, int64_t n) {
    std::vector<double> hx(size_t(std::max<int64_t>(n, 0)));
    if constexpr (std::is_same_v<T, float>) {
      std::vector<float> f(hx.size());
      be.copy_to_host(f.data(), x, f.size() * sizeof(float), nullptr);
      be.synchronize(nullptr);
      std::copy(f.begin(), f.end(), hx.begin());
    } else {
      std::copy(x, x + n, hx.begin());
    }
    double s = 0;
    for (double v : hx) s += v;
    return s;
  }
  // A pointer of the model's own views, moved into base (block b) or embed_base (block 0).
  const T* at(const float* p, int b, const T* base, const T* embed_base) const {
    if (!p) return nullptr;
    const auto& blocks = model.blocks();
    const int64_t off = p - model.storage();
    if (off >= blocks[b].offset && off < blocks[b].offset + blocks[b].span)
      return base + (off - blocks[b].offset);
    ZOF_ASSERT(embed_base && off >= blocks[0].offset && off < blocks[0].offset + blocks[0].span);
    return embed_base + (off - blocks[0].offset);
  }
  EmbedT<T> embed_view(const T* base) const {
    const EmbedWeights w = model.embed();
    return {at(w.tokens, 0, base, nullptr), at(w.positions, 0, base, nullptr),
            at(w.project_in, 0, base, nullptr)};
  }
  LayerT<T> layer_view(int li, const T* base) const {
    const LayerWeights w = model.layer(li);
    auto m = [&](const float* p) { return at(p, li + 1, base, nullptr); };
    LayerT<T> o;
    o.ln1_w = m(w.ln1_w), o.ln1_b = m(w.ln1_b);
    o.q_w = m(w.q_w), o.q_b = m(w.q_b), o.k_w = m(w.k_w), o.k_b = m(w.k_b);
    o.v_w = m(w.v_w), o.v_b = m(w.v_b), o.qkv_w = m(w.qkv_w), o.qkv_b = m(w.qkv_b);
    o.o_w = m(w.o_w), o.o_b = m(w.o_b);
    o.ln2_w = m(w.ln2_w), o.ln2_b = m(w.ln2_b);
    o.fc1_w = m(w.fc1_w), o.fc1_b = m(w.fc1_b), o.up_w = m(w.up_w), o.up_b = m(w.up_b);
    o.fc2_w = m(w.fc2_w), o.fc2_b = m(w.fc2_b);
    return o;
  }
  HeadT<T> head_view(const T* base, const T* embed_base) const {
    const HeadWeights w = model.head();
    const int b = (int)model.blocks().size() - 1;
    return {at(w.norm_w, b, base, embed_base), at(w.norm_b, b, base, embed_base),
            at(w.project_out, b, base, embed_base), at(w.lm_head, b, base, embed_base)};
  }

  // ---- ops: through the Backend (T = float, the default) or jvp_ops.h's plain loops ----
  void mm(const T* x, const T* w, const T* b, T* y, int64_t M, int64_t N, int64_t K) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops) return be.matmul(x, w, b, y, M, N, K);
    jvp::matmul(x, w, b, y, M, N, K);
  }
  void mm_jvp(const T* x, const T* dx_, const T* w, const T* dw, const T* db, T* dy, int64_t M,
              int64_t N, int64_t K) {
    if constexpr (std::is_same_v<T, float>) {
      if (backend_ops) {
        // Every linear layer of the walk has both tangents (z perturbs every weight).
        ZOF_ASSERT(dx_ && dw);
        be.matmul(dx_, w, db, dy, M, N, K);
        be.matmul(x, dw, nullptr, mmtmp.data(), M, N, K);
        be.add(dy, mmtmp.data(), M * N);
        return;
      }
    }
    jvp::matmul_jvp(x, dx_, w, dw, db, dy, M, N, K);
  }
  void norm(const T* x, const T* w, const T* b, T* y, int64_t rows) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops)
        return llama ? be.rms_norm(x, w, y, rows, C, cfg.norm_eps)
                     : be.layer_norm(x, w, b, y, rows, C, cfg.norm_eps);
    if (llama)
      jvp::rms_norm(x, w, y, rows, C, cfg.norm_eps);
    else
      jvp::layer_norm(x, w, b, y, rows, C, cfg.norm_eps);
  }
  void norm_jvp(const T* x, const T* dx_, const T* w, const T* dw, const T* db, T* dy,
                int64_t rows) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops)
        return llama ? be.rms_norm_jvp(x, dx_, w, dw, dy, rows, C, cfg.norm_eps)
                     : be.layer_norm_jvp(x, dx_, w, dw, db, dy, rows, C, cfg.norm_eps);
    if (llama)
      jvp::rms_norm_jvp(x, dx_, w, dw, dy, rows, C, cfg.norm_eps);
    else
      jvp::layer_norm_jvp(x, dx_, w, dw, db, dy, rows, C, cfg.norm_eps);
  }
  void embedding(const int32_t* ids, const T* table, T* out, int64_t n, int64_t dim, bool acc) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops) return be.embedding(ids, table, out, n, dim, acc);
    jvp::embedding(ids, table, out, n, dim, acc);
  }
  // RoPE in place on x (rows, heads, D); linear, so tangents rotate the same way.
  void rope(T* x, const int32_t* pos, int64_t rows, int64_t heads) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops) return be.rope(x, pos, rows, heads, D, cfg.rope_theta);
    jvp::rope(x, pos, rows, heads, D, cfg.rope_theta);
  }
  // att = attention(q, k, v) over whole sequences of S, and its tangent datt.
  void attention(const uint8_t* mask, int64_t B, int64_t S) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops)
        return be.attention(q.data(), k.data(), v.data(), att.data(), mask, B, S, S, H, Hkv, D, 0,
                            float(scale()));
    jvp::attention(q.data(), k.data(), v.data(), att.data(), mask, B, S, H, Hkv, D, scale());
  }
  void attention_jvp(const uint8_t* mask, int64_t B, int64_t S) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops)
        return be.attention_jvp(q.data(), dq.data(), k.data(), dk.data(), v.data(), dv.data(),
                                datt.data(), mask, B, S, H, Hkv, D, float(scale()));
    jvp::attention_jvp(q.data(), dq.data(), k.data(), dk.data(), v.data(), dv.data(), datt.data(),
                       mask, B, S, H, Hkv, D, scale());
  }
  // a = act(f1) (gated: silu(f1) * f2), n elements, and its tangent da.
  void ffn_act(int64_t n, bool gated) {
    if constexpr (std::is_same_v<T, float>) {
      if (backend_ops) {
        if (gated) return be.silu_mul(f1.data(), f2.data(), a.data(), n);
        be.copy_device(a.data(), f1.data(), size_t(n) * sizeof(float), nullptr);
        switch (cfg.act) {
          case Activation::GeluTanh: return be.gelu_tanh(a.data(), n);
          case Activation::GeluErf: return be.gelu_erf(a.data(), n);
          case Activation::ReLU: return be.relu(a.data(), n);
          case Activation::SiLU: break;  // only gated (LLaMA's up/gate pair)
        }
        ZOF_ASSERT(false);
      }
    }
    if (gated)
      jvp::silu_mul(f1.data(), f2.data(), a.data(), n);
    else
      jvp::activation(cfg.act, f1.data(), a.data(), n);
  }
  void ffn_act_jvp(int64_t n, bool gated) {
    if constexpr (std::is_same_v<T, float>) {
      if (backend_ops) {
        if (gated)
          return be.silu_mul_jvp(f1.data(), df1.data(), f2.data(), df2.data(), da.data(), n);
        switch (cfg.act) {
          case Activation::GeluTanh: return be.gelu_tanh_jvp(f1.data(), df1.data(), da.data(), n);
          case Activation::GeluErf: return be.gelu_erf_jvp(f1.data(), df1.data(), da.data(), n);
          case Activation::ReLU: return be.relu_jvp(f1.data(), df1.data(), da.data(), n);
          case Activation::SiLU: break;
        }
        ZOF_ASSERT(false);
      }
    }
    if (gated)
      jvp::silu_mul_jvp(f1.data(), df1.data(), f2.data(), df2.data(), da.data(), n);
    else
      jvp::activation_jvp(cfg.act, f1.data(), df1.data(), da.data(), n);
  }
  // nll (n) of the head chunk's logits, and its tangent dnll from dlogits.
  void cross_entropy(const int32_t* tg, int64_t n) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops) return be.cross_entropy(logits.data(), tg, nll.data(), n, V);
    jvp::cross_entropy(logits.data(), tg, nll.data(), n, V);
  }
  void cross_entropy_jvp(const int32_t* tg, int64_t n) {
    if constexpr (std::is_same_v<T, float>)
      if (backend_ops)
        return be.cross_entropy_jvp(logits.data(), dlogits.data(), tg, dnll.data(), n, V);
    jvp::cross_entropy_jvp(logits.data(), dlogits.data(), tg, dnll.data(), n, V);
  }
  // y = a + b, n elements.
  void add_to(T* y, const T* a_, const T* b, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      if (backend_ops) {
        be.copy_device(y, a_, size_t(n) * sizeof(float), nullptr);
        return be.add(y, b, n);
      }
    }
    for (int64_t i = 0; i < n; ++i) y[i] = a_[i] + b[i];
  }
  double scale() const { return 1.0 / std::sqrt(double(D)); }

  // ---- embedding ----
  void embed_primal(const EmbedT<T>& w, const int32_t* ids, const int32_t* pos, int64_t rows) {
    if (w.project_in) {  // OPT-350m: embed in E dims (kept in xn1), project to C
      embedding(ids, w.tokens, xn1.data(), rows, E, false);
      mm(xn1.data(), w.project_in, nullptr, h.data(), rows, C, E);
    } else {
      embedding(ids, w.tokens, h.data(), rows, C, false);
    }
    if (w.positions) embedding(pos, w.positions, h.data(), rows, C, true);
  }
  void embed_tangent(const EmbedT<T>& w, const EmbedT<T>& z, const int32_t* ids,
                     const int32_t* pos, int64_t rows, T* dh_) {
    if (w.project_in) {
      embedding(ids, z.tokens, dx.data(), rows, E, false);
      mm_jvp(xn1.data(), dx.data(), w.project_in, z.project_in, nullptr, dh_, rows, C, E);
    } else {
      embedding(ids, z.tokens, dh_, rows, C, false);
    }
    if (w.positions) embedding(pos, z.positions, dh_, rows, C, true);
  }

  // ---- one transformer layer (Forward::layer's structure) ----
  // h (rows, C) in place; keeps what the tangent needs.
  void layer_primal(const LayerT<T>& w, int64_t B, int64_t S, const int32_t* pos,
                    const uint8_t* mask) {
    const int64_t rows = B * S;
    copy(hin.data(), h.data(), rows * C);
    const T* x = hin.data();
    if (pre_norm) {
      norm(hin.data(), w.ln1_w, w.ln1_b, xn1.data(), rows);
      x = xn1.data();
    }
    if (w.qkv_w) {  // GPT-2 fused c_attn: (rows, 3C) then split
      mm(x, w.qkv_w, w.qkv_b, qkv.data(), rows, 3 * C, C);
      split_qkv(qkv.data(), q.data(), k.data(), v.data(), rows);
    } else {
      mm(x, w.q_w, w.q_b, q.data(), rows, Hq, C);
      mm(x, w.k_w, w.k_b, k.data(), rows, Hk, C);
      mm(x, w.v_w, w.v_b, v.data(), rows, Hk, C);
    }
    if (llama) {
      rope(q.data(), pos, rows, H);
      rope(k.data(), pos, rows, Hkv);
    }
    attention(mask, B, S);
    mm(att.data(), w.o_w, w.o_b, tmp.data(), rows, C, Hq);
    add_to(h1.data(), hin.data(), tmp.data(), rows * C);
    // Pre-norm: the FFN reads LN2(h1) and adds to h1. Post-norm: h1 is normed by LN1 first,
    // and the FFN reads and adds to that.
    if (pre_norm)
      norm(h1.data(), w.ln2_w, w.ln2_b, x2.data(), rows);
    else
      norm(h1.data(), w.ln1_w, w.ln1_b, x2.data(), rows);
    const T* mid = pre_norm ? h1.data() : x2.data();
    mm(x2.data(), w.fc1_w, w.fc1_b, f1.data(), rows, I, C);
    if (w.up_w) {
      mm(x2.data(), w.up_w, w.up_b, f2.data(), rows, I, C);
    }
    ffn_act(rows * I, w.up_w != nullptr);
    mm(a.data(), w.fc2_w, w.fc2_b, tmp.data(), rows, C, I);
    add_to(h2.data(), mid, tmp.data(), rows * C);
    if (pre_norm)
      copy(h.data(), h2.data(), rows * C);
    else
      norm(h2.data(), w.ln2_w, w.ln2_b, h.data(), rows);
  }

  // dh_ (rows, C): the tangent of the layer's input in, of its output out. z: the layer's z.
  void layer_tangent(const LayerT<T>& w, const LayerT<T>& z, T* dh_, int64_t B, int64_t S,
                     const int32_t* pos, const uint8_t* mask) {
    const int64_t rows = B * S;
    const T* x = hin.data();
    const T* dxin = dh_;
    if (pre_norm) {
      norm_jvp(hin.data(), dh_, w.ln1_w, z.ln1_w, z.ln1_b, dx.data(), rows);
      x = xn1.data();
      dxin = dx.data();
    }
    if (w.qkv_w) {
      mm_jvp(x, dxin, w.qkv_w, z.qkv_w, z.qkv_b, dqkv.data(), rows, 3 * C, C);
      split_qkv(dqkv.data(), dq.data(), dk.data(), dv.data(), rows);
    } else {
      mm_jvp(x, dxin, w.q_w, z.q_w, z.q_b, dq.data(), rows, Hq, C);
      mm_jvp(x, dxin, w.k_w, z.k_w, z.k_b, dk.data(), rows, Hk, C);
      mm_jvp(x, dxin, w.v_w, z.v_w, z.v_b, dv.data(), rows, Hk, C);
    }
    if (llama) {  // linear: the tangent rotates like the primal
      rope(dq.data(), pos, rows, H);
      rope(dk.data(), pos, rows, Hkv);
    }
    attention_jvp(mask, B, S);
    mm_jvp(att.data(), datt.data(), w.o_w, z.o_w, z.o_b, dtmp.data(), rows, C, Hq);
    add_to(dh1.data(), dh_, dtmp.data(), rows * C);
    if (pre_norm)
      norm_jvp(h1.data(), dh1.data(), w.ln2_w, z.ln2_w, z.ln2_b, dx2.data(), rows);
    else
      norm_jvp(h1.data(), dh1.data(), w.ln1_w, z.ln1_w, z.ln1_b, dx2.data(), rows);
    const T* dmid = pre_norm ? dh1.data() : dx2.data();
    mm_jvp(x2.data(), dx2.data(), w.fc1_w, z.fc1_w, z.fc1_b, df1.data(), rows, I, C);
    if (w.up_w) {
      mm_jvp(x2.data(), dx2.data(), w.up_w, z.up_w, z.up_b, df2.data(), rows, I, C);
    }
    ffn_act_jvp(rows * I, w.up_w != nullptr);
    mm_jvp(a.data(), da.data(), w.fc2_w, z.fc2_w, z.fc2_b, dtmp.data(), rows, C, I);
    if (pre_norm) {
      add_to(dh_, dmid, dtmp.data(), rows * C);
    } else {
      add_to(dh2.data(), dmid, dtmp.data(), rows * C);
      norm_jvp(h2.data(), dh2.data(), w.ln2_w, z.ln2_w, z.ln2_b, dh_, rows);
    }
  }

  void split_qkv(const T* src, T* q_, T* k_, T* v_, int64_t rows) {
    if constexpr (std::is_same_v<T, float>) {
      const size_t row = size_t(C) * sizeof(float);
      be.copy_device_2d(q_, row, src, 3 * row, row, size_t(rows), nullptr);
      be.copy_device_2d(k_, row, src + C, 3 * row, row, size_t(rows), nullptr);
      be.copy_device_2d(v_, row, src + 2 * C, 3 * row, row, size_t(rows), nullptr);
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(src + r * 3 * C, src + r * 3 * C + C, q_ + r * C);
      std::copy(src + r * 3 * C + C, src + r * 3 * C + 2 * C, k_ + r * C);
      std::copy(src + r * 3 * C + 2 * C, src + r * 3 * C + 3 * C, v_ + r * C);
    }
  }

  // ---- head: rows hs (n, C) -> logits (n, V) -> nll; with z, their tangents ----
  // Returns the sum of nll; *dsum gets the sum of its tangent when z is given.
  double head_chunk(const HeadT<T>& w, const HeadT<T>* z, const int32_t* tg, int64_t n,
                    double* dsum) {
    const T* x = hs.data();
    const int64_t EO = w.project_out ? E : C;
    if (w.norm_w) {
      norm(hs.data(), w.norm_w, w.norm_b, hn.data(), n);
      x = hn.data();
    }
    if (w.project_out) {
      mm(x, w.project_out, nullptr, ho.data(), n, E, C);
      x = ho.data();
    }
    mm(x, w.lm_head, nullptr, logits.data(), n, V, EO);
    cross_entropy(tg, n);
    const double s = sum_of(nll.data(), n);
    if (!z) return s;
    const T* xin = hs.data();
    const T* dxin = dhs.data();
    if (w.norm_w) {
      norm_jvp(hs.data(), dhs.data(), w.norm_w, z->norm_w, z->norm_b, dhn.data(), n);
      xin = hn.data();
      dxin = dhn.data();
    }
    if (w.project_out) {
      mm_jvp(xin, dxin, w.project_out, z->project_out, nullptr, dho.data(), n, E, C);
      xin = ho.data();
      dxin = dho.data();
    }
    mm_jvp(xin, dxin, w.lm_head, z->lm_head, nullptr, dlogits.data(), n, V, EO);
    cross_entropy_jvp(tg, n);
    *dsum = sum_of(dnll.data(), n);
    return s;
  }
};

template <class T>
BasicJVPEstimator<T>::BasicJVPEstimator(const Model& model, Backend& backend, int64_t max_rows,
                                        int directions)
    : impl_(std::make_unique<Impl>(model, backend, max_rows)) {
  ZOF_CHECK(max_rows >= 1, "the JVP estimator needs room for at least one token");
  impl_->reserve_directions(directions);
}

template <class T>
BasicJVPEstimator<T>::~BasicJVPEstimator() = default;

template <class T>
void BasicJVPEstimator<T>::set_weights(BlockStreamer* s) {
  ZOF_CHECK((!s || std::is_same_v<T, float>), "only the fp32 JVP walk reads streamed weights");
  impl_->weights = s;
}

template <class T>
JVPSums BasicJVPEstimator<T>::directional_derivatives(const std::vector<ZKey>& keys,
                                                      const std::vector<LossBatch>& micro) {
  ZOF_CHECK(!keys.empty(), "the JVP estimator needs at least one direction (--queries >= 1)");
  return walk(keys, nullptr, 0.0, micro);
}

template <class T>
JVPSums BasicJVPEstimator<T>::loss_along(const ZKey& key, double shift,
                                         const std::vector<LossBatch>& micro) {
  return walk({}, &key, shift, micro);
}

template <class T>
JVPSums BasicJVPEstimator<T>::walk(const std::vector<ZKey>& keys, const ZKey* shift_key,
                                   double shift, const std::vector<LossBatch>& micro) {
  ZOF_CHECK(!micro.empty(), "a JVP step needs at least one batch");
  Impl& m = *impl_;
  m.backend_ops = backend_ops_;
  const ModelConfig& cfg = m.cfg;
  const int q = (int)keys.size();
  const int nblocks = (int)m.model.blocks().size();
  const int64_t C = m.C;
  JVPSums out;
  out.sum_dir.assign(q, 0.0);
  // Every input is checked before any work.
  for (const LossBatch& lb : micro) {
    const Batch& b = lb.batch;
    const int64_t rows = b.B * b.T;
    ZOF_CHECK(rows <= m.max_rows, "batch of " + std::to_string(rows) +
                                      " tokens exceeds the JVP estimator's capacity of " +
                                      std::to_string(m.max_rows));
    ZOF_ASSERT((int64_t)lb.targets.size() == rows && (int64_t)b.ids.size() == rows);
    ZOF_CHECK(b.T <= cfg.max_position,
              "a sequence of " + std::to_string(b.T) + " tokens is beyond the model's context of " +
                  std::to_string(cfg.max_position) + " tokens (max_position_embeddings)");
    for (int64_t i = 0; i < rows; ++i) {
      ZOF_CHECK(b.ids[i] >= 0 && b.ids[i] < m.V, "token id " + std::to_string(b.ids[i]) +
                                                     " is outside the model's vocabulary of " +
                                                     std::to_string(m.V));
      ZOF_CHECK(lb.targets[i] < m.V, "target token id " + std::to_string(lb.targets[i]) +
                                         " is outside the vocabulary of " + std::to_string(m.V));
    }
  }
  // Streamed weights: the blocks in walk order (the embedding held throughout).
  if (m.weights && !shift_key) {
    std::vector<int> order{0};
    for (size_t mb = 0; mb < micro.size(); ++mb)
      for (int blk = 1; blk < nblocks; ++blk) order.push_back(blk);
    m.weights->begin_walk(std::move(order));
  }
  // The embedding block's weights and z stay for the whole walk: the tied LM head reads them.
  const T* w_emb = m.block_weights(0, m.w_embed, shift_key, shift);
  m.reserve_directions(q);
  for (int j = 0; j < q; ++j) m.block_z(0, keys[j], m.z_embed[j]);
  const EmbedT<T> ew = m.embed_view(w_emb);

  for (const LossBatch& lb : micro) {
    const Batch& b = lb.batch;
    const int64_t rows = b.B * b.T;
    std::vector<int32_t> pos(rows), tok_pos(rows);
    std::vector<uint8_t> mask(rows);
    for (int64_t i = 0; i < b.B; ++i)
      for (int64_t t = 0; t < b.T; ++t) {
        pos[i * b.T + t] = (int32_t)t;
        tok_pos[i * b.T + t] = (int32_t)t + (cfg.arch == Arch::OPT ? 2 : 0);  // OPT's offset
        mask[i * b.T + t] = t < b.lengths[i];
      }
    // To the backend (staged before the calls return: the vectors may go after the loop body).
    m.be.copy_to_device(m.ids_d, b.ids.data(), size_t(rows) * 4, nullptr);
    m.be.copy_to_device(m.pos_d, pos.data(), size_t(rows) * 4, nullptr);
    m.be.copy_to_device(m.tok_pos_d, tok_pos.data(), size_t(rows) * 4, nullptr);
    m.be.copy_to_device(m.mask_d, mask.data(), size_t(rows), nullptr);
    const int32_t *ids = m.ids_d, *pos_d = m.pos_d, *tok_pos_d = m.tok_pos_d;
    const uint8_t* mask_d = m.mask_d;

    // Block 0: the embedding.
    m.embed_primal(ew, ids, tok_pos_d, rows);
    for (int j = 0; j < q; ++j)
      m.embed_tangent(ew, m.embed_view(m.z_embed[j].data()), ids, tok_pos_d, rows,
                      m.dh[j].data());
    // The layers: the primal once, then each direction's tangent from its intermediates.
    for (int li = 0; li < (int)cfg.num_layers; ++li) {
      const LayerT<T> w = m.layer_view(li, m.block_weights(li + 1, m.w_block, shift_key, shift));
      m.layer_primal(w, b.B, b.T, pos_d, mask_d);
      for (int j = 0; j < q; ++j) {
        m.block_z(li + 1, keys[j], m.z_block);
        m.layer_tangent(w, m.layer_view(li, m.z_block.data()), m.dh[j].data(), b.B, b.T, pos_d,
                        mask_d);
      }
      m.done_with(li + 1, shift_key);
    }
    // The head over the scored rows, kHeadChunk at a time; the primal is recomputed for each
    // direction rather than keeping every chunk's logits.
    const HeadT<T> hw = m.head_view(m.block_weights(nblocks - 1, m.w_block, shift_key, shift), w_emb);
    std::vector<int32_t> sel, tg;
    for (int64_t r = 0; r < rows; ++r)
      if (lb.targets[r] >= 0) {
        sel.push_back((int32_t)r);
        tg.push_back(lb.targets[r]);
      }
    for (int j = 0; j < std::max(q, 1); ++j) {
      HeadT<T> hz;
      if (q > 0) {
        m.block_z(nblocks - 1, keys[j], m.z_block);
        hz = m.head_view(m.z_block.data(), m.z_embed[j].data());
      }
      for (size_t s0 = 0; s0 < sel.size(); s0 += kHeadChunk) {
        const int64_t n = std::min<int64_t>(kHeadChunk, (int64_t)(sel.size() - s0));
        // The chunk's rows gathered by the embedding op (the hidden states as its table).
        m.be.copy_to_device(m.sel_d, sel.data() + s0, size_t(n) * 4, nullptr);
        m.be.copy_to_device(m.tg_d, tg.data() + s0, size_t(n) * 4, nullptr);
        m.embedding(m.sel_d, m.h.data(), m.hs.data(), n, C, false);
        if (q > 0) m.embedding(m.sel_d, m.dh[j].data(), m.dhs.data(), n, C, false);
        double ds = 0;
        const double s = m.head_chunk(hw, q > 0 ? &hz : nullptr, m.tg_d, n, &ds);
        if (j == 0) out.sum_loss += s;
        if (q > 0) out.sum_dir[j] += ds;
      }
    }
    m.done_with(nblocks - 1, shift_key);
    out.count += (double)sel.size();
  }
  m.done_with(0, shift_key);
  return out;
}

template class BasicJVPEstimator<float>;
template class BasicJVPEstimator<double>;

}  // namespace zof
