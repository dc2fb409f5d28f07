// A Hugging Face causal LM held in fp32: its parameters, grouped into blocks (embedding,
// transformer layers, head), which are the unit of loading, streaming and perturbation.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "zof/config.h"
#include "zof/dtype.h"

namespace zof {

struct Param {
  std::string name;             // Hugging Face tensor name
  std::vector<int64_t> shape;   // as zof holds it: Linear weights (out, in)
  bool transposed = false;      // file holds the transpose (GPT-2 Conv1D (in, out))
  bool decay = true;            // weight decay applies (false for norms and biases)
  float* data = nullptr;        // into Model's storage
  int64_t numel = 0;
};

// The unit of everything: a contiguous range of parameters that travel and are perturbed
// together. Block 0 is the embedding, then one per transformer layer, then the head
// (final norm, projections, untied LM head).
struct Block {
  std::string name;        // "embed", "layers.3", "head"
  std::vector<int> params; // indices into Model::params
  int64_t numel = 0;       // parameters
  int64_t offset = 0;      // of its first parameter in Model::storage()
  int64_t span = 0;        // floats from offset to the end of its last parameter (with padding)
};

// Parameters of one transformer layer, as pointers (into the model or into a perturbed copy).
// Unused slots are null. Llama: ln1=input_layernorm, ln2=post_attention_layernorm,
// fc1=gate_proj, up=up_proj, fc2=down_proj. OPT: ln1=self_attn_layer_norm, ln2=final_layer_norm.
// GPT-2: qkv_w is the fused c_attn (3C, C), transposed on load.
struct LayerWeights {
  const float *ln1_w = nullptr, *ln1_b = nullptr;
  const float *q_w = nullptr, *q_b = nullptr, *k_w = nullptr, *k_b = nullptr;
  const float *v_w = nullptr, *v_b = nullptr, *qkv_w = nullptr, *qkv_b = nullptr;
  const float *o_w = nullptr, *o_b = nullptr;
  const float *ln2_w = nullptr, *ln2_b = nullptr;
  const float *fc1_w = nullptr, *fc1_b = nullptr, *up_w = nullptr, *up_b = nullptr;
  const float *fc2_w = nullptr, *fc2_b = nullptr;
};
struct EmbedWeights {
  const float* tokens = nullptr;      // (V, E), E = word_embed_proj_dim (OPT) or hidden
  const float* positions = nullptr;   // (P, C) learned positions (OPT: P = max_pos + 2)
  const float* project_in = nullptr;  // OPT (C, E)
};
struct HeadWeights {
  const float *norm_w = nullptr, *norm_b = nullptr;  // final norm (absent for OPT-350m)
  const float* project_out = nullptr;                // OPT (E, C)
  const float* lm_head = nullptr;                    // (V, E); == tokens when tied
};

class Model {
 public:
  // Loads DIR/config.json and DIR's safetensors; validates every tensor the architecture needs.
  static Model load(const std::string& dir);
  // A model of this config with random weights (normal, std 0.02; norms 1, biases 0): for
  // benchmarks and tests.
  static Model random(const ModelConfig& cfg, uint64_t seed);

  Model() = default;
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Writes out_dir/config.json and out_dir/model.safetensors in dtype (default: as loaded),
  // atomically, in Hugging Face layout (tied LM head omitted, GPT-2 Conv1D transposed back).
  void save(const std::string& out_dir, DType dtype) const;

  const ModelConfig& config() const { return cfg_; }
  DType stored_dtype() const { return stored_dtype_; }
  const std::string& source() const { return source_; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  int64_t num_params() const;  // parameters (not counting alignment padding)
  int64_t storage_size() const { return (int64_t)storage_.size(); }
  float* storage() { return storage_.data(); }
  const float* storage() const { return storage_.data(); }

  // Views into this model's weights.
  EmbedWeights embed() const;
  LayerWeights layer(int i) const;
  HeadWeights head() const;
  // The same views into a copy of one block (e.g. a perturbed copy): base holds the block's
  // span floats laid out as in storage(). Layer i is block i + 1; the embedding is block 0 and
  // the head the last block. With tied embeddings the head's lm_head is tied_tokens.
  EmbedWeights embed(const float* base) const;
  LayerWeights layer(int i, const float* base) const;
  HeadWeights head(const float* base, const float* tied_tokens) const;
  // The same views with every parameter wherever `at(param index)` says: for copies that do not
  // mirror the block's layout (the ZO walk keeps only the rows of the token table a batch uses).
  using ParamLocator = std::function<const float*(int)>;
  EmbedWeights embed(const ParamLocator& at) const;
  LayerWeights layer(int i, const ParamLocator& at) const;
  HeadWeights head(const ParamLocator& at) const;  // tied: lm_head = at(the token table)
  // Index of the token table, and of the LM head's matrix (the same when tied).
  int token_table() const;
  int lm_head() const;

 private:
  void build_layout();  // params_, blocks_ and storage_ from cfg_
  int index(const std::string& name) const;  // -1 when absent
  // at(index of the named parameter); null when the architecture has no such parameter.
  const float* ptr(const std::string& name, const ParamLocator& at) const;
  // A locator into base, a copy of block `block` laid out as in storage().
  ParamLocator in_copy(const float* base, int block) const;

  ModelConfig cfg_;
  DType stored_dtype_ = DType::F32;
  std::string source_;
  std::vector<Param> params_;
  std::vector<Block> blocks_;
  std::vector<float> storage_;  // all parameters, contiguous, block by block
  std::unordered_map<std::string, int> by_name_;
};

}  // namespace zof
