// The graph of each block of the three families, written once: the embedding, the transformer
// layer (LLaMA-family: pre-RMSNorm, RoPE, GQA, SwiGLU, Qwen3's per-head q/k RMSNorm; Gemma 2/3:
// scaled embedding, (1 + w) RMSNorm, sandwich norms, GeGLU, sliding-window layers and soft-capped
// scores and logits; OPT:
// learned positions, pre- or post-LayerNorm, ReLU, optional project_in/out; GPT-2: fused QKV,
// tanh GELU) and the head.
// Every walk runs these functions; what differs is the ops object they are handed (graph_ops.h):
// the plain forward and the SPSA dual walk run the primal ops on one stream's buffers, the JVP
// walk runs the primal ops and then, per direction, the tangent ops over the same graph.
// Adding an op to a block is one edit here.
//
// An ops object O provides, over named values (Value) that it maps to buffers of `rows` rows:
//   using W = ...;                                      the weight handle (a view's slot type)
//   norm(y, x, w, b)                                    RMSNorm (LLaMA) or LayerNorm over C
//   head_norm(y, x, w, heads)                           RMSNorm over each head's D (Qwen3's q/k)
//   scale(x, a)                                         x *= a in place, (rows, C)
//   softcap(y, x)                                       y = c tanh(x / c) of the logits (rows, V)
//   matmul(y, x, w, b, N, K)                            y(rows,N) = x(rows,K) w^T + b
//   split_qkv(qkv, q, k, v)                             GPT-2's (rows, 3C) into three (rows, C)
//   rope(x, heads)                                      RoPE in place (the first Dr dims per head)
//   attention(out, q, k, v)                             causal masked attention
//   activation(out, f1, f2)                             act(f1) * f2 (f2 != kNone; SiLU or tanh
//                                                       GELU), else act(f1)
//   add(y, a, b)  copy(y, x)
//   gather(y, table, dim, positions)                    embedding rows of the ids (or positions)
//   gather_add(y, table, dim)                           += rows of a learned position table
//   cross_entropy(nll, logits)                          per-row NLL of the targets
// A value may share a buffer with others only where the graph allows (a walk that keeps them
// all distinct, as the JVP walk must, is always correct).
#pragma once
#include <cstdint>

#include "zof/config.h"
#include "zof/model.h"

