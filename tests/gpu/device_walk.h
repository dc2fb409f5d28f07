// A device-resident forward pass and ZO step over any Backend, for the GPU benchmarks and the
// first GPU tests. src/core's Forward and ZOEngine now run on a device themselves (weights
// through a BlockStreamer; test_gpu_model.cpp checks them on CUDA), but they need the whole
// model in host memory: this driver builds models on the device (DeviceModel::replicate, a
// ~1B-parameter model from one layer) for the benchmarks. It mirrors Forward::layer and
// ZOEngine::perturbed_losses; keep them in step, or move the benchmarks onto the engine.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "zof/backend.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/zo.h"

namespace zof::gpu {

// Backend memory of n elements of T, freed on destruction.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Backend& be, int64_t n) : be_(&be), n_(n) {
    p_ = static_cast<T*>(be.alloc(size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
  }
  DeviceArray(Backend& be, const std::vector<T>& host) : DeviceArray(be, (int64_t)host.size()) {
    be.copy_to_device(p_, host.data(), host.size() * sizeof(T), nullptr);
  }
  ~DeviceArray() { reset(); }
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(be_, o.be_);
      std::swap(p_, o.p_);
      std::swap(n_, o.n_);
    }
    return *this;
  }
  T* get() const { return p_; }
  int64_t size() const { return n_; }
  std::vector<T> download() const {
    std::vector<T> h(static_cast<size_t>(n_));
    be_->copy_to_host(h.data(), p_, h.size() * sizeof(T), nullptr);
    be_->synchronize(nullptr);
    return h;
  }

 private:
  void reset() {
    if (p_) be_->free(p_);
    p_ = nullptr;
  }
  Backend* be_ = nullptr;
  T* p_ = nullptr;
  int64_t n_ = 0;
};

// A model's weights in backend memory, block by block in Model::storage() layout, with the
// tensor table the ZO passes walk. `layout` is the host model whose views name the tensors; a
// replicated model (too big to build on the host) repeats layout's layer 0 `layers` times.
struct DeviceModel {
  struct Tensor {
    uint32_t id;     // the Philox tensor index (Model::params index when uploaded)
    int64_t offset;  // in its block
    int64_t numel;
    bool decay;
  };
  struct Block {
    float* base = nullptr;
    int64_t span = 0;
    std::vector<Tensor> tensors;
  };
  const Model* layout = nullptr;
  ModelConfig cfg;
  bool replicated = false;
  DeviceArray<float> storage;
  std::vector<Block> blocks;  // embed, layers..., head

  EmbedWeights embed(const float* base) const { return layout->embed(base); }
  LayerWeights layer(int i, const float* base) const {
    return layout->layer(replicated ? 0 : i, base);
  }
  HeadWeights head(const float* base, const float* tied) const { return layout->head(base, tied); }
  EmbedWeights embed() const { return embed(blocks.front().base); }
  LayerWeights layer(int i) const { return layer(i, blocks[i + 1].base); }
  HeadWeights head() const { return head(blocks.back().base, embed().tokens); }
  int64_t num_layers() const { return (int64_t)blocks.size() - 2; }

  // All of m, copied to the device.
  static DeviceModel upload(Backend& be, const Model& m) {
    DeviceModel d;
    d.layout = &m;
    d.cfg = m.config();
    d.storage = DeviceArray<float>(be, m.storage_size());
    be.copy_to_device(d.storage.get(), m.storage(), size_t(m.storage_size()) * sizeof(float), nullptr);
    for (const zof::Block& b : m.blocks()) {
      Block db{d.storage.get() + b.offset, b.span, {}};
      for (int pi : b.params) {
        const Param& p = m.params()[pi];
        db.tensors.push_back({(uint32_t)pi, (p.data - m.storage()) - b.offset, p.numel, p.decay});
      }
      d.blocks.push_back(std::move(db));
    }
    be.synchronize(nullptr);
    return d;
  }

