// config.json parsing for each supported family (real configs from the Hugging Face Hub), the
// parameter counts transformers reports, and every error case.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "common.h"
#include "zof/config.h"
#include "zof/error.h"

namespace {

using json = nlohmann::json;
using zof::Activation;
using zof::Arch;
using zof::ModelConfig;

// Expected parameter counts: transformers 5.2 AutoModelForCausalLM.from_config(cfg) on the meta
// device, then model.num_parameters() (tied weights counted once), for these exact configs.

const char* kGpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";

const char* kOpt125m = R"({
  "_name_or_path": "facebook/opt-125m", "activation_dropout": 0.0, "activation_function": "relu",
  "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2,
  "do_layer_norm_before": true, "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768,
  "init_std": 0.02, "layerdrop": 0.0, "max_position_embeddings": 2048, "model_type": "opt",
  "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1, "prefix": "</s>",
  "torch_dtype": "float16", "transformers_version": "4.21.0.dev0", "use_cache": true,
  "vocab_size": 50272, "word_embed_proj_dim": 768})";

const char* kOpt350m = R"({
  "_name_or_path": "facebook/opt-350m", "activation_dropout": 0.0, "activation_function": "relu",
  "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2,
  "do_layer_norm_before": false, "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 4096, "hidden_size": 1024,
  "init_std": 0.02, "layerdrop": 0.0, "max_position_embeddings": 2048, "model_type": "opt",
  "num_attention_heads": 16, "num_hidden_layers": 24, "pad_token_id": 1, "prefix": "</s>",
  "torch_dtype": "float16", "transformers_version": "4.20.0.dev0", "use_cache": true,
  "vocab_size": 50272, "word_embed_proj_dim": 512})";

const char* kQwen2_05b = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 131072, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

// Mistral-7B-v0.3 (sliding_window null; v0.1 had 4096, see the error tests).
const char* kMistral7b = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0", "use_cache": true, "vocab_size": 32768})";

const char* kLlama2_7b = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

// TinyLlama-1.1B: grouped-query attention, 32 query heads sharing 4 key/value heads.
const char* kTinyLlama = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
  "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 22, "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0", "use_cache": true, "vocab_size": 32000})";

ModelConfig parse(const char* text) { return ModelConfig::from_json(json::parse(text), "test/config.json"); }
ModelConfig parse(const json& j) { return ModelConfig::from_json(j, "test/config.json"); }

// Parses j and expects zof::Error whose message names the file and contains every word in words.
void expect_error(const json& j, std::initializer_list<std::string> words) {
  try {
    ModelConfig::from_json(j, "test/config.json");
    ADD_FAILURE() << "no error for " << j.dump();
  } catch (const zof::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test/config.json"), std::string::npos) << msg;
    for (const auto& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}
json with(const char* base, const json& patch) {
  json j = json::parse(base);
  j.merge_patch(patch);  // a null in patch removes the field
  return j;
}

TEST(Config, Gpt2) {
  ModelConfig c = parse(kGpt2);
  EXPECT_EQ(c.arch, Arch::GPT2);
  EXPECT_EQ(c.model_type, "gpt2");
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.intermediate_size, 3072);  // n_inner absent: 4 * n_embd
  EXPECT_EQ(c.num_layers, 12);
  EXPECT_EQ(c.num_heads, 12);
  EXPECT_EQ(c.num_kv_heads, 12);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position, 1024);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.act, Activation::GeluTanh);
  EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.bos_token_id, 50256);
  EXPECT_EQ(c.eos_token_id, 50256);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.torch_dtype, zof::DType::F32);
  EXPECT_EQ(c.raw["n_ctx"], 1024);
  EXPECT_EQ(c.num_params(), 124439808);
}

TEST(Config, Gpt2Variants) {
  EXPECT_EQ(parse(with(kGpt2, {{"activation_function", "gelu"}})).act, Activation::GeluErf);
  EXPECT_EQ(parse(with(kGpt2, {{"activation_function", "relu"}})).act, Activation::ReLU);
  EXPECT_EQ(parse(with(kGpt2, {{"activation_function", "gelu_pytorch_tanh"}})).act, Activation::GeluTanh);
  EXPECT_EQ(parse(with(kGpt2, {{"reorder_and_upcast_attn", true}})).arch, Arch::GPT2);
  EXPECT_EQ(parse(with(kGpt2, {{"n_inner", 1000}})).intermediate_size, 1000);
  // Small untied GPT-2 with n_inner: 110,700 parameters in transformers.
  ModelConfig c = parse(json{{"model_type", "gpt2"}, {"n_embd", 64}, {"n_head", 4}, {"n_layer", 3},
                             {"n_positions", 128}, {"n_inner", 100}, {"vocab_size", 100},
                             {"tie_word_embeddings", false}});
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.num_params(), 110700);
}

