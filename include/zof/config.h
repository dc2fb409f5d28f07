// config.json of the supported Hugging Face causal-LM families, as transformers defines them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zof/activation.h"
#include "zof/dtype.h"

namespace zof {

// Llama also covers Mistral, Qwen2, Qwen3, Phi-3 and Gemma 2/3 (their differences are the
// fields below).
enum class Arch { Llama, OPT, GPT2 };
struct ModelConfig {
  Arch arch = Arch::Llama;
  // "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "opt", "gpt2"
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // GPT-2: n_inner or 4*n_embd; OPT: ffn_dim
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // == num_heads except with grouped-query attention
  int64_t head_dim = 0;
  int64_t max_position = 0;  // context length
  float norm_eps = 1e-5f;
  float rope_theta = 10000.f;  // Llama family only
  // RoPE (Llama family): the dims rotated in each head (head_dim, or int(head_dim *
  // partial_rotary_factor) for Phi-3; the rest pass through) and their rotary_dim/2 fp32 inverse frequencies, theta^(-2i/rotary_dim) with the
  // config's RoPE scaling (linear, llama3) applied, computed once here; the rope op reads it.
  int64_t rotary_dim = 0;
  std::vector<float> rope_inv_freq;
  bool qk_norm = false;  // Qwen3: RMSNorm over head_dim of each head's q and k, before RoPE
  // Phi-3: q, k and v are the rows of one tensor self_attn.qkv_proj.weight, gate and up those
  // of mlp.gate_up_proj.weight; the layer's q/k/v and gate/up views point into them.
  bool fused_proj = false;
  // Gemma 2 / Gemma 3 (text). Each is the identity at its default, so the other families' math
  // is unchanged.
  float norm_offset = 0.f;      // RMSNorm scales by (w + norm_offset): Gemma stores w - 1 (1)
  float embed_scale = 0.f;      // the token rows times this (sqrt(hidden), in the config's
                                // dtype as transformers forms it); 0: not scaled
  bool sandwich_norm = false;   // post_attention_ and post_feedforward_layernorm on the branch
                                // outputs; ln2 is then pre_feedforward_layernorm
  float attn_scale = 0.f;       // scores times this (query_pre_attn_scalar^-1/2); 0: head_dim^-1/2
  float attn_softcap = 0.f;     // scores s -> c tanh(s / c) (attn_logit_softcapping); 0: none
  float final_softcap = 0.f;    // logits likewise (final_logit_softcapping); 0: none
  int64_t sliding_window = 0;   // the window of the layers marked sliding (layer_types)
  std::vector<uint8_t> layer_sliding;  // per layer: 1 = sliding-window attention; empty: none
  // The sliding layers' own RoPE table (Gemma 3's rope_local_base_freq); empty: rope_inv_freq.
  std::vector<float> rope_local_inv_freq;
  Activation act = Activation::SiLU;
  bool qkv_bias = false;   // Qwen2: true; Llama: attention_bias; OPT/GPT-2: true
  bool o_bias = false;     // Llama: attention_bias; OPT/GPT-2: true
  bool mlp_bias = false;   // Llama: mlp_bias; OPT/GPT-2: true
  bool tie_embeddings = true;
  // OPT
  int64_t word_embed_proj_dim = 0;    // != hidden_size means project_in/project_out exist (350m)
  bool do_layer_norm_before = true;   // false only for OPT-350m (post-LayerNorm)
  // Token ids from config.json; -1 when absent.
  int32_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;
  DType torch_dtype = DType::F32;  // as stored; informational
  nlohmann::json raw;  // the file as read, written back unchanged (but torch_dtype) on save

  // Reads and validates; zof::Error names the file, the field and the fix.
  static ModelConfig load(const std::string& path);
  static ModelConfig from_json(const nlohmann::json& j, const std::string& source);

  int64_t num_params() const;  // parameters the architecture defines (tied counted once)
};

// RoPE's default table: theta^(-2i/dim) for i < dim/2, in double from the fp32 theta, rounded to
// fp32 (the bits zof's kernels have always used; transformers forms it in fp32, within an ulp).
std::vector<float> rope_default_inv_freq(float theta, int64_t dim);

}  // namespace zof