  // one_layer's embedding, its layer 0 `layers` times, its head; tensor ids count up in walk
  // order so that every layer draws its own z.
  static DeviceModel replicate(Backend& be, const Model& one_layer, int layers) {
    ZOF_ASSERT(one_layer.config().num_layers == 1 && one_layer.blocks().size() == 3);
    DeviceModel d;
    d.layout = &one_layer;
    d.cfg = one_layer.config();
    d.cfg.num_layers = layers;
    d.replicated = true;
    const auto& src = one_layer.blocks();
    std::vector<int> order = {0};
    for (int i = 0; i < layers; ++i) order.push_back(1);
    order.push_back(2);
    int64_t total = 0;
    for (int b : order) total += src[b].span;
    d.storage = DeviceArray<float>(be, total);
    int64_t at = 0;
    uint32_t id = 0;
    for (int b : order) {
      Block db{d.storage.get() + at, src[b].span, {}};
      be.copy_to_device(db.base, one_layer.storage() + src[b].offset,
                        size_t(src[b].span) * sizeof(float), nullptr);
      for (int pi : src[b].params) {
        const Param& p = one_layer.params()[pi];
        db.tensors.push_back({id++, (p.data - one_layer.storage()) - src[b].offset, p.numel, p.decay});
      }
      at += src[b].span;
      d.blocks.push_back(std::move(db));
    }
    be.synchronize(nullptr);
    return d;
  }

  // Copies the weights back into m (an uploaded model's host twin).
  void download(Backend& be, Model& m) const {
    ZOF_ASSERT(!replicated && storage.size() == m.storage_size());
    be.copy_to_host(m.storage(), storage.get(), size_t(m.storage_size()) * sizeof(float), nullptr);
    be.synchronize(nullptr);
  }
};

// One batch's inputs in backend memory.
struct DeviceInputs {
  int64_t B = 0, T = 0;
  DeviceArray<int32_t> ids, pos, learned_pos, targets;  // (B*T); learned_pos: OPT's offset 2
  DeviceArray<uint8_t> mask;                              // (B, T) key mask
  std::vector<int32_t> host_targets;
};

// The forward walk of zof::Forward (no KV cache) on device buffers.
class DeviceForward {
 public:
  // head_chunk: rows of logits formed at once by head_nll (chunk x vocab floats).
  DeviceForward(const ModelConfig& cfg, Backend& be, int64_t max_rows, int64_t head_chunk = 1024)
      : cfg_(cfg), be_(be), max_rows_(max_rows), head_chunk_(std::min(head_chunk, max_rows)) {
    const int64_t C = cfg.hidden_size, E = std::max(C, cfg.word_embed_proj_dim);
    const int64_t Hq = cfg.num_heads * cfg.head_dim, Hk = cfg.num_kv_heads * cfg.head_dim;
    xn_ = DeviceArray<float>(be, max_rows * E);
    q_ = DeviceArray<float>(be, max_rows * Hq);
    k_ = DeviceArray<float>(be, max_rows * Hk);
    v_ = DeviceArray<float>(be, max_rows * Hk);
    att_ = DeviceArray<float>(be, max_rows * Hq);
    tmp_ = DeviceArray<float>(be, max_rows * E);
    ff1_ = DeviceArray<float>(be, max_rows * cfg.intermediate_size);
    ff2_ = DeviceArray<float>(be, max_rows * cfg.intermediate_size);
    logits_ = DeviceArray<float>(be, head_chunk_ * cfg.vocab_size);
  }

  Backend& backend() { return be_; }
  int64_t max_rows() const { return max_rows_; }

  // Positions 0..len-1 per row, the key mask of right padding, targets (or none); ids are checked
  // here, on the host, as Forward::embed checks them.
  DeviceInputs upload(const Batch& b, const std::vector<int32_t>* targets = nullptr) {
    const int64_t rows = b.B * b.T;
    ZOF_CHECK(rows <= max_rows_, "batch of " + std::to_string(rows) + " tokens exceeds " +
                                     std::to_string(max_rows_));
    std::vector<int32_t> pos(rows), learned(rows);
    std::vector<uint8_t> mask(rows);
    for (int64_t i = 0; i < b.B; ++i)
      for (int64_t t = 0; t < b.T; ++t) {
        pos[i * b.T + t] = (int32_t)t;
        learned[i * b.T + t] = (int32_t)t + (cfg_.arch == Arch::OPT ? 2 : 0);
        mask[i * b.T + t] = t < b.lengths[i];
      }
    for (int32_t id : b.ids)
      ZOF_CHECK(id >= 0 && id < cfg_.vocab_size, "token id " + std::to_string(id) + " out of range");
    ZOF_CHECK(b.T <= cfg_.max_position, "sequence longer than the model's context");
    DeviceInputs in;
    in.B = b.B;
    in.T = b.T;
    in.ids = DeviceArray<int32_t>(be_, b.ids);
    in.pos = DeviceArray<int32_t>(be_, pos);
    in.learned_pos = DeviceArray<int32_t>(be_, learned);
    in.mask = DeviceArray<uint8_t>(be_, mask);
    if (targets) {
      for (int32_t t : *targets) ZOF_CHECK(t < cfg_.vocab_size, "target id out of range");
      in.host_targets = *targets;
      in.targets = DeviceArray<int32_t>(be_, *targets);
    }
    be_.synchronize(nullptr);
    return in;
  }