TEST(Config, Opt125m) {
  ModelConfig c = parse(kOpt125m);
  EXPECT_EQ(c.arch, Arch::OPT);
  EXPECT_EQ(c.vocab_size, 50272);
  EXPECT_EQ(c.hidden_size, 768);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_EQ(c.num_layers, 12);
  EXPECT_EQ(c.num_heads, 12);
  EXPECT_EQ(c.num_kv_heads, 12);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position, 2048);
  EXPECT_EQ(c.word_embed_proj_dim, 768);
  EXPECT_TRUE(c.do_layer_norm_before);
  EXPECT_EQ(c.act, Activation::ReLU);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.pad_token_id, 1);
  EXPECT_EQ(c.torch_dtype, zof::DType::F16);
  EXPECT_EQ(c.num_params(), 125239296);
}

TEST(Config, Opt350m) {
  ModelConfig c = parse(kOpt350m);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 4096);
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.word_embed_proj_dim, 512);  // project_in / project_out exist
  EXPECT_FALSE(c.do_layer_norm_before);   // post-LayerNorm, and no final LayerNorm
  EXPECT_EQ(c.num_params(), 331196416);
}

TEST(Config, OptVariants) {
  EXPECT_EQ(parse(with(kOpt125m, {{"activation_function", "gelu"}})).act, Activation::GeluErf);
  EXPECT_EQ(parse(with(kOpt125m, {{"word_embed_proj_dim", nullptr}})).word_embed_proj_dim, 768);
  // Small OPT without biases, untied: 120,064 parameters in transformers.
  ModelConfig c = parse(json{{"model_type", "opt"}, {"ffn_dim", 256}, {"hidden_size", 64},
                             {"max_position_embeddings", 128}, {"num_attention_heads", 4},
                             {"num_hidden_layers", 2}, {"vocab_size", 100}, {"enable_bias", false},
                             {"tie_word_embeddings", false}});
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  EXPECT_TRUE(c.do_layer_norm_before);
  EXPECT_EQ(c.num_params(), 120064);
}

TEST(Config, Qwen2) {
  ModelConfig c = parse(kQwen2_05b);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.intermediate_size, 4864);
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.num_heads, 14);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position, 131072);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.act, Activation::SiLU);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.torch_dtype, zof::DType::BF16);
  EXPECT_EQ(c.num_params(), 494032768);
  // Sliding windows that never apply are dropped.
  for (const ModelConfig& n : {parse(with(kQwen2_05b, {{"use_sliding_window", true}, {"sliding_window", 4096},
                                                        {"max_window_layers", 24}})),
                               parse(with(kQwen2_05b, {{"use_sliding_window", true}, {"sliding_window", 131072}}))}) {
    for (uint8_t s : n.layer_sliding) EXPECT_EQ(s, 0);
  }
}

TEST(Config, Mistral) {
  ModelConfig c = parse(kMistral7b);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.max_position, 32768);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.num_params(), 7248023552);
  // A window as long as the context never applies.
  EXPECT_TRUE(parse(with(kMistral7b, {{"sliding_window", 32768}})).layer_sliding.empty());
}

TEST(Config, Llama2) {
  ModelConfig c = parse(kLlama2_7b);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.max_position, 4096);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.f);  // absent: transformers' default
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  EXPECT_FALSE(c.tie_embeddings);
  EXPECT_EQ(c.torch_dtype, zof::DType::F16);
  EXPECT_EQ(c.num_params(), 6738415616);
  // num_key_value_heads absent: as many as the query heads.
  EXPECT_EQ(parse(with(kLlama2_7b, {{"num_key_value_heads", nullptr}})).num_kv_heads, 32);
}

TEST(Config, LlamaGroupedQuery) {
  ModelConfig c = parse(kTinyLlama);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_params(), 1100048384);
}

TEST(Config, LlamaBiasesAndHeadDim) {
  // head_dim given (not hidden/heads), attention and MLP biases: 121,456 parameters in transformers.
  ModelConfig c = parse(json{{"model_type", "llama"}, {"hidden_size", 64}, {"intermediate_size", 172},
                             {"num_attention_heads", 8}, {"num_hidden_layers", 2}, {"num_key_value_heads", 2},
                             {"head_dim", 16}, {"attention_bias", true}, {"mlp_bias", true},
                             {"tie_word_embeddings", false}, {"vocab_size", 100}});
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);  // transformers' default
  EXPECT_EQ(c.max_position, 2048);     // transformers' default for llama
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.num_params(), 121456);
}

TEST(Config, TokenIdsAndDtype) {
  // Llama 3 style: eos_token_id is a list; zof takes the first.
  ModelConfig c = parse(with(kLlama2_7b, {{"eos_token_id", {128001, 128008, 128009}}, {"pad_token_id", -1}}));
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.pad_token_id, -1);
  // transformers 5 writes "dtype" instead of "torch_dtype".
  EXPECT_EQ(parse(with(kLlama2_7b, {{"torch_dtype", nullptr}, {"dtype", "bfloat16"}})).torch_dtype, zof::DType::BF16);
  EXPECT_EQ(parse(with(kLlama2_7b, {{"torch_dtype", nullptr}})).torch_dtype, zof::DType::F32);
  // transformers 5 rope_parameters with plain RoPE.
  ModelConfig r = parse(with(kLlama2_7b, {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}}));
  EXPECT_FLOAT_EQ(r.rope_theta, 500000.f);
  EXPECT_NO_THROW(parse(with(kLlama2_7b, {{"rope_scaling", {{"type", "default"}}}})));
}

