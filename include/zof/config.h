// config.json of the supported Hugging Face causal-LM families, as transformers defines them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zof/dtype.h"

namespace zof {

enum class Arch { Llama, OPT, GPT2 };  // Llama also covers Mistral, Qwen2, Qwen3 and Phi-3
enum class Activation { SiLU, ReLU, GeluTanh, GeluErf };

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string model_type;    // "llama", "mistral", "qwen2", "qwen3", "phi3", "opt", "gpt2"
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