  // h (B*T, C)
  void embed(const EmbedWeights& w, const DeviceInputs& in, float* h) {
    const int64_t C = cfg_.hidden_size, rows = in.B * in.T;
    if (w.project_in) {
      const int64_t E = cfg_.word_embed_proj_dim;
      be_.embedding(in.ids.get(), w.tokens, xn_.get(), rows, E, false);
      be_.matmul(xn_.get(), w.project_in, nullptr, h, rows, C, E);
    } else {
      be_.embedding(in.ids.get(), w.tokens, h, rows, C, false);
    }
    if (w.positions) be_.embedding(in.learned_pos.get(), w.positions, h, rows, C, true);
  }

  // One layer in place on h (B, T, C): Forward::layer without the KV cache.
  void layer(const LayerWeights& w, float* h, const DeviceInputs& in) {
    const int64_t C = cfg_.hidden_size, D = cfg_.head_dim, H = cfg_.num_heads;
    const int64_t Hkv = cfg_.num_kv_heads, Hq = H * D, Hk = Hkv * D, rows = in.B * in.T;
    const bool llama = cfg_.arch == Arch::Llama;
    const bool pre_norm = llama || cfg_.arch == Arch::GPT2 || cfg_.do_layer_norm_before;
    auto norm = [&](const float* x, const float* nw, const float* nb, float* y) {
      if (llama)
        be_.rms_norm(x, nw, y, rows, C, cfg_.norm_eps);
      else
        be_.layer_norm(x, nw, nb, y, rows, C, cfg_.norm_eps);
    };
    float *xn = xn_.get(), *q = q_.get(), *k = k_.get(), *v = v_.get(), *att = att_.get();
    float* tmp = tmp_.get();
    const float* x = h;
    if (pre_norm) {
      norm(h, w.ln1_w, w.ln1_b, xn);
      x = xn;
    }
    if (w.qkv_w) {  // GPT-2's fused c_attn (3C, C): its three row blocks are q, k and v
      be_.matmul(x, w.qkv_w, w.qkv_b, q, rows, C, C);
      be_.matmul(x, w.qkv_w + C * C, w.qkv_b ? w.qkv_b + C : nullptr, k, rows, C, C);
      be_.matmul(x, w.qkv_w + 2 * C * C, w.qkv_b ? w.qkv_b + 2 * C : nullptr, v, rows, C, C);
    } else {
      be_.matmul(x, w.q_w, w.q_b, q, rows, Hq, C);
      be_.matmul(x, w.k_w, w.k_b, k, rows, Hk, C);
      be_.matmul(x, w.v_w, w.v_b, v, rows, Hk, C);
    }
    if (llama) {
      be_.rope(q, in.pos.get(), rows, H, D, cfg_.rope_theta);
      be_.rope(k, in.pos.get(), rows, Hkv, D, cfg_.rope_theta);
    }
    be_.attention(q, k, v, att, in.mask.get(), in.B, in.T, in.T, H, Hkv, D, 0,
                  1.f / std::sqrt((float)D));
    be_.matmul(att, w.o_w, w.o_b, tmp, rows, C, Hq);
    be_.add(h, tmp, rows * C);
    if (!pre_norm) norm(h, w.ln1_w, w.ln1_b, h);
    x = h;
    if (pre_norm) {
      norm(h, w.ln2_w, w.ln2_b, xn);
      x = xn;
    }
    const int64_t I = cfg_.intermediate_size;
    float *f1 = ff1_.get(), *f2 = ff2_.get();
    be_.matmul(x, w.fc1_w, w.fc1_b, f1, rows, I, C);
    if (w.up_w) {
      be_.matmul(x, w.up_w, w.up_b, f2, rows, I, C);
      be_.silu_mul(f1, f2, f1, rows * I);
    } else {
      switch (cfg_.act) {
        case Activation::ReLU: be_.relu(f1, rows * I); break;
        case Activation::GeluTanh: be_.gelu_tanh(f1, rows * I); break;
        case Activation::GeluErf: be_.gelu_erf(f1, rows * I); break;
        case Activation::SiLU: ZOF_ABORT("SiLU without a gate");
      }
    }
    be_.matmul(f1, w.fc2_w, w.fc2_b, tmp, rows, C, I);
    be_.add(h, tmp, rows * C);
    if (!pre_norm) norm(h, w.ln2_w, w.ln2_b, h);
  }