TEST(Config, Stories260K) {
  const std::string path = zof::test::assets_dir() + "/models/stories260K/config.json";
  ZOF_REQUIRE_PATH(path);
  ModelConfig c = ModelConfig::load(path);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.max_position, 512);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.f);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.torch_dtype, zof::DType::F32);
  EXPECT_EQ(c.num_params(), 260032);  // the asset README; transformers agrees
}

TEST(Config, LoadErrors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("zof_config_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string missing = (dir / "nope.json").string();
  try {
    ModelConfig::load(missing);
    ADD_FAILURE();
  } catch (const zof::Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string bad = (dir / "config.json").string();
  std::ofstream(bad) << "{\"model_type\": \"llama\", ";
  try {
    ModelConfig::load(bad);
    ADD_FAILURE();
  } catch (const zof::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("malformed"), std::string::npos) << msg;
  }
  std::ofstream(bad) << "[1, 2]";
  EXPECT_THROW(ModelConfig::load(bad), zof::Error);
  fs::remove_all(dir);
}

TEST(Config, UnknownModelType) {
  expect_error(with(kLlama2_7b, {{"model_type", "bert"}}),
               {"model_type", "bert", "llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, opt, gpt2"});
  // The multimodal Gemma 3 checkpoint is named, with the text-only model_type to use instead.
  expect_error(with(kLlama2_7b, {{"model_type", "gemma3"}}), {"model_type", "multimodal", "gemma3_text"});
  expect_error(with(kLlama2_7b, {{"model_type", nullptr}}), {"model_type", "missing"});
  expect_error(with(kLlama2_7b, {{"model_type", 3}}), {"model_type", "string"});
}

TEST(Config, MissingRequiredFields) {
  for (const char* f : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"})
    expect_error(with(kLlama2_7b, {{f, nullptr}}), {f, "missing"});
  for (const char* f : {"vocab_size", "hidden_size", "ffn_dim", "num_hidden_layers", "num_attention_heads",
                        "max_position_embeddings"})
    expect_error(with(kOpt125m, {{f, nullptr}}), {f, "missing"});
  for (const char* f : {"vocab_size", "n_embd", "n_layer", "n_head", "n_positions"})
    expect_error(with(kGpt2, {{f, nullptr}}), {f, "missing"});
}

TEST(Config, WrongTypesAndValues) {
  expect_error(with(kLlama2_7b, {{"hidden_size", "4096"}}), {"hidden_size", "integer"});
  expect_error(with(kLlama2_7b, {{"hidden_size", 4096.5}}), {"hidden_size", "integer"});
  expect_error(with(kLlama2_7b, {{"num_hidden_layers", true}}), {"num_hidden_layers", "integer"});
  expect_error(with(kLlama2_7b, {{"hidden_size", 0}}), {"hidden_size", "positive"});
  expect_error(with(kLlama2_7b, {{"vocab_size", -5}}), {"vocab_size", "positive"});
  expect_error(with(kLlama2_7b, {{"num_key_value_heads", 0}}), {"num_key_value_heads", "positive"});
  expect_error(with(kGpt2, {{"n_inner", -1}}), {"n_inner", "positive"});
  expect_error(with(kLlama2_7b, {{"rms_norm_eps", "1e-5"}}), {"rms_norm_eps", "number"});
  expect_error(with(kLlama2_7b, {{"rms_norm_eps", 0}}), {"rms_norm_eps", "positive"});
  expect_error(with(kLlama2_7b, {{"tie_word_embeddings", 1}}), {"tie_word_embeddings", "true or false"});
  expect_error(with(kLlama2_7b, {{"eos_token_id", "2"}}), {"eos_token_id", "integer"});
  expect_error(with(kLlama2_7b, {{"torch_dtype", "int8"}}), {"torch_dtype", "int8", "bfloat16"});
  expect_error(with(kLlama2_7b, {{"torch_dtype", 16}}), {"torch_dtype", "string"});
  expect_error(with(kLlama2_7b, {{"hidden_act", 1}}), {"hidden_act", "string"});
  EXPECT_THROW(ModelConfig::from_json(json::array(), "test/config.json"), zof::Error);
}

// Sizes far beyond any model are refused naming the field, before anything is allocated from
// them (a config of 10^9 layers or a 10^12 hidden size used to grow memory without end).
TEST(Config, SizesBeyondTheLimits) {
  expect_error(with(kLlama2_7b, {{"num_hidden_layers", 1000000000}}), {"num_hidden_layers", "1000000000", "at most 16384"});
  expect_error(with(kLlama2_7b, {{"hidden_size", 1000000000000}}), {"hidden_size", "at most"});
  expect_error(with(kLlama2_7b, {{"intermediate_size", 1000000000000}}), {"intermediate_size", "at most"});
  expect_error(with(kLlama2_7b, {{"vocab_size", 1000000000000}}), {"vocab_size", "at most"});
  expect_error(with(kGpt2, {{"n_layer", 100000}}), {"n_layer", "at most"});
  expect_error(with(kOpt125m, {{"ffn_dim", 1 << 30}}), {"ffn_dim", "at most"});
  expect_error(with(kLlama2_7b, {{"head_dim", 60000}, {"num_attention_heads", 128}, {"num_key_value_heads", 128}}),
               {"head_dim", "num_attention_heads", "at most"});
  // The largest released models stay well inside.
  EXPECT_NO_THROW(parse(with(kLlama2_7b, {{"num_hidden_layers", 126}, {"hidden_size", 16384},
                                          {"intermediate_size", 53248}, {"vocab_size", 262144}})));
}

TEST(Config, Divisibility) {
  expect_error(with(kLlama2_7b, {{"num_attention_heads", 30}, {"num_key_value_heads", 30}}), {"hidden_size", "num_attention_heads", "divisible"});
  // With head_dim given, hidden_size need not divide.
  EXPECT_NO_THROW(parse(with(kLlama2_7b, {{"num_attention_heads", 30}, {"num_key_value_heads", 30}, {"head_dim", 128}})));
  expect_error(with(kLlama2_7b, {{"num_key_value_heads", 5}}), {"num_key_value_heads", "num_attention_heads"});
  expect_error(with(kOpt125m, {{"num_attention_heads", 7}}), {"hidden_size", "num_attention_heads"});
  expect_error(with(kGpt2, {{"n_head", 7}}), {"n_embd", "n_head"});
}

TEST(Config, UnsupportedLlamaOptions) {
  expect_error(with(kLlama2_7b, {{"hidden_act", "gelu"}}), {"hidden_act", "gelu", "silu"});
  expect_error(with(kLlama2_7b, {{"rope_scaling", "yes"}}), {"rope_scaling"});
  // Every rope_type but default, linear and llama3 is refused by name, in either spelling.
  for (const char* t : {"yarn", "dynamic", "longrope", "su", "mrope", "ntk"})
    for (const char* key : {"rope_scaling", "rope_parameters"})
      expect_error(with(kLlama2_7b, {{key, {{"rope_type", t}, {"factor", 4.0}}}}),
                   {key, std::string("\"") + t + "\"", "not support", "default, linear and llama3"});
  expect_error(with(kLlama2_7b, {{"rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}}}),
               {"rope_scaling", "dynamic"});
  expect_error(with(kLlama2_7b, {{"rope_parameters", {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}}}),
               {"rope_parameters", "partial_rotary_factor"});
}

// Llama-3.1-8B's config.json as on the Hub (transformers 4: rope_scaling, top-level rope_theta).
const char* kLlama31_8b = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

// transformers' _compute_llama3_parameters in double: the frequencies above the original
// context's high-frequency wavelength kept, those below its low-frequency one divided by factor,
// the band between interpolated.
std::vector<double> llama3_reference(double theta, int64_t D, double factor, double lo, double hi,
                                     double old_ctx) {
  std::vector<double> out;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double f = std::pow(theta, -double(2 * i) / double(D)), wl = 2 * M_PI / f;
    if (wl < old_ctx / hi) out.push_back(f);
    else if (wl > old_ctx / lo) out.push_back(f / factor);
    else {
      const double s = (old_ctx / wl - lo) / (hi - lo);
      out.push_back((1 - s) * f / factor + s * f);
    }
  }
  return out;
}

TEST(Config, Llama3RopeScaling) {
  ModelConfig c = parse(kLlama31_8b);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 128);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.f);
  EXPECT_EQ(c.num_params(), 8030261248);  // Llama-3.1-8B's published count
  ASSERT_EQ(c.rope_inv_freq.size(), 64u);
  const std::vector<float> plain = zof::rope_default_inv_freq(500000.f, 128);
  const std::vector<double> want = llama3_reference(500000.f, 128, 8, 1, 4, 8192);
  int kept = 0, divided = 0, between = 0;
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_NEAR(c.rope_inv_freq[i], want[i], 2e-7 * want[i]) << i;
    if (c.rope_inv_freq[i] == plain[i]) ++kept;
    else if (c.rope_inv_freq[i] == plain[i] / 8) ++divided;
    else ++between;
  }
  // All three bands are present for Llama 3.1's numbers.
  EXPECT_GT(kept, 10);
  EXPECT_GT(divided, 10);
  EXPECT_GT(between, 2);
  // transformers 5 writes rope_parameters with rope_theta inside: the same table.
  json t5 = with(kLlama31_8b, {{"rope_scaling", nullptr}, {"rope_theta", nullptr}});
  t5["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                           {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(parse(t5).rope_inv_freq, c.rope_inv_freq);
  // The older "type" key.
  json old = json::parse(kLlama31_8b);
  old["rope_scaling"].erase("rope_type");
  old["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(parse(old).rope_inv_freq, c.rope_inv_freq);
  // Plain RoPE keeps the default table's bits.
  EXPECT_EQ(parse(kLlama2_7b).rope_inv_freq, zof::rope_default_inv_freq(10000.f, 128));
}

TEST(Config, LinearRopeScaling) {
  ModelConfig c = parse(with(kLlama2_7b, {{"rope_scaling", {{"type", "linear"}, {"factor", 4.0}}}}));
  const std::vector<float> plain = zof::rope_default_inv_freq(10000.f, 128);
  ASSERT_EQ(c.rope_inv_freq.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(c.rope_inv_freq[i], plain[i] / 4.f);
  ModelConfig t5 = parse(with(kLlama2_7b, {{"rope_parameters", {{"rope_type", "linear"}, {"factor", 4.0},
                                                                {"rope_theta", 10000.0}}}}));
  EXPECT_EQ(t5.rope_inv_freq, c.rope_inv_freq);
}

TEST(Config, RopeScalingErrors) {
  auto l3 = [](const json& patch) {
    json j = json::parse(kLlama31_8b);
    j["rope_scaling"].merge_patch(patch);
    return j;
  };
  expect_error(l3({{"factor", nullptr}}), {"rope_scaling", "factor", "llama3"});
  expect_error(l3({{"factor", -2.0}}), {"rope_scaling", "factor", "positive"});
  expect_error(l3({{"factor", "8"}}), {"rope_scaling", "factor", "positive number"});
  expect_error(l3({{"low_freq_factor", nullptr}}), {"rope_scaling", "low_freq_factor"});
  expect_error(l3({{"high_freq_factor", 0.5}}), {"rope_scaling", "high_freq_factor", "low_freq_factor"});
  expect_error(l3({{"original_max_position_embeddings", nullptr}}),
               {"rope_scaling", "original_max_position_embeddings", "missing"});
  expect_error(l3({{"original_max_position_embeddings", 8192.5}}),
               {"rope_scaling", "original_max_position_embeddings", "positive integer"});
  expect_error(l3({{"beta_fast", 32}}), {"rope_scaling", "beta_fast", "llama3"});
  expect_error(with(kLlama2_7b, {{"rope_scaling", {{"type", "linear"}}}}), {"rope_scaling", "factor"});
  expect_error(with(kLlama2_7b, {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}}}}),
               {"rope_scaling", "low_freq_factor", "linear"});
  // The two spellings disagreeing.
  expect_error(with(kLlama31_8b, {{"rope_parameters", {{"rope_type", "linear"}, {"factor", 2.0}}}}),
               {"rope_parameters", "linear", "rope_scaling", "llama3", "agree"});
}

// Qwen3-0.6B's config.json as on the Hub: head_dim 128 != 1024 / 16, q_norm and k_norm.
const char* kQwen3_06b = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

TEST(Config, Qwen3) {
  ModelConfig c = parse(kQwen3_06b);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 128);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.max_position, 40960);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.num_params(), 596049920);  // 0.44B without the embedding, as Qwen publishes
  // Qwen3Config's head_dim defaults to 128, not hidden_size / heads.
  EXPECT_EQ(parse(with(kQwen3_06b, {{"head_dim", nullptr}, {"hidden_size", 512}})).head_dim, 128);
  EXPECT_TRUE(parse(with(kQwen3_06b, {{"attention_bias", true}})).qkv_bias);
  // Sliding windows as Qwen2's: layers from max_window_layers on.
  const ModelConfig w = parse(with(kQwen3_06b, {{"use_sliding_window", true}, {"sliding_window", 4096},
                                                {"max_window_layers", 1}}));
  EXPECT_EQ(w.sliding_window, 4096);
  ASSERT_EQ(w.layer_sliding.size(), size_t(w.num_layers));
  for (int64_t i = 0; i < w.num_layers; ++i) EXPECT_EQ(w.layer_sliding[i], i >= 1) << i;
  EXPECT_FALSE(parse(kQwen2_05b).qk_norm);
}

