// config.json of the supported families, read as transformers reads it: the same field names, the
// same defaults per model_type, and an error for every option that would change the math in a way
// zof does not implement (other RoPE scalings, cross-attention, ...).
#include "zof/config.h"

#include <filesystem>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "hf/config_limits.h"
#include "hf/json_depth.h"
#include "zof/error.h"
#include "zof/input_file.h"

namespace zof {

namespace {

using json = nlohmann::json;

// The largest value zof accepts for a size field: far above any released model, and low enough
// that no product of sizes (a tensor's elements, the parameter count) overflows int64.
int64_t size_limit(const std::string& key) {
  if (key == "num_hidden_layers" || key == "n_layer") return int64_t(1) << 14;
  if (key == "hidden_size" || key == "n_embd" || key == "word_embed_proj_dim") return int64_t(1) << 20;
  if (key == "intermediate_size" || key == "ffn_dim" || key == "n_inner") return int64_t(1) << 22;
  if (key == "vocab_size") return int64_t(1) << 24;
  if (key == "num_attention_heads" || key == "num_key_value_heads" || key == "n_head" || key == "head_dim")
    return int64_t(1) << 16;
  return int64_t(1) << 30;  // max_position_embeddings, n_positions, sliding_window, ...
}

// Reads fields of one config.json, each error naming the file and the field.
struct Fields {
  const json& j;
  const std::string& src;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(src + ": field \"" + key + "\" " + what);
  }
  const json* get(const std::string& key) const {  // null when absent or JSON null
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const std::string& key) const { return get(key) != nullptr; }

  int64_t integer(const std::string& key, const json& v) const {
    if (!v.is_number_integer())
      fail(key, "must be an integer, got " + v.dump() + "; fix config.json");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      fail(key, "is too large (" + v.dump() + "); fix config.json");
    return v.get<int64_t>();
  }
  int64_t required_int(const std::string& key) const {
    const json* v = get(key);
    if (!v) fail(key, "is missing; config.json of this model_type must define it");
    return integer(key, *v);
  }
  int64_t in_range(const std::string& key, int64_t x) const {
    if (x <= 0) fail(key, "must be positive, got " + std::to_string(x) + "; fix config.json");
    if (x > size_limit(key))
      fail(key, "is " + std::to_string(x) + ", more than zof accepts (at most " +
                    std::to_string(size_limit(key)) + "); fix config.json");
    return x;
  }
  int64_t positive(const std::string& key) const { return in_range(key, required_int(key)); }
  int64_t positive_or(const std::string& key, int64_t def) const {
    const json* v = get(key);
    if (!v) return def;
    return in_range(key, integer(key, *v));
  }
  double number_or(const std::string& key, double def) const {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_number()) fail(key, "must be a number, got " + v->dump() + "; fix config.json");
    return v->get<double>();
  }
  double positive_number_or(const std::string& key, double def) const {
    double x = number_or(key, def);
    if (!(x > 0)) fail(key, "must be positive, got " + std::to_string(x) + "; fix config.json");
    return x;
  }
  bool boolean_or(const std::string& key, bool def) const {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_boolean()) fail(key, "must be true or false, got " + v->dump() + "; fix config.json");
    return v->get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& def) const {
    const json* v = get(key);
    if (!v) return def;
    if (!v->is_string()) fail(key, "must be a string, got " + v->dump() + "; fix config.json");
    return v->get<std::string>();
  }
  // A token id: an integer, null, or (eos_token_id in newer models) a list whose first entry zof
  // uses. Negative ids (some old conversions write -1) mean none.
  int32_t token_id(const std::string& key) const {
    const json* v = get(key);
    if (!v) return -1;
    const json* x = v;
    if (v->is_array()) {
      if (v->empty()) return -1;
      x = &(*v)[0];
    }
    if (!x->is_number_integer()) fail(key, "must be an integer or a list of integers, got " + v->dump());
    int64_t id = x->get<int64_t>();
    if (x->is_number_unsigned() && x->get<uint64_t>() > uint64_t(std::numeric_limits<int32_t>::max()))
      fail(key, "is out of range (" + v->dump() + "); fix config.json");
    if (id > std::numeric_limits<int32_t>::max()) fail(key, "is out of range (" + v->dump() + ")");
    return id < 0 ? -1 : int32_t(id);
  }
  void reject_if_true(const std::string& key, bool def, const std::string& why) const {
    if (boolean_or(key, def)) fail(key, "= true is not supported: " + why);
  }
};