  // logits (rows, V) of h (rows, C), rows <= max_rows.
  void head_logits(const HeadWeights& w, const float* h, int64_t rows, float* logits) {
    const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
    const int64_t E = w.project_out ? cfg_.word_embed_proj_dim : C;
    const float* x = h;
    if (w.norm_w) {
      if (cfg_.arch == Arch::Llama)
        be_.rms_norm(x, w.norm_w, xn_.get(), rows, C, cfg_.norm_eps);
      else
        be_.layer_norm(x, w.norm_w, w.norm_b, xn_.get(), rows, C, cfg_.norm_eps);
      x = xn_.get();
    }
    if (w.project_out) {
      be_.matmul(x, w.project_out, nullptr, tmp_.get(), rows, E, C);
      x = tmp_.get();
    }
    be_.matmul(x, w.lm_head, nullptr, logits, rows, V, E);
  }

  // nll (B*T) on the device for in.targets, logits formed head_chunk rows at a time.
  void head_nll(const HeadWeights& w, const float* h, const DeviceInputs& in, float* nll) {
    const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size, rows = in.B * in.T;
    for (int64_t r0 = 0; r0 < rows; r0 += head_chunk_) {
      const int64_t n = std::min(head_chunk_, rows - r0);
      head_logits(w, h + r0 * C, n, logits_.get());
      be_.cross_entropy(logits_.get(), in.targets.get() + r0, nll + r0, n, V);
    }
  }

  // The whole forward: logits (B*T, V) into a device buffer of that size.
  void logits(const DeviceModel& m, const DeviceInputs& in, float* h, float* logits) {
    embed(m.embed(), in, h);
    for (int64_t i = 0; i < m.num_layers(); ++i) layer(m.layer(int(i)), h, in);
    head_logits(m.head(), h, in.B * in.T, logits);
  }

 private:
  ModelConfig cfg_;
  Backend& be_;
  int64_t max_rows_, head_chunk_;
  DeviceArray<float> xn_, q_, k_, v_, att_, tmp_, ff1_, ff2_, logits_;
};

// ZOEngine::perturbed_losses on device buffers: the same dual-forward walk, the pending update
// fused into the first micro-batch's perturbation of each block.
class DeviceZO {
 public:
  DeviceZO(DeviceModel& m, Backend& be, int64_t max_rows, ZOStepOptions opt,
           int64_t head_chunk = 1024)
      : m_(m), be_(be), fwd_(m.cfg, be, max_rows, head_chunk), opt_(opt), max_rows_(max_rows) {
    int64_t span = 1;
    for (size_t b = 1; b < m.blocks.size(); ++b) span = std::max(span, m.blocks[b].span);
    for (int j = 0; j < opt.queries; ++j) {
      embed_plus_.emplace_back(be, m.blocks[0].span);
      embed_minus_.emplace_back(be, m.blocks[0].span);
      hp_.emplace_back(be, max_rows * m.cfg.hidden_size);
      hm_.emplace_back(be, max_rows * m.cfg.hidden_size);
    }
    blk_plus_ = DeviceArray<float>(be, span);
    blk_minus_ = DeviceArray<float>(be, span);
    nll_ = DeviceArray<float>(be, max_rows);
  }

  void set_pending(PendingUpdate p) { pending_ = std::move(p); }
  DeviceForward& forward() { return fwd_; }