// Phi-3-mini-4k-instruct's config.json as on the Hub, but its sliding_window (2047, below the
// 4096 context: refused, as Mistral's) set to null.
const char* kPhi3Mini = R"({
  "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
  "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
  "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.2", "use_cache": true, "vocab_size": 32064})";

// google/gemma-2-2b and google/gemma-3-1b-pt as the Hub has them (transformers 4 spelling).
const char* kGemma2_2b = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
  "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
  "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
  "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": true, "vocab_size": 256000})";

const char* kGemma3_1b = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
  "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912,
  "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
  "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})";

TEST(Config, Gemma2) {
  ModelConfig c = parse(kGemma2_2b);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.act, Activation::GeluTanh);
  EXPECT_TRUE(c.sandwich_norm && c.tie_embeddings);
  EXPECT_FALSE(c.qk_norm || c.qkv_bias || c.fused_proj);
  EXPECT_EQ(c.norm_offset, 1.f);
  EXPECT_EQ(c.embed_scale, 48.f);  // sqrt(2304)
  EXPECT_EQ(c.attn_scale, 1.f / 16);  // query_pre_attn_scalar 256
  EXPECT_EQ(c.attn_softcap, 50.f);
  EXPECT_EQ(c.final_softcap, 30.f);
  EXPECT_EQ(c.sliding_window, 4096);
  ASSERT_EQ(c.layer_sliding.size(), 26u);
  for (int i = 0; i < 26; ++i) EXPECT_EQ(c.layer_sliding[i], i % 2 == 0) << i;  // 0, 2, ... slide
  EXPECT_TRUE(c.rope_local_inv_freq.empty());
  EXPECT_EQ(c.rope_inv_freq, zof::rope_default_inv_freq(10000.f, 256));
  EXPECT_EQ(c.num_params(), 2614341888);  // transformers 5.24 on the meta device
  // Gemma2Config's defaults when the fields are absent; null soft-caps and window switch them off.
  json bare = json::parse(kGemma2_2b);
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "sliding_window",
                        "head_dim", "query_pre_attn_scalar", "max_position_embeddings"})
    bare.erase(k);
  ModelConfig d = parse(bare);
  EXPECT_EQ(d.attn_softcap, 50.f);
  EXPECT_EQ(d.final_softcap, 30.f);
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.head_dim, 256);
  EXPECT_EQ(d.max_position, 8192);
  json nulls = json::parse(kGemma2_2b);  // (with() would remove a field given null)
  for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping"}) nulls[k] = nullptr;
  ModelConfig off = parse(nulls);
  EXPECT_EQ(off.attn_softcap, 0.f);
  EXPECT_EQ(off.final_softcap, 0.f);
  // A null window: transformers cannot build the sliding layers' mask; zof refuses by name.
  nulls["sliding_window"] = nullptr;
  expect_error(nulls, {"sliding_window", "null"});
  // hidden_act is not read (transformers 5 reads hidden_activation only).
  EXPECT_EQ(parse(with(kGemma2_2b, {{"hidden_act", "gelu"}})).act, Activation::GeluTanh);
  // layer_types (transformers 5) overrides the alternation.
  json lt = json::parse(kGemma2_2b);
  lt["num_hidden_layers"] = 3;
  lt["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
  EXPECT_EQ(parse(lt).layer_sliding, (std::vector<uint8_t>{0, 1, 1}));
  // A bf16 checkpoint's normalizer is bf16(sqrt(hidden)), as transformers forms it.
  EXPECT_EQ(parse(with(kGemma2_2b, {{"hidden_size", 3584}, {"torch_dtype", "bfloat16"}})).embed_scale,
            59.75f);
  EXPECT_EQ(parse(with(kGemma2_2b, {{"hidden_size", 3584}})).embed_scale, float(std::sqrt(3584.0)));
  // Refused by name.
  expect_error(with(kGemma2_2b, {{"hidden_activation", "gelu"}}), {"hidden_activation", "gelu_pytorch_tanh"});
  expect_error(with(kGemma2_2b, {{"use_bidirectional_attention", true}}), {"use_bidirectional_attention"});
  expect_error(with(kGemma2_2b, {{"final_logit_softcapping", -1.0}}), {"final_logit_softcapping", "positive"});
  expect_error(with(kGemma2_2b, {{"layer_types", {"full_attention"}}}), {"layer_types", "26"});
  json bad = lt;
  bad["layer_types"][1] = "chunked_attention";
  expect_error(bad, {"layer_types", "chunked_attention"});
  expect_error(with(kGemma2_2b, {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 2.0}}}}),
               {"rope_scaling", "yarn"});
}

