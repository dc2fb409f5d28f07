// llama.cpp's LLaMA conventions in GGUF, both ways: the config.json and tokenizer files Hugging
// Face would have for a GGUF file (as scripts/gguf_to_hf.py converts it), the tensor names, the
// q/k row order llama.cpp's converter uses; and the metadata of a GGUF that llama.cpp loads,
// from a GGUF's own or from a Hugging Face config and tokenizer.json.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "hf/gguf.h"
#include "zof/config.h"

namespace zof::gguf {

// config.json for the file (general.architecture llama; llama.* keys; tied embeddings when
// output.weight is absent), for ModelConfig::from_json. Another architecture, RoPE scaling,
// experts or partial rotary are refused by name.
nlohmann::json llama_config(const File& f);

// tokenizer.json, tokenizer_config.json and generation_config.json from tokenizer.ggml.*: a
// byte-level BPE ("gpt2") with the pre-tokenizer tokenizer.ggml.pre names and the control tokens
// as special added tokens. Other tokenizer models are refused by name. config: llama_config(f).
struct TokenizerFiles {
  nlohmann::json tokenizer, tokenizer_config, generation_config;
};
TokenizerFiles llama_tokenizer(const File& f, const nlohmann::json& config);

// GGUF's name of a Hugging Face tensor of a llama model ("model.layers.3.self_attn.q_proj.weight"
// -> "blk.3.attn_q.weight"); empty when llama.cpp's llama has none.
std::string llama_tensor_name(const std::string& hf);
// Heads whose rows llama.cpp's converter interleaves in tensor `hf` (q_proj: the attention heads,
// k_proj: the KV heads; LlamaModel.permute), 0 for the others.
int64_t llama_permuted_heads(const std::string& hf, const ModelConfig& c);
// Row r of a q/k tensor of `rows` rows over `heads` heads: where llama.cpp keeps it (each head's
// halves (2, d/2) stored as (d/2, 2)), and the inverse.
int64_t gguf_row_of(int64_t hf_row, int64_t rows, int64_t heads);
int64_t hf_row_of(int64_t gguf_row, int64_t rows, int64_t heads);

// zof::Error unless llama.cpp's llama architecture computes what this config does (a plain
// LLaMA: no biases, no RoPE scaling, no sliding window, no Gemma/Qwen3/Phi-3 fields); `flag`
// names what asked ("--save-format gguf").
void check_llama_writable(const ModelConfig& c, const std::string& flag);

// general.file_type of a file whose matrices are F32 (0), F16 (1) or BF16 (32).
uint32_t file_type_of(TensorType matrices);

// The metadata of a GGUF written from a model read from GGUF file `src`: src's, with
// general.file_type set and the quantize.* keys (about src's quantization) dropped.
Metadata metadata_from_gguf(const File& src, uint32_t file_type);
// ... from a Hugging Face model directory: llama.* from the config, tokenizer.ggml.* from dir's
// tokenizer.json (a byte-level BPE with GPT-2's or SmolLM's pre-tokenizer) and
// tokenizer_config.json; zof::Error naming the file and field llama.cpp could not be told.
Metadata metadata_from_hf(const ModelConfig& c, const std::string& dir, uint32_t file_type,
                          const std::string& flag);

}  // namespace zof::gguf