  QueryLosses perturbed_losses(uint32_t step, const std::vector<LossBatch>& micro) {
    ZOF_CHECK(!micro.empty(), "a ZO step needs at least one batch");
    const int q = opt_.queries;
    const int nblocks = (int)m_.blocks.size();
    QueryLosses out;
    out.sum_plus.assign(q, 0.0);
    out.sum_minus.assign(q, 0.0);
    std::vector<ZKey> keys(q);
    for (int j = 0; j < q; ++j) keys[j] = ZKey{opt_.seed, step, (uint32_t)j};
    for (size_t mb = 0; mb < micro.size(); ++mb) {
      const DeviceInputs in = fwd_.upload(micro[mb].batch, &micro[mb].targets);
      const int64_t rows = in.B * in.T;
      const bool first = mb == 0;
      for (int j = 0; j < q; ++j) {
        block_pass(0, first && j == 0, &keys[j], embed_plus_[j].get(), embed_minus_[j].get());
        fwd_.embed(m_.embed(embed_plus_[j].get()), in, hp_[j].get());
        fwd_.embed(m_.embed(embed_minus_[j].get()), in, hm_[j].get());
      }
      for (int li = 0; li < nblocks - 2; ++li) {
        for (int j = 0; j < q; ++j) {
          block_pass(li + 1, first && j == 0, &keys[j], blk_plus_.get(), blk_minus_.get());
          fwd_.layer(m_.layer(li, blk_plus_.get()), hp_[j].get(), in);
          fwd_.layer(m_.layer(li, blk_minus_.get()), hm_[j].get(), in);
        }
      }
      std::vector<float> nll(rows);
      for (int j = 0; j < q; ++j) {
        block_pass(nblocks - 1, first && j == 0, &keys[j], blk_plus_.get(), blk_minus_.get());
        for (int sign = 0; sign < 2; ++sign) {
          const float* head = sign == 0 ? blk_plus_.get() : blk_minus_.get();
          const float* emb = sign == 0 ? embed_plus_[j].get() : embed_minus_[j].get();
          fwd_.head_nll(m_.head(head, m_.embed(emb).tokens), (sign == 0 ? hp_ : hm_)[j].get(), in,
                        nll_.get());
          be_.copy_to_host(nll.data(), nll_.get(), size_t(rows) * sizeof(float), nullptr);
          be_.synchronize(nullptr);
          double s = 0;
          for (int64_t r = 0; r < rows; ++r) s += nll[r];
          (sign == 0 ? out.sum_plus : out.sum_minus)[j] += s;
        }
      }
      out.count += (double)micro[mb].scored();
    }
    pending_ = PendingUpdate{};
    return out;
  }

  // Applies the pending update to every tensor now (ZOEngine::flush).
  void flush() {
    if (pending_.empty()) return;
    for (const auto& b : m_.blocks)
      for (const auto& t : b.tensors)
        be_.zo_pass(b.base + t.offset, t.numel, t.id, 0, pending_.terms.data(),
                    (int)pending_.terms.size(), t.decay ? pending_.lr_wd : 0.f, nullptr, 0.f,
                    nullptr, nullptr);
    pending_ = PendingUpdate{};
  }

  // One block's pass into plus/minus copies of its span (ZOEngine::block_pass).
  void block_pass(int block, bool apply_update, const ZKey* cur, float* plus, float* minus) {
    const auto& b = m_.blocks[block];
    const bool upd = apply_update && !pending_.empty();
    for (const auto& t : b.tensors)
      be_.zo_pass(b.base + t.offset, t.numel, t.id, 0, upd ? pending_.terms.data() : nullptr,
                  upd ? (int)pending_.terms.size() : 0, t.decay ? pending_.lr_wd : 0.f, cur,
                  opt_.eps, plus ? plus + t.offset : nullptr, minus ? minus + t.offset : nullptr);
  }

 private:
  DeviceModel& m_;
  Backend& be_;
  DeviceForward fwd_;
  ZOStepOptions opt_;
  PendingUpdate pending_;
  int64_t max_rows_;
  std::vector<DeviceArray<float>> embed_plus_, embed_minus_, hp_, hm_;
  DeviceArray<float> blk_plus_, blk_minus_, nll_;
};

}  // namespace zof::gpu