namespace zof::graph {

// The values of the graphs. A layer reads kHIn and leaves its output in kHOut; the embedding
// writes kHOut; the head reads kHIn.
enum Value : int {
  kHIn, kXn1, kQKV, kQ, kK, kV, kAtt, kAttOut, kH1, kX2, kF1, kF2, kAct, kFfnOut, kH2, kHOut,
  kEmb,     // the embedding's token rows in E dims before project_in (OPT-350m)
  kHn, kHo, kLogits, kNll,  // the head: final norm, project_out, logits, loss
  kQp, kKp,  // q and k as projected, before Qwen3's q_norm/k_norm (which write kQ and kK)
  kAttN, kFfnN,  // Gemma: the attention and FFN outputs normed (post_attention/feedforward)
  kLogitsRaw,    // Gemma 2: the logits before final_logit_softcapping (which writes kLogits)
  kNumValues,
  kNone = -1
};

// What the graphs branch on, from the config.
struct Dims {
  int64_t C = 0, E = 0, H = 0, Hkv = 0, D = 0, Hq = 0, Hk = 0, I = 0, V = 0;
  int64_t Dr = 0;         // RoPE's rotated dims per head (<= D); its table is the frame's
  bool rms_norm = false;  // LLaMA-family: RMSNorm and RoPE; OPT and GPT-2: LayerNorm
  bool pre_norm = true;   // OPT-350m: post-norm
  bool qk_norm = false;   // Qwen3: RMSNorm of each head of q and k before RoPE
  Activation act = Activation::SiLU;
  float eps = 0.f;
  // Gemma (config.h; each 0 or false elsewhere): RMSNorm's weight offset, the embedding's scale,
  // the sandwich norms, the attention's scale (0: head_dim^-1/2) and soft-caps, the final
  // logits' soft-cap.
  float norm_offset = 0.f, embed_scale = 0.f;
  bool sandwich = false;
  float attn_scale = 0.f, attn_softcap = 0.f, final_softcap = 0.f;
  // One layer's attention (of(c, layer)): its sliding window (0: none), and whether RoPE uses
  // the frame's local table (Gemma 3's sliding layers).
  int64_t window = 0;
  bool local_rope = false;
  // E: the LM head's input width (OPT-350m's word_embed_proj_dim), else C.
  static Dims of(const ModelConfig& c) {
    Dims d;
    d.C = c.hidden_size;
    d.E = c.word_embed_proj_dim > 0 && c.word_embed_proj_dim != c.hidden_size
              ? c.word_embed_proj_dim
              : c.hidden_size;
    d.H = c.num_heads, d.Hkv = c.num_kv_heads, d.D = c.head_dim;
    d.Hq = d.H * d.D, d.Hk = d.Hkv * d.D;
    d.I = c.intermediate_size, d.V = c.vocab_size;
    d.rms_norm = c.arch == Arch::Llama;
    d.pre_norm = c.arch == Arch::Llama || c.arch == Arch::GPT2 || c.do_layer_norm_before;
    d.act = c.act;
    d.eps = c.norm_eps;
    d.Dr = c.rotary_dim;
    d.qk_norm = c.qk_norm;
    d.norm_offset = c.norm_offset, d.embed_scale = c.embed_scale;
    d.sandwich = c.sandwich_norm;
    d.attn_scale = c.attn_scale, d.attn_softcap = c.attn_softcap;
    d.final_softcap = c.final_softcap;
    return d;
  }
  // The dims of layer `layer`: the model's, with that layer's window and RoPE table.
  static Dims of(const ModelConfig& c, int64_t layer) {
    Dims d = of(c);
    const bool sliding = layer >= 0 && layer < (int64_t)c.layer_sliding.size() &&
                         c.layer_sliding[size_t(layer)];
    d.window = sliding ? c.sliding_window : 0;
    d.local_rope = sliding && !c.rope_local_inv_freq.empty();
    return d;
  }
};

// Whether a weight slot is present (a null pointer, or a pair whose weight is null, is absent).
template <class W>
bool present(const W& w) {
  if constexpr (requires { w.w; })
    return w.w != nullptr;
  else
    return static_cast<bool>(w);
}

// The embedding: token rows (through project_in when the table is narrower), plus learned
// positions, into kHOut.
template <class O, class W>
void embed(O& o, const Dims& d, const EmbedT<W>& w) {
  if (present(w.project_in)) {
    o.gather(kEmb, w.tokens, d.E);
    o.matmul(kHOut, kEmb, w.project_in, W{}, d.C, d.E);
  } else {
    o.gather(kHOut, w.tokens, d.C);
  }
  if (present(w.positions)) o.gather_add(kHOut, w.positions, d.C);
  if (d.embed_scale != 0.f) o.scale(kHOut, d.embed_scale);  // Gemma's normalizer
}

// One transformer layer: kHIn -> kHOut.
template <class O, class W>
void layer(O& o, const Dims& d, const LayerT<W>& w) {
  Value x = kHIn;
  if (d.pre_norm) {
    o.norm(kXn1, kHIn, w.ln1_w, w.ln1_b);
    x = kXn1;
  }
  if (present(w.qkv_w)) {  // GPT-2's fused c_attn
    o.matmul(kQKV, x, w.qkv_w, w.qkv_b, 3 * d.C, d.C);
    o.split_qkv(kQKV, kQ, kK, kV);
  } else {
    o.matmul(d.qk_norm ? kQp : kQ, x, w.q_w, w.q_b, d.Hq, d.C);
    o.matmul(d.qk_norm ? kKp : kK, x, w.k_w, w.k_b, d.Hk, d.C);
    o.matmul(kV, x, w.v_w, w.v_b, d.Hk, d.C);
  }
  if (d.qk_norm) {  // Qwen3: q_norm and k_norm over each head, before RoPE
    o.head_norm(kQ, kQp, w.q_norm, d.H);
    o.head_norm(kK, kKp, w.k_norm, d.Hkv);
  }
  if (d.rms_norm) {
    o.rope(kQ, d.H);
    o.rope(kK, d.Hkv);
  }
  o.attention(kAtt, kQ, kK, kV);
  o.matmul(kAttOut, kAtt, w.o_w, w.o_b, d.C, d.Hq);
  if (d.sandwich) {  // Gemma: the attention's output is normed before the residual add
    o.norm(kAttN, kAttOut, w.post_attn_norm, W{});
    o.add(kH1, kHIn, kAttN);
  } else {
    o.add(kH1, kHIn, kAttOut);
  }
  // Pre-norm: the FFN reads LN2(h1) and adds to h1. Post-norm: h1 is normed by LN1 first, and
  // the FFN reads and adds to that.
  if (d.pre_norm)
    o.norm(kX2, kH1, w.ln2_w, w.ln2_b);
  else
    o.norm(kX2, kH1, w.ln1_w, w.ln1_b);
  const Value mid = d.pre_norm ? kH1 : kX2;
  const bool gated = present(w.up_w);
  o.matmul(kF1, kX2, w.fc1_w, w.fc1_b, d.I, d.C);
  if (gated) o.matmul(kF2, kX2, w.up_w, w.up_b, d.I, d.C);
  o.activation(kAct, kF1, gated ? kF2 : kNone);
  o.matmul(kFfnOut, kAct, w.fc2_w, w.fc2_b, d.C, d.I);
  if (d.sandwich) {  // Gemma: likewise the FFN's
    o.norm(kFfnN, kFfnOut, w.post_ffn_norm, W{});
    o.add(kH2, mid, kFfnN);
  } else {
    o.add(kH2, mid, kFfnOut);
  }
  if (d.pre_norm)
    o.copy(kHOut, kH2);
  else
    o.norm(kHOut, kH2, w.ln2_w, w.ln2_b);
}

// The head's features (final norm, OPT's project_out) of kHIn: returns the value that holds the
// LM head's input, (rows, E).
template <class O, class W>
Value head_features(O& o, const Dims& d, const HeadT<W>& w) {
  Value x = kHIn;
  if (present(w.norm_w)) {
    o.norm(kHn, x, w.norm_w, w.norm_b);
    x = kHn;
  }
  if (present(w.project_out)) {
    o.matmul(kHo, x, w.project_out, W{}, d.E, d.C);
    x = kHo;
  }
  return x;
}

// The head: features, then logits (rows, V) into kLogits.
template <class O, class W>
void head_logits(O& o, const Dims& d, const HeadT<W>& w) {
  const Value x = head_features(o, d, w);
  if (d.final_softcap == 0.f) return o.matmul(kLogits, x, w.lm_head, W{}, d.V, d.E);
  o.matmul(kLogitsRaw, x, w.lm_head, W{}, d.V, d.E);
  o.softcap(kLogits, kLogitsRaw);  // Gemma 2's final_logit_softcapping
}

// The head and the loss: logits, then the NLL of the targets into kNll.
template <class O, class W>
void head_loss(O& o, const Dims& d, const HeadT<W>& w) {
  head_logits(o, d, w);
  o.cross_entropy(kNll, kLogits);
}

}  // namespace zof::graph