TEST(Config, Gemma3Text) {
  ModelConfig c = parse(kGemma3_1b);
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_TRUE(c.qk_norm && c.sandwich_norm && c.tie_embeddings);
  EXPECT_EQ(c.norm_offset, 1.f);
  EXPECT_EQ(c.attn_softcap, 0.f);
  EXPECT_EQ(c.final_softcap, 0.f);
  EXPECT_EQ(c.embed_scale, zof::bf16_to_f32(zof::f32_to_bf16(std::sqrt(1152.f))));  // bf16 checkpoint
  EXPECT_EQ(c.sliding_window, 512);
  ASSERT_EQ(c.layer_sliding.size(), 26u);
  for (int i = 0; i < 26; ++i) EXPECT_EQ(c.layer_sliding[i], (i + 1) % 6 != 0) << i;  // 5, 11, ... full
  EXPECT_EQ(c.rope_inv_freq, zof::rope_default_inv_freq(1e6f, 256));
  EXPECT_EQ(c.rope_local_inv_freq, zof::rope_default_inv_freq(1e4f, 256));
  EXPECT_EQ(c.num_params(), 999885952);  // transformers 5.24 on the meta device
  // Gemma 3 4B+: linear scaling (factor 8) of the full-attention layers only, in transformers 4's
  // spelling and in transformers 5's rope_parameters keyed by layer type: the same tables.
  ModelConfig s4 = parse(with(kGemma3_1b, {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 8.0}}}}));
  ModelConfig s5 = parse(with(kGemma3_1b, {{"rope_scaling", nullptr}, {"rope_theta", nullptr},
                                           {"rope_local_base_freq", nullptr},
                                           {"rope_parameters",
                                            {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0},
                                                                 {"rope_theta", 1000000.0}}},
                                             {"sliding_attention", {{"rope_type", "default"},
                                                                    {"rope_theta", 10000.0}}}}}}));
  EXPECT_EQ(s4.rope_inv_freq, s5.rope_inv_freq);
  EXPECT_EQ(s4.rope_local_inv_freq, s5.rope_local_inv_freq);
  EXPECT_EQ(s4.rope_local_inv_freq, c.rope_local_inv_freq);
  EXPECT_EQ(s4.rope_inv_freq[1], float(double(c.rope_inv_freq[1]) / 8.0));
  expect_error(with(kGemma3_1b, {{"rope_parameters", {{"global", {{"rope_type", "default"}}}}}}),
               {"rope_parameters", "global"});
  // A flat rope_parameters is not Gemma 3's (transformers would ignore it): refused by name.
  expect_error(with(kGemma3_1b, {{"rope_parameters", {{"rope_type", "linear"}, {"factor", 8.0}}}}),
               {"rope_parameters", "keyed by full_attention"});
  // Keyed entries without a theta take the top-level rope_theta / rope_local_base_freq.
  const ModelConfig k = parse(with(kGemma3_1b, {{"rope_theta", 5000}, {"rope_local_base_freq", 100},
                                               {"rope_parameters",
                                                {{"full_attention", {{"rope_type", "default"}}},
                                                 {"sliding_attention", {{"rope_type", "default"}}}}}}));
  EXPECT_EQ(k.rope_inv_freq, zof::rope_default_inv_freq(5000.f, 256));
  EXPECT_EQ(k.rope_local_inv_freq, zof::rope_default_inv_freq(100.f, 256));
  expect_error(with(kGemma3_1b, {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 8.0}}}}),
               {"full-attention", "yarn"});
  expect_error(with(kGemma3_1b, {{"sliding_window_pattern", 0}}), {"sliding_window_pattern", "positive"});
}