// hidden_size / heads, the default head_dim, which transformers computes with floor division;
// zof requires it exact since a remainder means a config no checkpoint was trained with.
int64_t divide(const Fields& f, int64_t hidden, const std::string& hidden_key, int64_t heads,
               const std::string& heads_key) {
  if (hidden % heads != 0)
    f.fail(hidden_key, "(" + std::to_string(hidden) + ") is not divisible by " + heads_key + " (" +
                           std::to_string(heads) + "); fix config.json or give head_dim");
  return hidden / heads;
}

// RoPE: rope_theta and the scaling of rope_scaling (transformers 4) or rope_parameters
// (transformers 5, rope_theta inside), each absent, null, or of rope_type "default", "linear"
// (factor) or "llama3" (factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings); every other rope_type and every field zof does not
// implement is refused by name. Sets rope_theta, rotary_dim and the table rope_inv_freq, as
// transformers' _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters and
// _compute_llama3_parameters form it (these return attention_factor 1: cos and sin unscaled).
// partial_ok (Phi-3): partial_rotary_factor, top-level or in rope_parameters, in (0, 1]; RoPE
// rotates int(head_dim * factor) dims of each head, as transformers' _compute_default_rope_parameters.
void parse_rope(const Fields& f, ModelConfig& c, bool partial_ok = false) {
  double theta = f.positive_number_or("rope_theta", 10000.0);
  double partial = 1.0;
  std::string partial_key = "partial_rotary_factor";
  auto take_partial = [&](const json& v, const std::string& where) {
    if (!v.is_number() || !(v.get<double>() > 0) || v.get<double>() > 1)
      f.fail(where, "has partial_rotary_factor " + v.dump() + ", which must be a number in (0, 1]; fix config.json");
    partial = v.get<double>(), partial_key = where;
  };
  if (partial_ok && f.get("partial_rotary_factor")) take_partial(*f.get("partial_rotary_factor"), "partial_rotary_factor");
  std::string type = "default", type_key;  // type_key: the field that set a non-default type
  json params = json::object();              // the scaling's numbers
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* r = f.get(key);
    if (!r) continue;
    if (!r->is_object()) f.fail(key, "must be an object or null, got " + r->dump());
    std::string t = "default";
    for (const char* tk : {"rope_type", "type"})
      if (r->contains(tk)) {
        if (!(*r)[tk].is_string()) f.fail(key, std::string("has a non-string ") + tk);
        t = (*r)[tk].get<std::string>();
      }
    if (t != "default" && t != "linear" && t != "llama3")
      f.fail(key, "has rope_type \"" + t +
                      "\", which zof does not support; supported: default, linear and llama3 (use "
                      "a model whose config.json has one of these)");
    if (t != "default") {
      if (!type_key.empty() && t != type)
        f.fail(key, "has rope_type \"" + t + "\" but " + type_key + " has \"" + type +
                        "\"; fix config.json so that they agree");
      type = t, type_key = key;
    }
    for (auto it = r->begin(); it != r->end(); ++it) {
      const std::string& k = it.key();
      if (k == "rope_type" || k == "type") continue;
      if (k == "rope_theta") {
        if (!it->is_number() || !(it->get<double>() > 0)) f.fail(key, "has a rope_theta that is not a positive number");
        theta = it->get<double>();
      } else if (k == "partial_rotary_factor" && partial_ok) {
        take_partial(*it, key);
      } else if (k == "partial_rotary_factor" && it->is_number() && it->get<double>() == 1.0) {
      } else if ((t == "linear" || t == "llama3") && k == "factor") {
        params[k] = *it;
      } else if (t == "llama3" && (k == "low_freq_factor" || k == "high_freq_factor" ||
                                   k == "original_max_position_embeddings")) {
        params[k] = *it;
      } else {
        f.fail(key, "sets \"" + k + "\", which zof does not support for rope_type \"" + t +
                        "\"; fix config.json or use a model with plain RoPE");
      }
    }
  }
  // A number of the scaling: present, a number, positive.
  auto number = [&](const char* k) {
    auto it = params.find(k);
    if (it == params.end()) f.fail(type_key, "has rope_type \"" + type + "\" but no \"" + k + "\"; fix config.json");
    if (!it->is_number() || !(it->get<double>() > 0))
      f.fail(type_key, std::string("has \"") + k + "\" = " + it->dump() + ", which must be a positive number; fix config.json");
    return it->get<double>();
  };
  c.rope_theta = float(theta);
  c.rotary_dim = partial == 1.0 ? c.head_dim : int64_t(double(c.head_dim) * partial);
  if (partial != 1.0 && (c.rotary_dim % 2 != 0 || c.rotary_dim == 0))
    f.fail(partial_key, "gives int(head_dim (" + std::to_string(c.head_dim) + ") * partial_rotary_factor) = " +
                            std::to_string(c.rotary_dim) +
                            " rotary dims, which must be even and positive; fix config.json");
  if (c.rotary_dim % 2 != 0)
    f.fail("head_dim", "is " + std::to_string(c.head_dim) + ", which is odd; RoPE needs an even head_dim");
  c.rope_inv_freq = rope_default_inv_freq(c.rope_theta, c.rotary_dim);
  std::vector<float>& inv = c.rope_inv_freq;
  // transformers scales the fp32 table with fp32 tensor ops: each step below is one fp32
  // operation (an fp32 op is the double op on the fp32 operands rounded once to fp32).
  auto f32 = [](double x) { return float(x); };
  if (type == "linear") {
    const float factor = f32(number("factor"));
    for (float& x : inv) x = f32(double(x) / factor);
  } else if (type == "llama3") {
    const float factor = f32(number("factor"));
    const double lo = number("low_freq_factor"), hi = number("high_freq_factor");
    const json& om = params.contains("original_max_position_embeddings")
                         ? params["original_max_position_embeddings"] : json();
    if (!om.is_number_integer() || om.get<int64_t>() <= 0)
      f.fail(type_key, "has rope_type \"llama3\" but \"original_max_position_embeddings\" is " +
                           (om.is_null() ? std::string("missing") : om.dump()) +
                           "; it must be a positive integer (fix config.json)");
    if (!(hi > lo))
      f.fail(type_key, "has high_freq_factor (" + std::to_string(hi) + ") not above low_freq_factor (" +
                           std::to_string(lo) + "); fix config.json");
    const double old_ctx = double(om.get<int64_t>());
    const float low_wavelen = f32(old_ctx / lo), high_wavelen = f32(old_ctx / hi);
    const float two_pi = f32(2 * 3.14159265358979323846);
    for (float& x : inv) {
      const float wavelen = f32(double(two_pi) / x);
      const float scaled = wavelen > low_wavelen ? f32(double(x) / factor) : x;
      // smooth = (old_ctx / wavelen - lo) / (hi - lo);
      // smoothed = (1 - smooth) * scaled / factor + smooth * scaled
      const float smooth = f32(double(f32(double(f32(old_ctx / wavelen)) - f32(lo))) / f32(hi - lo));
      const float a = f32(double(f32(1.0 - smooth)) * scaled), b = f32(double(a) / factor);
      const float smoothed = f32(double(b) + double(f32(double(smooth) * scaled)));
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      x = medium ? smoothed : scaled;
    }
  }
}

}  // namespace

