// The forward pass of all three families over the Backend interface, block by block.
// Llama: pre-RMSNorm, RoPE, GQA, SwiGLU. OPT: learned positions (offset 2), pre- or post-
// LayerNorm, ReLU, optional project_in/out. GPT-2: learned positions, fused QKV, tanh GELU.
#include "zof/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "zof/error.h"

namespace zof {
namespace {
enum Buf { XN, Q, K, V, ATT, TMP, FF1, FF2, LOGITS, NBUF };
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
  const int64_t sizes[NBUF] = {max_rows * E,  max_rows * Hq, max_rows * Hk,
                               max_rows * Hk, max_rows * Hq, max_rows * E,
                               max_rows * F,  max_rows * F,  kHeadChunk * cfg_.vocab_size};
  try {
    for (int i = 0; i < NBUF; ++i) bufs_.push_back((float*)be_.alloc(sizes[i] * sizeof(float)));
  } catch (...) {  // a device budget ran out part way: give back what was taken
    for (float* p : bufs_) be_.free(p);
    throw;
  }
}

Forward::~Forward() {
  for (float* p : bufs_) be_.free(p);
}

void Forward::embed(const EmbedWeights& w, const int32_t* ids, const int32_t* pos, int64_t rows,
                    float* h) {
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  for (int64_t i = 0; i < rows; ++i)
    ZOF_CHECK(ids[i] >= 0 && ids[i] < V, "token id " + std::to_string(ids[i]) +
                                             " is outside the model's vocabulary of " +
                                             std::to_string(V));
  for (int64_t i = 0; i < rows; ++i)
    ZOF_CHECK(pos[i] >= 0 && pos[i] < cfg_.max_position,
              "position " + std::to_string(pos[i]) + " is beyond the model's context of " +
                  std::to_string(cfg_.max_position) + " tokens (max_position_embeddings)");
  if (w.project_in) {  // OPT-350m: embed in E dims, project to C
    const int64_t E = cfg_.word_embed_proj_dim;
    be_.embedding(ids, w.tokens, buf(XN), rows, E, false);
    be_.matmul(buf(XN), w.project_in, nullptr, h, rows, C, E);
  } else {
    be_.embedding(ids, w.tokens, h, rows, C, false);
  }
  if (w.positions) {
    std::vector<int32_t> p(pos, pos + rows);
    if (cfg_.arch == Arch::OPT)
      for (auto& x : p) x += 2;  // OPTLearnedPositionalEmbedding's offset
    be_.embedding(p.data(), w.positions, h, rows, C, true);
  }
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
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(q + r * C, qkv + r * 3 * C, C * sizeof(float));
      std::memcpy(k + r * C, qkv + r * 3 * C + C, C * sizeof(float));
      std::memcpy(v + r * C, qkv + r * 3 * C + 2 * C, C * sizeof(float));
    }
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
  // Only rows with a target need logits: gather them, then form logits kHeadChunk at a time.
  std::vector<int64_t> sel;
  for (int64_t r = 0; r < rows; ++r) {
    nll[r] = 0.f;
    if (targets[r] >= 0) {
      ZOF_CHECK(targets[r] < V, "target token id " + std::to_string(targets[r]) +
                                    " is outside the vocabulary of " + std::to_string(V));
      sel.push_back(r);
    }
  }
  std::vector<float> hs(kHeadChunk * C), out(kHeadChunk);
  std::vector<int32_t> tg(kHeadChunk);
  for (size_t s0 = 0; s0 < sel.size(); s0 += kHeadChunk) {
    const int64_t n = std::min<int64_t>(kHeadChunk, sel.size() - s0);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(hs.data() + i * C, h + sel[s0 + i] * C, C * sizeof(float));
      tg[i] = targets[sel[s0 + i]];
    }
    head_logits(w, hs.data(), n, buf(LOGITS));
    be_.cross_entropy(buf(LOGITS), tg.data(), out.data(), n, V);
    for (int64_t i = 0; i < n; ++i) nll[sel[s0 + i]] = out[i];
  }
}

namespace {
void batch_positions_and_mask(const Batch& b, std::vector<int32_t>& pos,
                              std::vector<uint8_t>& mask) {
  pos.resize(b.B * b.T);
  mask.resize(b.B * b.T);
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t t = 0; t < b.T; ++t) {
      pos[i * b.T + t] = (int32_t)t;
      mask[i * b.T + t] = t < b.lengths[i];
    }
}
}  // namespace

void Forward::hidden(const Batch& batch, std::vector<float>& h) {
  const int64_t rows = batch.B * batch.T;
  ZOF_CHECK(rows <= max_rows_, "batch of " + std::to_string(rows) +
                                   " tokens exceeds this forward's capacity");
  batch_positions_and_mask(batch, pos_, mask_);
  h.resize(rows * cfg_.hidden_size);
  embed(model_.embed(), batch.ids.data(), pos_.data(), rows, h.data());
  for (int i = 0; i < cfg_.num_layers; ++i)
    layer(i, model_.layer(i), h.data(), batch.B, batch.T, pos_.data(), mask_.data(), nullptr);
}

void Forward::logits(const Batch& batch, std::vector<float>& out) {
  std::vector<float> h;
  hidden(batch, h);
  const int64_t rows = batch.B * batch.T;
  out.resize(rows * cfg_.vocab_size);
  head_logits(model_.head(), h.data(), rows, out.data());
}

void Forward::nll(const Batch& batch, const int32_t* targets, float* nll) {
  std::vector<float> h;
  hidden(batch, h);
  head_nll(model_.head(), h.data(), batch.B * batch.T, targets, nll);
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
  ZOF_CHECK(B == cache.B, "batch size differs from the KV cache's");
  ZOF_CHECK(rows <= max_rows_, "decode step of " + std::to_string(rows) +
                                   " tokens exceeds this forward's capacity");
  std::vector<int32_t> pos(rows);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pos[b * T + t] = (int32_t)(cache.length + t);
  std::vector<float> h(rows * C);
  embed(model_.embed(), ids, pos.data(), rows, h.data());
  for (int i = 0; i < cfg_.num_layers; ++i)
    layer(i, model_.layer(i), h.data(), B, T, pos.data(), nullptr, &cache);
  cache.length += T;
  std::vector<float> last(B * C);
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(last.data() + b * C, h.data() + (b * T + T - 1) * C, C * sizeof(float));
  last_logits.resize(B * V);
  head_logits(model_.head(), last.data(), B, last_logits.data());
}

}  // namespace zof