TEST(Config, Phi3) {
  ModelConfig c = parse(kPhi3Mini);
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.model_type, "phi3");
  EXPECT_TRUE(c.fused_proj);
  EXPECT_FALSE(c.qk_norm || c.qkv_bias || c.o_bias || c.mlp_bias || c.tie_embeddings);
  EXPECT_EQ(c.head_dim, 96);
  EXPECT_EQ(c.rotary_dim, 96);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.num_params(), 3821079552);  // 3.8B, as Microsoft publishes
  // Phi3Config's defaults: rms_norm_eps 1e-5, 4096 positions, no sliding window.
  ModelConfig d = parse(with(kPhi3Mini, {{"rms_norm_eps", nullptr}, {"max_position_embeddings", nullptr},
                                        {"sliding_window", nullptr}}));
  EXPECT_FLOAT_EQ(d.norm_eps, 1e-5f);
  EXPECT_EQ(d.max_position, 4096);
  json no_window = json::parse(kPhi3Mini);
  no_window.erase("sliding_window");
  EXPECT_EQ(parse(no_window).max_position, 4096);
  // The Hub's sliding_window 2047 applies to every layer; one at the context is no window.
  const ModelConfig sw = parse(with(kPhi3Mini, {{"sliding_window", 2047}}));
  EXPECT_EQ(sw.sliding_window, 2047);
  EXPECT_EQ(sw.layer_sliding, std::vector<uint8_t>(size_t(sw.num_layers), 1));
  EXPECT_TRUE(parse(with(kPhi3Mini, {{"sliding_window", 4096}})).layer_sliding.empty());
  // Partial rotary (Phi-4-mini: 0.75 of head_dim 128), top-level (transformers 4) or in
  // rope_parameters (transformers 5): int(head_dim * factor) dims, their own table.
  ModelConfig p = parse(with(kPhi3Mini, {{"num_attention_heads", 24}, {"num_key_value_heads", 8},
                                         {"partial_rotary_factor", 0.75}}));
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.rotary_dim, 96);
  EXPECT_EQ(p.rope_inv_freq, zof::rope_default_inv_freq(10000.f, 96));
  ModelConfig p5 = parse(with(kPhi3Mini, {{"rope_theta", nullptr}, {"rope_scaling", nullptr},
                                          {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000.0},
                                                               {"partial_rotary_factor", 0.5}}}}));
  EXPECT_EQ(p5.rotary_dim, 48);
  EXPECT_EQ(p5.rope_inv_freq.size(), 24u);
  expect_error(with(kPhi3Mini, {{"partial_rotary_factor", 0}}), {"partial_rotary_factor", "(0, 1]"});
  expect_error(with(kPhi3Mini, {{"partial_rotary_factor", 1.5}}), {"partial_rotary_factor", "(0, 1]"});
  expect_error(with(kPhi3Mini, {{"partial_rotary_factor", 0.01}}), {"partial_rotary_factor", "even"});
  // Phi-3-mini-128k's longrope (or its old name su) is refused by name.
  expect_error(with(kPhi3Mini, {{"rope_scaling", {{"type", "longrope"}, {"short_factor", {1.0}}, {"long_factor", {1.0}}}}}),
               {"rope_scaling", "longrope", "not support"});
  expect_error(with(kPhi3Mini, {{"rope_scaling", {{"type", "su"}}}}), {"rope_scaling", "su", "not support"});
  // Llama keeps refusing partial rotary.
  expect_error(with(kLlama2_7b, {{"rope_scaling", {{"type", "linear"}, {"factor", 2.0}, {"partial_rotary_factor", 0.5}}}}),
               {"rope_scaling", "partial_rotary_factor"});
}