int64_t config_size_limit(const std::string& key) { return size_limit(key); }

std::vector<float> rope_default_inv_freq(float theta, int64_t dim) {
  std::vector<float> inv(size_t(dim > 0 ? dim / 2 : 0));
  for (int64_t i = 0; i < (int64_t)inv.size(); ++i)
    inv[i] = float(1.0 / std::pow(double(theta), double(2 * i) / double(dim)));
  return inv;
}

namespace {

DType parse_torch_dtype(const Fields& f) {
  const char* key = f.has("dtype") ? "dtype" : "torch_dtype";  // transformers 5 writes "dtype"
  std::string s = f.string_or(key, "float32");
  if (s == "float32" || s == "float") return DType::F32;
  if (s == "float16" || s == "half") return DType::F16;
  if (s == "bfloat16") return DType::BF16;
  f.fail(key, "is \"" + s + "\"; zof supports float32, float16 and bfloat16 checkpoints");
}

// layer_types (transformers 5): one "sliding_attention" or "full_attention" per layer, into
// c.layer_sliding (c.num_layers set).
void parse_layer_types(const Fields& f, const json& lt, ModelConfig& c) {
  if (!lt.is_array() || (int64_t)lt.size() != c.num_layers)
    f.fail("layer_types", "must be a list of num_hidden_layers (" + std::to_string(c.num_layers) +
                              ") strings; fix config.json");
  c.layer_sliding.assign(size_t(c.num_layers), 0);
  for (size_t i = 0; i < lt.size(); ++i) {
    const json& t = lt[i];
    const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
    if (s != "sliding_attention" && s != "full_attention")
      f.fail("layer_types", "has \"" + s + "\" at " + std::to_string(i) +
                                "; zof supports \"sliding_attention\" and \"full_attention\"");
    c.layer_sliding[i] = s == "sliding_attention";
  }
}

// The Llama family's shape: sizes, heads (num_key_value_heads defaults to def_kv, 0: the
// heads), head_dim (def_head_dim, 0: hidden_size / heads), checked as every family needs.
void parse_llama_shape(const Fields& f, ModelConfig& c, int64_t def_kv, int64_t def_head_dim) {
  c.arch = Arch::Llama;
  c.hidden_size = f.positive("hidden_size");
  c.intermediate_size = f.positive("intermediate_size");
  c.num_layers = f.positive("num_hidden_layers");
  c.num_heads = f.positive("num_attention_heads");
  c.num_kv_heads = f.positive_or("num_key_value_heads", def_kv > 0 ? def_kv : c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    f.fail("num_key_value_heads", "(" + std::to_string(c.num_kv_heads) + ") does not divide num_attention_heads (" +
                                      std::to_string(c.num_heads) + "); fix config.json");
  c.head_dim = f.has("head_dim") ? f.positive("head_dim")
               : def_head_dim > 0 ? def_head_dim
                                  : divide(f, c.hidden_size, "hidden_size", c.num_heads, "num_attention_heads");
  if (c.num_heads * c.head_dim > size_limit("intermediate_size"))
    f.fail("head_dim", "(" + std::to_string(c.head_dim) + ") times num_attention_heads (" +
                           std::to_string(c.num_heads) + ") is more than zof accepts (at most " +
                           std::to_string(size_limit("intermediate_size")) + "); fix config.json");
}

void parse_llama(const Fields& f, ModelConfig& c) {
  const std::string& mt = c.model_type;
  // Qwen3Config's head_dim defaults to 128, not hidden_size / heads.
  parse_llama_shape(f, c, 0, mt == "qwen3" ? 128 : 0);
  // transformers' defaults differ by family.
  const int64_t def_pos = mt == "mistral" ? 4096 * 32 : mt == "qwen2" || mt == "qwen3" ? 32768
                          : mt == "phi3" ? 4096 : 2048;
  c.max_position = f.positive_or("max_position_embeddings", def_pos);
  c.norm_eps = float(f.positive_number_or("rms_norm_eps", mt == "phi3" ? 1e-5 : 1e-6));
  parse_rope(f, c, mt == "phi3");
  std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu" && act != "swish")
    f.fail("hidden_act", "is \"" + act + "\"; zof supports only \"silu\" for " + mt + " models");
  c.act = Activation::SiLU;
  if (mt == "llama") {  // Mistral and Qwen2 hard-code their biases and ignore these fields
    c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
    c.mlp_bias = f.boolean_or("mlp_bias", false);
  } else if (mt == "qwen3") {  // attention_bias as Llama's; no MLP bias; q_norm and k_norm
    c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
    c.mlp_bias = false;
    c.qk_norm = true;
  } else if (mt == "phi3") {  // no biases; fused qkv_proj and gate_up_proj
    c.qkv_bias = c.o_bias = c.mlp_bias = false;
    c.fused_proj = true;
  } else if (mt == "qwen2") {
    c.qkv_bias = true;
    c.o_bias = false;
    c.mlp_bias = false;
  } else {
    c.qkv_bias = c.o_bias = c.mlp_bias = false;
  }
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", false);

  // Sliding-window attention, as transformers applies it (each query sees itself and the
  // window - 1 keys before it): Mistral (sliding_window, default 4096) and Phi-3 (default none) on
  // every layer; Qwen2 and Qwen3 only with use_sliding_window, on the layers layer_types marks,
  // else on those from max_window_layers on. A window that reaches past the context never applies
  // and is dropped.
  if (mt == "mistral" || mt == "qwen2" || mt == "qwen3" || mt == "phi3") {
    const json* sw = f.get("sliding_window");
    int64_t window = 0;  // 0: none
    if (!f.j.contains("sliding_window")) window = mt == "phi3" ? 0 : 4096;  // Phi3Config: None
    else if (sw) window = f.positive("sliding_window");
    if ((mt == "qwen2" || mt == "qwen3") && !f.boolean_or("use_sliding_window", false)) window = 0;
    c.layer_sliding.assign(size_t(c.num_layers), 0);
    if (mt == "mistral" || mt == "phi3") {
      c.layer_sliding.assign(size_t(c.num_layers), window > 0);
    } else if (const json* lt = f.get("layer_types")) {
      parse_layer_types(f, *lt, c);
    } else if (window > 0) {  // read only when sliding is on, as transformers does; 0: all
      int64_t first = 28;
      if (const json* mw = f.get("max_window_layers")) first = f.integer("max_window_layers", *mw);
      if (first < 0)
        f.fail("max_window_layers", "must be 0 or more, got " + std::to_string(first) + "; fix config.json");
      for (int64_t i = first; i < c.num_layers; ++i) c.layer_sliding[size_t(i)] = 1;
    }
    c.sliding_window = window;
    if (window == 0 || window >= c.max_position) {
      c.sliding_window = 0;
      c.layer_sliding.clear();
    }
  }
}

// A soft-capping field: absent gives the family's default (0: none), null none, else a
// positive number.
float softcap_field(const Fields& f, const std::string& key, double def) {
  if (!f.j.contains(key)) return float(def);
  if (f.j[key].is_null()) return 0.f;
  return float(f.positive_number_or(key, def));
}

// Gemma 2 (gemma2) and Gemma 3's text model (gemma3_text), as transformers' Gemma2Config and
// Gemma3TextConfig read them: the Llama-family block with Gemma's differences (config.h), each
// option zof does not implement refused by name.
void parse_gemma(const Fields& f, ModelConfig& c) {
  const std::string& mt = c.model_type;
  const bool g3 = mt == "gemma3_text";
  parse_llama_shape(f, c, 4, 256);  // Gemma2Config's defaults: 4 kv heads, head_dim 256
  c.max_position = f.positive_or("max_position_embeddings", g3 ? 131072 : 8192);
  c.norm_eps = float(f.positive_number_or("rms_norm_eps", 1e-6));
  // transformers reads hidden_activation only (hidden_act, which old configs carry too, is unused).
  const std::string act = f.string_or("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    f.fail("hidden_activation", "is \"" + act + "\"; zof supports only \"gelu_pytorch_tanh\" for " + mt + " models");
  c.act = Activation::GeluTanh;  // gated: gelu_tanh(gate) * up
  c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
  c.mlp_bias = false;
  c.qk_norm = g3;
  c.norm_offset = 1.f;
  c.sandwich_norm = true;
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", true);
  f.reject_if_true("use_bidirectional_attention", false,
                   "zof trains causal language models (use a checkpoint with causal attention)");
  // transformers multiplies the token rows by sqrt(hidden_size) held in the model's dtype.
  const double root = std::sqrt(double(c.hidden_size));
  const DType dt = parse_torch_dtype(f);
  c.embed_scale = dt == DType::BF16   ? bf16_round(float(root))
                  : dt == DType::F16 ? f16_to_f32(f32_to_f16(float(root)))
                                     : float(root);
  c.attn_scale = float(std::pow(f.positive_number_or("query_pre_attn_scalar", 256), -0.5));
  c.attn_softcap = softcap_field(f, "attn_logit_softcapping", g3 ? 0.0 : 50.0);
  c.final_softcap = softcap_field(f, "final_logit_softcapping", g3 ? 0.0 : 30.0);
  // Which layers slide: layer_types, else every other layer (Gemma 2: 0, 2, ...) or all but
  // every sliding_window_pattern-th (Gemma 3, 6). A null window: every layer attends in full.
  // null: transformers cannot build the sliding layers' mask (it raises), nor does zof guess.
  if (f.j.contains("sliding_window") && !f.has("sliding_window"))
    f.fail("sliding_window", "is null, but " + mt + " models have sliding-window layers; give the "
                             "window the model was trained with (e.g. 4096)");
  c.sliding_window = f.positive_or("sliding_window", 4096);
  c.layer_sliding.assign(size_t(c.num_layers), 0);
  if (const json* lt = f.get("layer_types")) {
    parse_layer_types(f, *lt, c);
  } else {
    const int64_t pattern = g3 ? f.positive_or("sliding_window_pattern", 6) : 2;
    for (int64_t i = 0; i < c.num_layers; ++i) c.layer_sliding[size_t(i)] = (i + 1) % pattern != 0;
  }
  if (!g3) {
    parse_rope(f, c);
    return;
  }
  // Gemma 3: the full-attention layers' RoPE (rope_theta, default 1e6, with rope_scaling) and the
  // sliding layers' (rope_local_base_freq, default 1e4, unscaled); transformers 5 writes both
  // into rope_parameters, keyed by layer type.
  // The top-level rope_theta and rope_local_base_freq are the defaults of either spelling.
  json full = json::object(), local = json::object();
  full["rope_theta"] = f.has("rope_theta") ? *f.get("rope_theta") : json(1e6);
  local["rope_theta"] = f.has("rope_local_base_freq") ? *f.get("rope_local_base_freq") : json(1e4);
  if (f.has("rope_scaling")) full["rope_scaling"] = *f.get("rope_scaling");
  if (const json* rp = f.get("rope_parameters")) {
    if (!rp->is_object() || rp->empty())
      f.fail("rope_parameters", "must be an object keyed by full_attention and sliding_attention");
    for (auto it = rp->begin(); it != rp->end(); ++it)
      if (it.key() != "full_attention" && it.key() != "sliding_attention")
        f.fail("rope_parameters", "has \"" + it.key() +
                                      "\"; Gemma 3's are keyed by full_attention and sliding_attention "
                                      "(transformers ignores any other key: fix config.json)");
    if (rp->contains("full_attention")) full["rope_parameters"] = (*rp)["full_attention"];
    if (rp->contains("sliding_attention")) local["rope_parameters"] = (*rp)["sliding_attention"];
  }
  const std::string full_src = f.src + " (full-attention layers' RoPE)";
  const std::string local_src = f.src + " (sliding layers' RoPE, rope_local_base_freq)";
  parse_rope(Fields{local, local_src}, c);
  std::vector<float> local_inv = std::move(c.rope_inv_freq);
  parse_rope(Fields{full, full_src}, c);
  c.rope_local_inv_freq = std::move(local_inv);
}

void parse_opt(const Fields& f, ModelConfig& c) {
  c.arch = Arch::OPT;
  c.hidden_size = f.positive("hidden_size");
  c.intermediate_size = f.positive("ffn_dim");
  c.num_layers = f.positive("num_hidden_layers");
  c.num_heads = f.positive("num_attention_heads");
  c.num_kv_heads = c.num_heads;
  c.head_dim = divide(f, c.hidden_size, "hidden_size", c.num_heads, "num_attention_heads");
  c.max_position = f.positive("max_position_embeddings");
  c.word_embed_proj_dim = f.positive_or("word_embed_proj_dim", c.hidden_size);
  c.do_layer_norm_before = f.boolean_or("do_layer_norm_before", true);
  f.reject_if_true("_remove_final_layer_norm", false, "it drops the final LayerNorm of old OPT checkpoints");
  if (!f.boolean_or("layer_norm_elementwise_affine", true))
    f.fail("layer_norm_elementwise_affine", "= false is not supported: zof's LayerNorm has a weight and a bias");
  std::string act = f.string_or("activation_function", "relu");
  if (act == "relu") c.act = Activation::ReLU;
  else if (act == "gelu") c.act = Activation::GeluErf;
  else f.fail("activation_function", "is \"" + act + "\"; zof supports \"relu\" and \"gelu\" for opt models");
  c.norm_eps = 1e-5f;  // nn.LayerNorm's default, which OPT uses
  c.qkv_bias = c.o_bias = c.mlp_bias = f.boolean_or("enable_bias", true);
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", true);
}

void parse_gpt2(const Fields& f, ModelConfig& c) {
  c.arch = Arch::GPT2;
  c.hidden_size = f.positive("n_embd");
  c.num_layers = f.positive("n_layer");
  c.num_heads = f.positive("n_head");
  c.num_kv_heads = c.num_heads;
  c.head_dim = divide(f, c.hidden_size, "n_embd", c.num_heads, "n_head");
  c.max_position = f.positive("n_positions");
  if (!f.has("n_inner") && c.hidden_size > std::numeric_limits<int64_t>::max() / 4)
    f.fail("n_embd", "is too large (" + std::to_string(c.hidden_size) + "): 4 * n_embd, the default n_inner, overflows; fix config.json");
  c.intermediate_size = f.positive_or("n_inner", 4 * c.hidden_size);
  c.norm_eps = float(f.positive_number_or("layer_norm_epsilon", 1e-5));
  std::string act = f.string_or("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") c.act = Activation::GeluTanh;
  else if (act == "gelu") c.act = Activation::GeluErf;
  else if (act == "relu") c.act = Activation::ReLU;
  else
    f.fail("activation_function",
           "is \"" + act + "\"; zof supports gelu_new, gelu_pytorch_tanh, gelu_fast, gelu and relu for gpt2 models");
  f.reject_if_true("scale_attn_by_inverse_layer_idx", false, "it scales attention by 1/(layer+1), which zof does not implement");
  f.reject_if_true("add_cross_attention", false, "zof runs decoder-only models");
  if (!f.boolean_or("scale_attn_weights", true))
    f.fail("scale_attn_weights", "= false is not supported: zof scales attention scores by 1/sqrt(head_dim)");
  // reorder_and_upcast_attn only changes the rounding of the attention scores: accepted.
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", true);
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw Error(source + ": config.json must hold a JSON object, got a " + j.type_name());
  Fields f{j, source};
  ModelConfig c;
  const json* mt = f.get("model_type");
  if (!mt) f.fail("model_type", "is missing; zof supports llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, opt and gpt2");
  if (!mt->is_string()) f.fail("model_type", "must be a string, got " + mt->dump());
  c.model_type = mt->get<std::string>();
  if (c.model_type == "llama" || c.model_type == "mistral" || c.model_type == "qwen2" ||
      c.model_type == "qwen3" || c.model_type == "phi3")
    parse_llama(f, c);
  else if (c.model_type == "gemma2" || c.model_type == "gemma3_text") parse_gemma(f, c);
  else if (c.model_type == "opt") parse_opt(f, c);
  else if (c.model_type == "gpt2") parse_gpt2(f, c);
  else if (c.model_type == "gemma3")
    f.fail("model_type", "is \"gemma3\", the multimodal Gemma 3 checkpoint (its text model is nested in text_config, "
                         "its tensors under language_model); zof reads text-only checkpoints: use one whose "
                         "model_type is \"gemma3_text\" (e.g. google/gemma-3-1b-pt)");
  else
    f.fail("model_type", "is \"" + c.model_type + "\", which zof does not support; supported: llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, opt, gpt2");
  c.vocab_size = f.positive("vocab_size");
  c.bos_token_id = f.token_id("bos_token_id");
  c.eos_token_id = f.token_id("eos_token_id");
  c.pad_token_id = f.token_id("pad_token_id");
  c.torch_dtype = parse_torch_dtype(f);
  c.raw = j;
  return c;
}

ModelConfig ModelConfig::load(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec) && !ec)
    throw Error(path + ": no such file; check that the model directory holds config.json");
  const std::string text = read_input_file(
      path, path, "config.json must be a regular file of at most " + size_words(kMaxModelJsonBytes) +
                      ": replace it with the model's own config.json (re-download it)",
      kMaxModelJsonBytes);
  check_json_depth(text, path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(path + ": malformed JSON (" + e.what() + "); fix or re-download config.json");
  }
  return from_json(j, path);
}

