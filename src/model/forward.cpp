// The forward pass of all three families over the Backend interface, block by block.
// Llama: pre-RMSNorm, RoPE, GQA, SwiGLU. OPT: learned positions (offset 2), pre- or post-
// LayerNorm, ReLU, optional project_in/out. GPT-2: learned positions, fused QKV, tanh GELU.
#include "zof/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "zof/error.h"
#include "zof/streaming.h"

namespace zof {
namespace {
enum Buf { XN, Q, K, V, ATT, TMP, FF1, FF2, LOGITS, HID, HS, NLL, NBUF };
constexpr int64_t kHeadChunk = 256;  // rows of logits formed at once (M of the LM-head GEMM)
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

Forward::Forward(const Model& model, Backend& backend, int64_t max_rows)
    : model_(model), cfg_(model.config()), be_(backend), max_rows_(max_rows) {
  const int64_t C = cfg_.hidden_size, E = std::max(C, cfg_.word_embed_proj_dim);
  const int64_t Hq = cfg_.num_heads * cfg_.head_dim, Hk = cfg_.num_kv_heads * cfg_.head_dim;
  const int64_t F = std::max(cfg_.intermediate_size, 3 * C);
  const int64_t R = std::max(max_rows, kHeadChunk);  // rows of the head's gathers
  const int64_t sizes[NBUF] = {max_rows * E,  max_rows * Hq, max_rows * Hk,
                               max_rows * Hk, max_rows * Hq, max_rows * E,
                               max_rows * F,  max_rows * F,  kHeadChunk * cfg_.vocab_size,
                               max_rows * C,  R * C,         R};
  const int64_t isizes[kNIBuf] = {max_rows, max_rows, max_rows, max_rows, R, R};
  try {
    for (int i = 0; i < NBUF; ++i) bufs_.push_back((float*)be_.alloc(sizes[i] * sizeof(float)));
    for (int i = 0; i < kNIBuf; ++i)
      ibufs_.push_back((int32_t*)be_.alloc(isizes[i] * sizeof(int32_t)));
    mask_ = (uint8_t*)be_.alloc(max_rows);
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
}

DeviceInputs Forward::upload(const Batch& b, const int32_t* ids) {
  const int64_t rows = b.B * b.T, V = cfg_.vocab_size;
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
    for (int64_t t = 0; t < b.T; ++t) {
      pos[i * b.T + t] = (int32_t)t;
      embed_pos[i * b.T + t] = (int32_t)t + offset;
      mask[i * b.T + t] = t < b.lengths[i];
    }
  // From pageable host memory: the copies are staged before the calls return, so the vectors
  // may go at the end of this function.
  int32_t* dids = ibuf(ids ? kLocal : kIds);
  be_.copy_to_device(dids, ids ? ids : b.ids.data(), rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(ibuf(kPos), pos.data(), rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(ibuf(kEmbedPos), embed_pos.data(), rows * sizeof(int32_t), nullptr);
  be_.copy_to_device(mask_, mask.data(), rows, nullptr);
  be_.synchronize(nullptr);
  return DeviceInputs{dids, ibuf(kPos), ibuf(kEmbedPos), mask_, b.B, b.T};
}

void Forward::embed(const EmbedWeights& w, const int32_t* ids, const int32_t* embed_pos,
                    int64_t rows, float* h) {
  const int64_t C = cfg_.hidden_size;
  if (w.project_in) {  // OPT-350m: embed in E dims, project to C
    const int64_t E = cfg_.word_embed_proj_dim;
    be_.embedding(ids, w.tokens, buf(XN), rows, E, false);
    be_.matmul(buf(XN), w.project_in, nullptr, h, rows, C, E);
  } else {
    be_.embedding(ids, w.tokens, h, rows, C, false);
  }
  if (w.positions) be_.embedding(embed_pos, w.positions, h, rows, C, true);
}

void Forward::layer(int li, const LayerWeights& w, float* h, int64_t B, int64_t T,
                    const int32_t* pos, const uint8_t* key_mask, KVCache* cache) {
  const int64_t C = cfg_.hidden_size, D = cfg_.head_dim, H = cfg_.num_heads;
  const int64_t Hkv = cfg_.num_kv_heads, Hq = H * D, Hk = Hkv * D, rows = B * T;
  ZOF_ASSERT(rows <= max_rows_);
  const bool llama = cfg_.arch == Arch::Llama;
  const bool pre_norm = llama || cfg_.arch == Arch::GPT2 || cfg_.do_layer_norm_before;
  auto norm = [&](const float* x, const float* nw, const float* nb, float* y) {
    if (llama)
      be_.rms_norm(x, nw, y, rows, C, cfg_.norm_eps);
    else
      be_.layer_norm(x, nw, nb, y, rows, C, cfg_.norm_eps);
  };
  float *xn = buf(XN), *q = buf(Q), *k = buf(K), *v = buf(V), *att = buf(ATT), *tmp = buf(TMP);

  // ---- attention ----
  const float* x = h;
  if (pre_norm) {
    norm(h, w.ln1_w, w.ln1_b, xn);
    x = xn;
  }
  if (w.qkv_w) {  // GPT-2 fused c_attn: (rows, 3C) then split
    float* qkv = buf(FF1);
    be_.matmul(x, w.qkv_w, w.qkv_b, qkv, rows, 3 * C, C);
    const size_t row = C * sizeof(float);
    be_.copy_device_2d(q, row, qkv, 3 * row, row, rows, nullptr);
    be_.copy_device_2d(k, row, qkv + C, 3 * row, row, rows, nullptr);
    be_.copy_device_2d(v, row, qkv + 2 * C, 3 * row, row, rows, nullptr);
  } else {
    be_.matmul(x, w.q_w, w.q_b, q, rows, Hq, C);
    be_.matmul(x, w.k_w, w.k_b, k, rows, Hk, C);
    be_.matmul(x, w.v_w, w.v_b, v, rows, Hk, C);
  }
  if (llama) {
    be_.rope(q, pos, rows, H, D, cfg_.rope_theta);
    be_.rope(k, pos, rows, Hkv, D, cfg_.rope_theta);
  }
  const float scale = 1.f / std::sqrt((float)D);
  if (cache) {
    const int64_t start = cache->length, Tk = start + T;
    ZOF_CHECK(Tk <= cache->capacity, "generation ran past the KV cache capacity of " +
                                         std::to_string(cache->capacity) + " tokens");
    auto& kc = cache->k[li];
    auto& vc = cache->v[li];
    for (int64_t b = 0; b < B; ++b) {
      float* kb = kc.data() + b * cache->capacity * Hk;
      float* vb = vc.data() + b * cache->capacity * Hk;
      std::memcpy(kb + start * Hk, k + b * T * Hk, T * Hk * sizeof(float));
      std::memcpy(vb + start * Hk, v + b * T * Hk, T * Hk * sizeof(float));
      be_.attention(q + b * T * Hq, kb, vb, att + b * T * Hq, nullptr, 1, T, Tk, H, Hkv, D,
                    start, scale);
    }
  } else {
    be_.attention(q, k, v, att, key_mask, B, T, T, H, Hkv, D, 0, scale);
  }
  be_.matmul(att, w.o_w, w.o_b, tmp, rows, C, Hq);
  be_.add(h, tmp, rows * C);
  if (!pre_norm) norm(h, w.ln1_w, w.ln1_b, h);

  // ---- feed-forward ----
  x = h;
  if (pre_norm) {
    norm(h, w.ln2_w, w.ln2_b, xn);
    x = xn;
  }
  const int64_t I = cfg_.intermediate_size;
  float *f1 = buf(FF1), *f2 = buf(FF2);
  be_.matmul(x, w.fc1_w, w.fc1_b, f1, rows, I, C);
  if (w.up_w) {
    be_.matmul(x, w.up_w, w.up_b, f2, rows, I, C);
    be_.silu_mul(f1, f2, f1, rows * I);
  } else {
    switch (cfg_.act) {
      case Activation::ReLU: be_.relu(f1, rows * I); break;
      case Activation::GeluTanh: be_.gelu_tanh(f1, rows * I); break;
      case Activation::GeluErf: be_.gelu_erf(f1, rows * I); break;
      case Activation::SiLU: ZOF_ABORT("SiLU without a gate is not an architecture zof knows");
    }
  }
  be_.matmul(f1, w.fc2_w, w.fc2_b, tmp, rows, C, I);
  be_.add(h, tmp, rows * C);
  if (!pre_norm) norm(h, w.ln2_w, w.ln2_b, h);
}

void Forward::head_logits(const HeadWeights& w, const float* h, int64_t rows, float* logits) {
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  const int64_t E = w.project_out ? cfg_.word_embed_proj_dim : C;
  for (int64_t r0 = 0; r0 < rows; r0 += max_rows_) {
    const int64_t n = std::min(max_rows_, rows - r0);
    const float* x = h + r0 * C;
    if (w.norm_w) {
      if (cfg_.arch == Arch::Llama)
        be_.rms_norm(x, w.norm_w, buf(XN), n, C, cfg_.norm_eps);
      else
        be_.layer_norm(x, w.norm_w, w.norm_b, buf(XN), n, C, cfg_.norm_eps);
      x = buf(XN);
    }
    if (w.project_out) {
      be_.matmul(x, w.project_out, nullptr, buf(TMP), n, E, C);
      x = buf(TMP);
    }
    be_.matmul(x, w.lm_head, nullptr, logits + r0 * V, n, V, E);
  }
}

int64_t Forward::head_width() const {
  return cfg_.word_embed_proj_dim > 0 && cfg_.word_embed_proj_dim != cfg_.hidden_size
             ? cfg_.word_embed_proj_dim
             : cfg_.hidden_size;
}

void Forward::head_features(const HeadWeights& w, const float* h, int64_t rows, float* x) {
  const int64_t C = cfg_.hidden_size;
  ZOF_ASSERT(rows <= max_rows_ && x != h);
  const float* in = h;
  if (w.norm_w) {
    float* y = w.project_out ? buf(XN) : x;
    if (cfg_.arch == Arch::Llama)
      be_.rms_norm(in, w.norm_w, y, rows, C, cfg_.norm_eps);
    else
      be_.layer_norm(in, w.norm_w, w.norm_b, y, rows, C, cfg_.norm_eps);
    in = y;
  }
  if (w.project_out) {
    be_.matmul(in, w.project_out, nullptr, x, rows, head_width(), C);
  } else if (in != x) {
    be_.copy_device(x, in, rows * C * sizeof(float), nullptr);
  }
}

void Forward::head_nll(const HeadWeights& w, const float* h, int64_t rows, const int32_t* targets,
                       float* nll) {
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  // Only rows with a target need logits: gather them (the embedding op, with h as the table),
  // then form logits kHeadChunk at a time.
  std::vector<int32_t> sel, tg;
  for (int64_t r = 0; r < rows; ++r) {
    nll[r] = 0.f;
    if (targets[r] >= 0) {
      ZOF_CHECK(targets[r] < V, "target token id " + std::to_string(targets[r]) +
                                    " is outside the vocabulary of " + std::to_string(V));
      sel.push_back((int32_t)r);
      tg.push_back(targets[r]);
    }
  }
  std::vector<float> out(kHeadChunk);
  for (size_t s0 = 0; s0 < sel.size(); s0 += kHeadChunk) {
    const int64_t n = std::min<int64_t>(kHeadChunk, sel.size() - s0);
    be_.copy_to_device(ibuf(kSel), sel.data() + s0, n * sizeof(int32_t), nullptr);
    be_.copy_to_device(ibuf(kTargets), tg.data() + s0, n * sizeof(int32_t), nullptr);
    be_.embedding(ibuf(kSel), h, buf(HS), n, C, false);
    head_logits(w, buf(HS), n, buf(LOGITS));
    be_.cross_entropy(buf(LOGITS), ibuf(kTargets), buf(NLL), n, V);
    be_.copy_to_host(out.data(), buf(NLL), n * sizeof(float), nullptr);
    be_.synchronize(nullptr);
    for (int64_t i = 0; i < n; ++i) nll[sel[s0 + i]] = out[i];
  }
}

// ---- the whole-model methods: the walk over blocks at the model's weights --------------------

void Forward::acquire(int block) {
  if (weights_) weights_->acquire(block);
}
void Forward::release(int block) {
  if (weights_) weights_->release(block, false);
}
EmbedWeights Forward::embed_weights() const {
  if (!weights_) return model_.embed();
  return model_.embed([this](int pi) -> const float* { return weights_->param(pi); });
}
LayerWeights Forward::layer_weights(int li) const {
  if (!weights_) return model_.layer(li);
  return model_.layer(li, [this](int pi) -> const float* { return weights_->param(pi); });
}
HeadWeights Forward::head_weights() const {
  if (!weights_) return model_.head();
  return model_.head([this](int pi) -> const float* { return weights_->param(pi); });
}
std::vector<int> Forward::head_blocks() const {
  const int last = (int)model_.blocks().size() - 1;
  if (cfg_.tie_embeddings) return {last, 0};
  return {last};
}

void Forward::hidden(const Batch& batch) {
  const DeviceInputs in = upload(batch);
  const int64_t rows = batch.B * batch.T;
  float* h = buf(HID);
  if (weights_) {
    std::vector<int> order;
    for (int b = 0; b <= (int)cfg_.num_layers; ++b) order.push_back(b);
    for (int b : head_blocks()) order.push_back(b);
    weights_->begin_walk(std::move(order));
  }
  acquire(0);
  embed(embed_weights(), in.ids, in.embed_pos, rows, h);
  release(0);
  for (int i = 0; i < cfg_.num_layers; ++i) {
    acquire(i + 1);
    layer(i, layer_weights(i), h, batch.B, batch.T, in.pos, in.key_mask, nullptr);
    release(i + 1);
  }
}

void Forward::logits_to_host(const float* h, int64_t n, float* out) {
  const int64_t V = cfg_.vocab_size;
  const std::vector<int> hb = head_blocks();
  for (int b : hb) acquire(b);
  const HeadWeights w = head_weights();
  for (int64_t r0 = 0; r0 < n; r0 += kHeadChunk) {
    const int64_t m = std::min(kHeadChunk, n - r0);
    head_logits(w, h + r0 * cfg_.hidden_size, m, buf(LOGITS));
    be_.copy_to_host(out + r0 * V, buf(LOGITS), m * V * sizeof(float), nullptr);
  }
  be_.synchronize(nullptr);
  for (int b : hb) release(b);
}

void Forward::logits(const Batch& batch, std::vector<float>& out) {
  hidden(batch);
  const int64_t rows = batch.B * batch.T;
  out.resize(rows * cfg_.vocab_size);
  logits_to_host(buf(HID), rows, out.data());
}

void Forward::nll(const Batch& batch, const int32_t* targets, float* nll) {
  hidden(batch);
  const std::vector<int> hb = head_blocks();
  for (int b : hb) acquire(b);
  head_nll(head_weights(), buf(HID), batch.B * batch.T, targets, nll);
  for (int b : hb) release(b);
}

void Forward::next_token_nll(const Batch& batch, std::vector<float>& out) {
  std::vector<int32_t> targets(batch.B * batch.T, -1);
  for (int64_t b = 0; b < batch.B; ++b)
    for (int64_t t = 0; t + 1 < batch.lengths[b]; ++t)
      targets[b * batch.T + t] = batch.ids[b * batch.T + t + 1];
  out.resize(batch.B * batch.T);
  nll(batch, targets.data(), out.data());
}

KVCache Forward::make_cache(int64_t B, int64_t capacity) const {
  KVCache c;
  c.B = B;
  c.capacity = std::min(capacity, cfg_.max_position);
  const int64_t n = B * c.capacity * cfg_.num_kv_heads * cfg_.head_dim;
  c.k.assign(cfg_.num_layers, std::vector<float>(n));
  c.v.assign(cfg_.num_layers, std::vector<float>(n));
  return c;
}

void Forward::decode_step(const int32_t* ids, int64_t B, int64_t T, KVCache& cache,
                          std::vector<float>& last_logits) {
  const int64_t rows = B * T, C = cfg_.hidden_size, V = cfg_.vocab_size;
  ZOF_CHECK(!weights_, "generation keeps its KV cache in host memory: it runs on the CPU backend");
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
  float* h = buf(HID);
  embed(model_.embed(), ibuf(kIds), ibuf(kEmbedPos), rows, h);
  for (int i = 0; i < cfg_.num_layers; ++i)
    layer(i, model_.layer(i), h, B, T, ibuf(kPos), nullptr, &cache);
  cache.length += T;
  // Each row's last position.
  be_.copy_device_2d(buf(HS), C * sizeof(float), h + (T - 1) * C, T * C * sizeof(float),
                     C * sizeof(float), B, nullptr);
  last_logits.resize(B * V);
  logits_to_host(buf(HS), B, last_logits.data());
}

}  // namespace zof