// Qwen2.5 is model_type qwen2: Qwen2.5-0.5B-Instruct's fields load as Qwen2.
TEST(Config, Qwen25IsQwen2) {
  ModelConfig c = parse(with(kQwen2_05b, {{"max_position_embeddings", 32768}, {"sliding_window", 32768},
                                          {"max_window_layers", 21}, {"use_mrope", false},
                                          {"transformers_version", "4.43.1"}}));
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.max_position, 32768);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.num_params(), 494032768);
}

// Which layers slide, as transformers decides (tests/golden's mistral_window and qwen2_window
// check the attention itself).
TEST(Config, SlidingWindow) {
  const auto all = [](const ModelConfig& c, uint8_t v) {
    return c.layer_sliding == std::vector<uint8_t>(size_t(c.num_layers), v);
  };
  // Mistral-7B-v0.1: a 4096-token window under a 32768 context, on every layer.
  const ModelConfig m = parse(with(kMistral7b, {{"sliding_window", 4096}}));
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_TRUE(all(m, 1));
  // transformers' default for Mistral is a 4096 window.
  json j = json::parse(kMistral7b);
  j.erase("sliding_window");
  EXPECT_EQ(parse(j).sliding_window, 4096);
  // Qwen2 with use_sliding_window: the layers from max_window_layers on, or as layer_types says.
  const ModelConfig q = parse(with(kQwen2_05b, {{"use_sliding_window", true}, {"sliding_window", 4096},
                                                {"max_window_layers", 12}}));
  ASSERT_EQ(q.layer_sliding.size(), 24u);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(q.layer_sliding[i], i >= 12) << i;
  json lt = json::parse(kQwen2_05b);
  lt["use_sliding_window"] = true, lt["sliding_window"] = 4096;
  lt["layer_types"] = json::array();
  for (int i = 0; i < 24; ++i) lt["layer_types"].push_back(i % 3 ? "full_attention" : "sliding_attention");
  const ModelConfig t = parse(lt);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(t.layer_sliding[i], i % 3 == 0) << i;
  lt["layer_types"] = json::array({"full_attention", "sliding_attention"});
  expect_error(lt, {"layer_types", "24"});
  // use_sliding_window false: the window is ignored, as in transformers.
  EXPECT_TRUE(parse(with(kQwen2_05b, {{"sliding_window", 4096}})).layer_sliding.empty());
  // max_window_layers is read only when sliding is on, and 0 (every layer slides) is valid.
  EXPECT_TRUE(parse(with(kQwen2_05b, {{"max_window_layers", 0}})).layer_sliding.empty());
  EXPECT_TRUE(all(parse(with(kQwen2_05b, {{"use_sliding_window", true}, {"sliding_window", 4096},
                                         {"max_window_layers", 0}})),
                  1));
  expect_error(with(kQwen2_05b, {{"use_sliding_window", true}, {"sliding_window", 4096},
                                 {"max_window_layers", -1}}),
               {"max_window_layers", "0 or more"});
  // Mistral-7B-v0.3's null window: no layer slides.
  EXPECT_TRUE(parse(kMistral7b).layer_sliding.empty());
  EXPECT_EQ(parse(kMistral7b).sliding_window, 0);
}

TEST(Config, UnsupportedOptOptions) {
  expect_error(with(kOpt125m, {{"activation_function", "silu"}}), {"activation_function", "silu"});
  expect_error(with(kOpt125m, {{"layer_norm_elementwise_affine", false}}), {"layer_norm_elementwise_affine"});
  expect_error(with(kOpt125m, {{"_remove_final_layer_norm", true}}), {"_remove_final_layer_norm"});
  expect_error(with(kOpt125m, {{"enable_bias", "no"}}), {"enable_bias"});
}

TEST(Config, UnsupportedGpt2Options) {
  expect_error(with(kGpt2, {{"scale_attn_by_inverse_layer_idx", true}}), {"scale_attn_by_inverse_layer_idx", "not supported"});
  expect_error(with(kGpt2, {{"add_cross_attention", true}}), {"add_cross_attention", "not supported"});
  expect_error(with(kGpt2, {{"scale_attn_weights", false}}), {"scale_attn_weights"});
  expect_error(with(kGpt2, {{"activation_function", "quick_gelu"}}), {"activation_function", "quick_gelu"});
}

}  // namespace