int64_t ModelConfig::num_params() const {
  const int64_t H = hidden_size, V = vocab_size, I = intermediate_size, L = num_layers;
  int64_t n = 0;
  switch (arch) {
    case Arch::Llama: {
      const int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
      int64_t layer = H * q + 2 * H * kv + q * H  // q, k, v, o
                      + 3 * H * I                 // gate, up, down
                      + 2 * H;                    // input and post-attention RMSNorm
      if (qk_norm) layer += 2 * head_dim;  // Qwen3's and Gemma 3's q_norm and k_norm
      if (sandwich_norm) layer += 2 * H;   // Gemma's post-attention and post-feedforward norms
      if (qkv_bias) layer += q + 2 * kv;
      if (o_bias) layer += H;
      if (mlp_bias) layer += 2 * I + H;
      n = V * H + L * layer + H + (tie_embeddings ? 0 : V * H);
      break;
    }
    case Arch::OPT: {
      const int64_t P = word_embed_proj_dim, b = qkv_bias ? 1 : 0;
      int64_t layer = 4 * (H * H + b * H) + H * I + b * I + I * H + b * H + 4 * H;  // + two LayerNorms
      n = V * P + (max_position + 2) * H  // OPT's learned positions carry an offset of 2
          + L * layer + (do_layer_norm_before ? 2 * H : 0) + (P != H ? 2 * P * H : 0) +
          (tie_embeddings ? 0 : V * P);
      break;
    }
    case Arch::GPT2: {
      int64_t layer = 2 * H + (3 * H * H + 3 * H) + (H * H + H) + 2 * H + (H * I + I) + (I * H + H);
      n = V * H + max_position * H + L * layer + 2 * H + (tie_embeddings ? 0 : V * H);
      break;
    }
  }
  return n;
}

}  // namespace zof
