// Model: the parameter layout of each architecture family (names and shapes as Hugging Face
// defines them), loading from safetensors with full validation, saving back, random init.
#include "zof/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <type_traits>
#include <unordered_map>

#include "zof/error.h"
#include "zof/input_file.h"
#include "hf/gguf.h"
#include "hf/safetensors.h"
#include "model/tensor_blocks.h"
#include "util/files.h"

namespace fs = std::filesystem;

namespace zof {
namespace {

// A view slot that reads a tensor (a field of EmbedWeights, LayerWeights or HeadWeights), at an
// element offset into it: Phi-3's q, k, v and gate, up are row ranges of one tensor each.
template <class View>
struct Slot {
  Weight View::*field = nullptr;
  int64_t at = 0;
};

// 1-D or 2-D, held inline: the views rebuild their family's table at every call, so a row
// allocates nothing.
struct Shape {
  std::array<int64_t, 2> d{};
  int rank = 0;
  Shape(std::initializer_list<int64_t> s) : rank((int)s.size()) {
    ZOF_ASSERT(s.size() <= d.size());
    std::copy(s.begin(), s.end(), d.begin());
  }
  std::vector<int64_t> vec() const { return {d.begin(), d.begin() + rank}; }
};

// One tensor of a family: its Hugging Face name (a layer's follows "<layer_prefix><i>."), its
// shape as zof holds it (a Linear's (out, in)), whether weight decay applies, the view slots
// that read it (up to three; the rest null), whether this config has it, and whether the file
// holds its transpose.
template <class View>
struct Tensor {
  const char* name;
  Shape shape;
  bool decay;
  Slot<View> slots[3];
  bool present = true;
  bool transposed = false;
};
constexpr bool kDecay = true, kNoDecay = false;  // norms and biases do not decay

// A family's tensors, each written once, in the order Hugging Face writes them: the storage
// layout (build_layout) and the views (Model::embed, layer, head) both come from this table, a
// view reading the k-th tensor of its block's list as the block's k-th parameter, so the two
// cannot disagree.
struct Family {
  std::string layer_prefix;  // then the layer's index and "."
  std::vector<Tensor<EmbedWeights>> embed{};
  std::vector<Tensor<LayerWeights>> layer{};
  std::vector<Tensor<HeadWeights>> head{};
};

using EW = EmbedWeights;
using LW = LayerWeights;
using HW = HeadWeights;
const char* const kLmHead = "lm_head.weight";  // every family's untied LM head, (V, E)

// Llama and the families that differ from it only in config fields (Mistral, Qwen2, Qwen3,
// Phi-3, Gemma 2/3). Phi-3's fused tensors and the biases, q/k norms and sandwich norms are
// never in one config (config.cpp), so one list holds them all.
Family llama_family(const ModelConfig& c) {
  const int64_t C = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const int64_t Hq = c.num_heads * c.head_dim, Hk = c.num_kv_heads * c.head_dim;
  const bool fused = c.fused_proj, split = !fused, sandwich = c.sandwich_norm;
  Family f{"model.layers."};
  f.embed = {{"model.embed_tokens.weight", {V, C}, kDecay, {{&EW::tokens}}}};
  f.layer = {
      {"input_layernorm.weight", {C}, kNoDecay, {{&LW::ln1_w}}},
      {"self_attn.qkv_proj.weight", {Hq + 2 * Hk, C}, kDecay,
       {{&LW::q_w}, {&LW::k_w, Hq * C}, {&LW::v_w, (Hq + Hk) * C}}, fused},
      {"self_attn.q_proj.weight", {Hq, C}, kDecay, {{&LW::q_w}}, split},
      {"self_attn.q_proj.bias", {Hq}, kNoDecay, {{&LW::q_b}}, c.qkv_bias},
      {"self_attn.k_proj.weight", {Hk, C}, kDecay, {{&LW::k_w}}, split},
      {"self_attn.k_proj.bias", {Hk}, kNoDecay, {{&LW::k_b}}, c.qkv_bias},
      {"self_attn.v_proj.weight", {Hk, C}, kDecay, {{&LW::v_w}}, split},
      {"self_attn.v_proj.bias", {Hk}, kNoDecay, {{&LW::v_b}}, c.qkv_bias},
      {"self_attn.o_proj.weight", {C, Hq}, kDecay, {{&LW::o_w}}},
      {"self_attn.o_proj.bias", {C}, kNoDecay, {{&LW::o_b}}, c.o_bias},
      // Qwen3, Gemma 3: RMSNorm weights over head_dim, shared by every head
      {"self_attn.q_norm.weight", {c.head_dim}, kNoDecay, {{&LW::q_norm}}, c.qk_norm},
      {"self_attn.k_norm.weight", {c.head_dim}, kNoDecay, {{&LW::k_norm}}, c.qk_norm},
      // Gemma: post_attention_layernorm is the attention output's norm, and the FFN reads
      // pre_feedforward_layernorm
      {"post_attention_layernorm.weight", {C}, kNoDecay,
       {{sandwich ? &LW::post_attn_norm : &LW::ln2_w}}},
      {"pre_feedforward_layernorm.weight", {C}, kNoDecay, {{&LW::ln2_w}}, sandwich},
      {"post_feedforward_layernorm.weight", {C}, kNoDecay, {{&LW::post_ffn_norm}}, sandwich},
      {"mlp.gate_up_proj.weight", {2 * I, C}, kDecay, {{&LW::fc1_w}, {&LW::up_w, I * C}}, fused},
      {"mlp.gate_proj.weight", {I, C}, kDecay, {{&LW::fc1_w}}, split},
      {"mlp.gate_proj.bias", {I}, kNoDecay, {{&LW::fc1_b}}, c.mlp_bias},
      {"mlp.up_proj.weight", {I, C}, kDecay, {{&LW::up_w}}, split},
      {"mlp.up_proj.bias", {I}, kNoDecay, {{&LW::up_b}}, c.mlp_bias},
      {"mlp.down_proj.weight", {C, I}, kDecay, {{&LW::fc2_w}}},
      {"mlp.down_proj.bias", {C}, kNoDecay, {{&LW::fc2_b}}, c.mlp_bias},
  };
  f.head = {{"model.norm.weight", {C}, kNoDecay, {{&HW::norm_w}}},
            {kLmHead, {V, C}, kDecay, {{&HW::lm_head}}, !c.tie_embeddings}};
  return f;
}

// OPT: the token table has word_embed_proj_dim E columns; where E != hidden, project_in and
// project_out map between them (OPT-350m, which also has no final norm).
Family opt_family(const ModelConfig& c) {
  const int64_t C = c.hidden_size, V = c.vocab_size, F = c.intermediate_size;
  const int64_t E = c.word_embed_proj_dim;
  const bool b = c.qkv_bias, projected = E != C;
  Family f{"model.decoder.layers."};
  f.embed = {
      {"model.decoder.embed_tokens.weight", {V, E}, kDecay, {{&EW::tokens}}},
      {"model.decoder.embed_positions.weight", {c.max_position + 2, C}, kDecay,
       {{&EW::positions}}},
      {"model.decoder.project_in.weight", {C, E}, kDecay, {{&EW::project_in}}, projected},
  };
  f.layer = {
      {"self_attn.q_proj.weight", {C, C}, kDecay, {{&LW::q_w}}},
      {"self_attn.q_proj.bias", {C}, kNoDecay, {{&LW::q_b}}, b},
      {"self_attn.k_proj.weight", {C, C}, kDecay, {{&LW::k_w}}},
      {"self_attn.k_proj.bias", {C}, kNoDecay, {{&LW::k_b}}, b},
      {"self_attn.v_proj.weight", {C, C}, kDecay, {{&LW::v_w}}},
      {"self_attn.v_proj.bias", {C}, kNoDecay, {{&LW::v_b}}, b},
      {"self_attn.out_proj.weight", {C, C}, kDecay, {{&LW::o_w}}},
      {"self_attn.out_proj.bias", {C}, kNoDecay, {{&LW::o_b}}, b},
      {"self_attn_layer_norm.weight", {C}, kNoDecay, {{&LW::ln1_w}}},
      {"self_attn_layer_norm.bias", {C}, kNoDecay, {{&LW::ln1_b}}},
      {"fc1.weight", {F, C}, kDecay, {{&LW::fc1_w}}},
      {"fc1.bias", {F}, kNoDecay, {{&LW::fc1_b}}, b},
      {"fc2.weight", {C, F}, kDecay, {{&LW::fc2_w}}},
      {"fc2.bias", {C}, kNoDecay, {{&LW::fc2_b}}, b},
      {"final_layer_norm.weight", {C}, kNoDecay, {{&LW::ln2_w}}},
      {"final_layer_norm.bias", {C}, kNoDecay, {{&LW::ln2_b}}},
  };
  f.head = {
      {"model.decoder.final_layer_norm.weight", {C}, kNoDecay, {{&HW::norm_w}},
       c.do_layer_norm_before},
      {"model.decoder.final_layer_norm.bias", {C}, kNoDecay, {{&HW::norm_b}},
       c.do_layer_norm_before},
      {"model.decoder.project_out.weight", {E, C}, kDecay, {{&HW::project_out}}, projected},
      {kLmHead, {V, E}, kDecay, {{&HW::lm_head}}, !c.tie_embeddings},
  };
  return f;
}

Family gpt2_family(const ModelConfig& c) {
  const int64_t C = c.hidden_size, V = c.vocab_size, F = c.intermediate_size;
  Family f{"transformer.h."};
  f.embed = {{"transformer.wte.weight", {V, C}, kDecay, {{&EW::tokens}}},
             {"transformer.wpe.weight", {c.max_position, C}, kDecay, {{&EW::positions}}}};
  f.layer = {
      {"ln_1.weight", {C}, kNoDecay, {{&LW::ln1_w}}},
      {"ln_1.bias", {C}, kNoDecay, {{&LW::ln1_b}}},
      {"attn.c_attn.weight", {3 * C, C}, kDecay, {{&LW::qkv_w}}},
      {"attn.c_attn.bias", {3 * C}, kNoDecay, {{&LW::qkv_b}}},
      {"attn.c_proj.weight", {C, C}, kDecay, {{&LW::o_w}}},
      {"attn.c_proj.bias", {C}, kNoDecay, {{&LW::o_b}}},
      {"ln_2.weight", {C}, kNoDecay, {{&LW::ln2_w}}},
      {"ln_2.bias", {C}, kNoDecay, {{&LW::ln2_b}}},
      {"mlp.c_fc.weight", {F, C}, kDecay, {{&LW::fc1_w}}},
      {"mlp.c_fc.bias", {F}, kNoDecay, {{&LW::fc1_b}}},
      {"mlp.c_proj.weight", {C, F}, kDecay, {{&LW::fc2_w}}},
      {"mlp.c_proj.bias", {C}, kNoDecay, {{&LW::fc2_b}}},
  };
  // Conv1D: the file holds every layer matrix as (in, out).
  for (auto& t : f.layer) t.transposed = t.shape.rank == 2;
  f.head = {{"transformer.ln_f.weight", {C}, kNoDecay, {{&HW::norm_w}}},
            {"transformer.ln_f.bias", {C}, kNoDecay, {{&HW::norm_b}}},
            {kLmHead, {V, C}, kDecay, {{&HW::lm_head}}, !c.tie_embeddings}};
  return f;
}

Family arch_family(const ModelConfig& c) {
  switch (c.arch) {
    case Arch::Llama: return llama_family(c);
    case Arch::OPT: return opt_family(c);
    case Arch::GPT2: return gpt2_family(c);
  }
  ZOF_ABORT("unknown arch");
}

// The config's family with the tensors it lacks dropped.
Family family(const ModelConfig& c) {
  Family f = arch_family(c);
  auto absent = [](const auto& t) { return !t.present; };
  std::erase_if(f.embed, absent);
  std::erase_if(f.layer, absent);
  std::erase_if(f.head, absent);
  // Model::token_table() is the first parameter.
  ZOF_ASSERT(!f.embed.empty() && f.embed.front().slots[0].field == &EW::tokens);
  return f;
}

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  bool decay;
  bool transposed;
  bool gathered;  // the token or a position table: rows gathered, never a matrix product's
};

// Tensors of one block, in the order Hugging Face writes them.
using BlockSpec = std::pair<std::string, std::vector<Spec>>;

template <class View>
std::vector<Spec> specs(const std::vector<Tensor<View>>& tensors, const std::string& prefix) {
  std::vector<Spec> out;
  for (const auto& t : tensors) {
    bool gathered = false;
    if constexpr (std::is_same_v<View, EW>)
      for (const auto& s : t.slots) gathered |= s.field == &EW::tokens || s.field == &EW::positions;
    out.push_back({prefix + t.name, t.shape.vec(), t.decay, t.transposed, gathered});
  }
  return out;
}

std::vector<BlockSpec> layout(const ModelConfig& c) {
  const Family f = family(c);
  std::vector<BlockSpec> out{{"embed", specs(f.embed, "")}};
  for (int64_t i = 0; i < c.num_layers; ++i)
    out.push_back({"layers." + std::to_string(i),
                   specs(f.layer, f.layer_prefix + std::to_string(i) + ".")});
  out.push_back({"head", specs(f.head, "")});
  return out;
}

// A block's view: the k-th tensor of its list read as the block's k-th parameter.
template <class View>
View view_of(const std::vector<Tensor<View>>& tensors, const Block& b,
             const Model::ParamLocator& at) {
  ZOF_ASSERT(tensors.size() == b.params.size());
  View w;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Weight x = at(b.params[k]);
    for (const auto& s : tensors[k].slots)
      if (s.field) w.*s.field = x.at(s.at);
  }
  return w;
}

// Parameter `name` as the files name it: the original GPT-2 checkpoints leave out the
// "transformer." prefix.
std::string name_in_files(const safetensors::Archive& a, const ModelConfig& c,
                          const std::string& name) {
  const std::string prefix = "transformer.";
  if (c.arch == Arch::GPT2 && !a.find(name) && name.rfind(prefix, 0) == 0 &&
      a.find(name.substr(prefix.size())))
    return name.substr(prefix.size());
  return name;
}

// Copies a stored tensor into dst as fp32, transposing a 2-D (in, out) file tensor to (out, in).
void load_tensor(const safetensors::TensorInfo& t, const Param& p, float* dst) {
  if (!p.transposed) {
    safetensors::to_f32(t, dst);
    return;
  }
  const int64_t rows = t.shape[0], cols = t.shape[1];  // file (in, out)
  std::vector<float> tmp(rows * cols);
  safetensors::to_f32(t, tmp.data());
#pragma omp parallel for
  for (int64_t o = 0; o < cols; ++o)
    for (int64_t i = 0; i < rows; ++i) dst[o * rows + i] = tmp[i * cols + o];
}

// Where a model directory's tensors are listed, for messages.
std::string weights_file(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  return (fs::exists(single, ec) || ec ? single : fs::path(dir) / "model.safetensors.index.json").string();
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// The config's sizes against the tensors the weights file declares, before anything is
// allocated: the layer count first (a config of 10^9 layers would build 10^9 block layouts),
// then each size field from the tensor that shows it, then every tensor's shape. Each error
// names config.json's field.
void check_config_against_weights(const ModelConfig& c, const safetensors::Archive& a,
                                  const std::string& dir) {
  const std::string cfg = (fs::path(dir) / "config.json").string();
  const std::string file = weights_file(dir);
  const bool gpt2 = c.arch == Arch::GPT2;
  // GPT-2 checkpoints may lack the "transformer." prefix.
  auto name_in_file = [&](const std::string& n) {
    if (gpt2 && !a.find(n) && n.rfind("transformer.", 0) == 0) {
      const std::string bare = n.substr(std::string("transformer.").size());
      if (a.find(bare)) return bare;
    }
    return n;
  };
  // Layers: the highest index among the layer tensors' names, plus one.
  std::vector<std::string> prefixes{family(c).layer_prefix};
  if (gpt2) prefixes.push_back(prefixes[0].substr(std::string("transformer.").size()));
  int64_t layers = 0;
  for (const auto& n : a.names())
    for (const auto& p : prefixes) {
      if (n.rfind(p, 0) != 0) continue;
      int64_t i = 0;
      size_t at = p.size(), digits = 0;
      while (at < n.size() && std::isdigit((unsigned char)n[at]) && digits < 9)
        i = i * 10 + (n[at++] - '0'), ++digits;
      if (digits > 0 && at < n.size() && n[at] == '.') layers = std::max(layers, i + 1);
    }
  const std::string layers_key = gpt2 ? "n_layer" : "num_hidden_layers";
  ZOF_CHECK(layers == c.num_layers,
            cfg + ": " + layers_key + " is " + std::to_string(c.num_layers) + " but " + file +
                " holds " + std::to_string(layers) + " layers; fix config.json or use the weights "
                "it belongs to");
  // A size field against dimension d of a tensor that shows it (file layout).
  auto size_field = [&](const std::string& key, int64_t value, const std::string& tensor,
                        size_t d, std::vector<int64_t> expect) {
    const safetensors::TensorInfo* t = a.find(name_in_file(tensor));
    if (!t || t->shape.size() != expect.size() || t->shape[d] == value) return;
    throw Error(cfg + ": " + key + " is " + std::to_string(value) + " but tensor " + t->name +
                " in " + t->file + " has shape " + shape_str(t->shape) + ", not " +
                shape_str(expect) + "; fix config.json or use the weights it belongs to");
  };
  const int64_t V = c.vocab_size, C = c.hidden_size, I = c.intermediate_size;
  const std::string hidden_key = gpt2 ? "n_embd" : "hidden_size";
  const std::string inner_key = c.arch == Arch::Llama ? "intermediate_size"
                                : c.arch == Arch::OPT ? "ffn_dim"
                                : c.raw.contains("n_inner") && !c.raw["n_inner"].is_null()
                                    ? "n_inner"
                                    : "n_inner (default 4 * n_embd)";
  switch (c.arch) {
    case Arch::Llama:
      size_field("vocab_size", V, "model.embed_tokens.weight", 0, {V, C});
      size_field(hidden_key, C, "model.embed_tokens.weight", 1, {V, C});
      if (c.fused_proj) {  // Phi-3: I from down_proj (C, I); the fused shapes are checked below
        size_field(inner_key, I, "model.layers.0.mlp.down_proj.weight", 1, {C, I});
        size_field("num_attention_heads * head_dim", c.num_heads * c.head_dim,
                   "model.layers.0.self_attn.o_proj.weight", 1, {C, c.num_heads * c.head_dim});
        break;
      }
      size_field(inner_key, I, "model.layers.0.mlp.gate_proj.weight", 0, {I, C});
      size_field("num_attention_heads * head_dim", c.num_heads * c.head_dim,
                 "model.layers.0.self_attn.q_proj.weight", 0, {c.num_heads * c.head_dim, C});
      size_field("num_key_value_heads * head_dim", c.num_kv_heads * c.head_dim,
                 "model.layers.0.self_attn.k_proj.weight", 0, {c.num_kv_heads * c.head_dim, C});
      break;
    case Arch::OPT: {
      const int64_t E = c.word_embed_proj_dim;
      size_field("vocab_size", V, "model.decoder.embed_tokens.weight", 0, {V, E});
      size_field(E == C ? hidden_key : "word_embed_proj_dim", E,
                 "model.decoder.embed_tokens.weight", 1, {V, E});
      size_field(hidden_key, C, "model.decoder.layers.0.fc1.weight", 1, {I, C});
      size_field(inner_key, I, "model.decoder.layers.0.fc1.weight", 0, {I, C});
      break;
    }
    case Arch::GPT2:
      size_field("vocab_size", V, "transformer.wte.weight", 0, {V, C});
      size_field(hidden_key, C, "transformer.wte.weight", 1, {V, C});
      size_field(inner_key, I, "transformer.h.0.mlp.c_fc.weight", 1, {C, I});  // Conv1D (in, out)
      break;
  }
  // Every tensor the architecture needs, with its shape (heads, head_dim, positions, biases).
  for (const auto& [block, specs] : layout(c))
    for (const auto& s : specs) {
      std::vector<int64_t> shape = s.shape;
      if (s.transposed) std::swap(shape[0], shape[1]);
      a.require(name_in_file(s.name), shape);
    }
}

// Whether any of x[0, n) is a NaN or an infinity (exponent bits all ones): a branch-free OR the
// compiler vectorizes, unaffected by -ffinite-math-only.
bool any_non_finite(const float* x, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    any |= (uint32_t)((b & 0x7f800000u) == 0x7f800000u);
  }
  return any != 0;
}

// 64-bit mixing (the xxh64 round and avalanche).
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full,
                   kP3 = 0x165667B19E3779F9ull;
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t round64(uint64_t acc, uint64_t v) { return rotl(acc + v * kP2, 31) * kP1; }
inline uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  return h ^ (h >> 32);
}

// One chunk of whole 64-bit words (the storage holds an even number of floats per chunk).
[[gnu::noipa]] uint64_t hash_chunk(const float* x, int64_t n, uint64_t seed) {
  uint64_t a0 = seed + kP1 + kP2, a1 = seed + kP2, a2 = seed, a3 = seed - kP1;
  const int64_t words = n / 2;
  int64_t w = 0;
  for (; w + 4 <= words; w += 4) {
    uint64_t v[4];
    std::memcpy(v, x + 2 * w, 32);
    a0 = round64(a0, v[0]);
    a1 = round64(a1, v[1]);
    a2 = round64(a2, v[2]);
    a3 = round64(a3, v[3]);
  }
  uint64_t h = rotl(a0, 1) + rotl(a1, 7) + rotl(a2, 12) + rotl(a3, 18);
  for (; w < words; ++w) {
    uint64_t v;
    std::memcpy(&v, x + 2 * w, 8);
    h = round64(h, v);
  }
  if (n % 2) {
    uint32_t t;
    std::memcpy(&t, x + n - 1, 4);
    h = round64(h, t);
  }
  return avalanche(h + (uint64_t)n);
}

// Model::fingerprint()'s hash of a storage fed in order: the values as fp32 at increasing
// element offsets (gaps are the storage's zeros), in chunks of 1 MiB hashed with their index as
// seed and combined in order. Whole chunks of a feed are hashed in parallel straight from it;
// a chunk that spans feeds passes through a buffer of its own.
class FingerprintStream {
 public:
  static constexpr int64_t kChunk = int64_t(1) << 18;  // floats: 1 MiB
  void feed(int64_t at, const float* x, int64_t n) {
    ZOF_ASSERT(at >= pos_);
    zeros(at - pos_);
    append(x, n);
  }
  std::string finish(int64_t total, bool half) {
    ZOF_ASSERT(total >= pos_);
    zeros(total - pos_);
    if (fill_ > 0) parts_.push_back(hash_chunk(buf_.data(), fill_, (uint64_t)parts_.size()));
    uint64_t h = kP3 ^ (uint64_t)total;
    for (uint64_t p : parts_) h = round64(h, p);
    h = avalanche(h);
    char out[40];
    std::snprintf(out, sizeof out, "storage-%s-mix64:%016llx", half ? "bf16" : "f32",
                  (unsigned long long)h);
    return out;
  }

 private:
  void zeros(int64_t n) {
    static const std::vector<float> z(size_t(1) << 16, 0.f);
    for (int64_t i = 0; i < n; i += (int64_t)z.size())
      append(z.data(), std::min<int64_t>((int64_t)z.size(), n - i));
  }
  void append(const float* x, int64_t n) {
    pos_ += n;
    if (fill_ > 0) {  // top up the chunk in the buffer
      const int64_t m = std::min(kChunk - fill_, n);
      std::copy_n(x, m, buf_.data() + fill_);
      fill_ += m, x += m, n -= m;
      if (fill_ < kChunk) return;
      parts_.push_back(hash_chunk(buf_.data(), kChunk, (uint64_t)parts_.size()));
      fill_ = 0;
    }
    const int64_t whole = n / kChunk, first = (int64_t)parts_.size();
    parts_.resize(size_t(first + whole));
#pragma omp parallel for schedule(static) if (whole > 4)
    for (int64_t c = 0; c < whole; ++c)
      parts_[first + c] = hash_chunk(x + c * kChunk, kChunk, (uint64_t)(first + c));
    x += whole * kChunk, n -= whole * kChunk;
    if (n > 0) {
      if (buf_.empty()) buf_.resize(kChunk);
      std::copy_n(x, n, buf_.data());
      fill_ = n;
    }
  }
  int64_t pos_ = 0, fill_ = 0;
  std::vector<float> buf_;
  std::vector<uint64_t> parts_;
};

// Holds block b through tier (none: the storage is resident) until done(), which releases it
// (and may throw a transfer's error); a scope left by an exception releases it unchanged.
class HeldBlock {
 public:
  HeldBlock(BlockAccess* tier, int b, bool overwrite = false) : tier_(tier), b_(b) {
    if (tier_) tier_->acquire(b_, overwrite);
  }
  ~HeldBlock() {
    if (tier_ && !done_) try {
        tier_->release(b_, false);
      } catch (...) {  // the error that unwinds is the one the caller hears
      }
  }
  HeldBlock(const HeldBlock&) = delete;
  HeldBlock& operator=(const HeldBlock&) = delete;
  void done(bool changed) {
    done_ = true;
    if (tier_) tier_->release(b_, changed);
  }

 private:
  BlockAccess* tier_;
  int b_;
  bool done_ = false;
};

// Every block in order: what a walk through a tier reads ahead.
void begin_in_order(BlockAccess* tier, int nblocks) {
  if (!tier) return;
  std::vector<int> order(nblocks);
  for (int b = 0; b < nblocks; ++b) order[b] = b;
  tier->begin_walk(std::move(order));
}

}  // namespace

void Model::round_to(DType dtype, BlockAccess* tier) {
  if (tier && dtype != DType::F32 && !(dtype == DType::BF16 && storage_dtype_ == DType::BF16)) {
    // Block by block through the tier: the same rounding of each block's span.
    begin_in_order(tier, (int)blocks_.size());
    for (int b = 0; b < (int)blocks_.size(); ++b) {
      HeldBlock held(tier, b);
      const Block& blk = blocks_[b];
      if (storage_dtype_ == DType::BF16) {
        uint16_t* h = storage16_.data() + blk.offset;
#pragma omp parallel for schedule(static) if (blk.span > (int64_t(1) << 16))
        for (int64_t i = 0; i < blk.span; ++i)
          h[i] = f32_to_bf16(f16_to_f32(f32_to_f16(bf16_to_f32(h[i]))));
      } else {
        float* w = storage_.data() + blk.offset;
        const bool bf = dtype == DType::BF16;
#pragma omp parallel for schedule(static) if (blk.span > (int64_t(1) << 16))
        for (int64_t i = 0; i < blk.span; ++i)
          w[i] = bf ? bf16_round(w[i]) : f16_to_f32(f32_to_f16(w[i]));
      }
      held.done(true);
    }
    return;
  }
  if (dtype == DType::F32) return;
  if (storage_dtype_ == DType::BF16) {
    if (dtype == DType::BF16) return;  // every value is one already
    // A bf16 value rounded to f16 is a bf16 value again: 8 significant bits fit f16's 11;
    // below f16's normal range the result is k 2^-24 with k <= 128, or the value unchanged
    // (a bf16 value of 2^-17 or more is a multiple of 2^-24 already); overflow is inf. In place.
    const int64_t n = storage_size_;
    uint16_t* h = storage16_.data();
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i)
      h[i] = f32_to_bf16(f16_to_f32(f32_to_f16(bf16_to_f32(h[i]))));
    return;
  }
  const int64_t n = (int64_t)storage_.size();
  float* w = storage_.data();
  const bool bf = dtype == DType::BF16;
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i)
    w[i] = bf ? bf16_round(w[i]) : f16_to_f32(f32_to_f16(w[i]));
}

void Model::set_storage_dtype(DType t) {
  ZOF_CHECK(t == DType::F32 || t == DType::BF16,
            std::string("a model is held in fp32 or bf16, not ") + dtype_name(t));
  if (t == storage_dtype_) return;
  const int64_t n = storage_size_;
  if (t == DType::BF16) {
    StorageVector<uint16_t>(n).swap(storage16_);
    const float* w = storage_.data();
    uint16_t* h = storage16_.data();
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(w[i]);
    StorageVector<float>().swap(storage_);
  } else {
    StorageVector<float>(n).swap(storage_);
    const uint16_t* h = storage16_.data();
    float* w = storage_.data();
#pragma omp parallel for schedule(static) if (n > (int64_t(1) << 16))
    for (int64_t i = 0; i < n; ++i) w[i] = bf16_to_f32(h[i]);
    StorageVector<uint16_t>().swap(storage16_);
  }
  storage_dtype_ = t;
  set_param_pointers();
}

void Model::set_param_pointers() {
  for (Param& p : params_)
    p.data = storage_dtype_ == DType::F32 && !storage_.empty() ? storage_.data() + p.offset
                                                                : nullptr;
}

void Model::allocate_storage() {
  // Fresh pages (zeros, none resident until written), never a fill.
  if (storage_dtype_ == DType::BF16) {
    StorageVector<float>().swap(storage_);
    StorageVector<uint16_t>(storage_size_).swap(storage16_);
  } else {
    StorageVector<uint16_t>().swap(storage16_);
    StorageVector<float>(storage_size_).swap(storage_);
  }
  set_param_pointers();
}

void* storage_pages(size_t bytes) {
  if (bytes == 0) bytes = 1;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ZOF_CHECK(p != MAP_FAILED, "out of memory: cannot map " + std::to_string(bytes) +
                                 " bytes for the weights (" + std::strerror(errno) + ")");
  return p;
}

void free_storage_pages(void* p, size_t bytes) {
  if (p) ::munmap(p, bytes == 0 ? 1 : bytes);
}

float* Model::storage() {
  ZOF_ASSERT(storage_dtype_ == DType::F32);
  return storage_.data();
}
const float* Model::storage() const {
  ZOF_ASSERT(storage_dtype_ == DType::F32);
  return storage_.data();
}
uint16_t* Model::storage_bf16() {
  ZOF_ASSERT(storage_dtype_ == DType::BF16);
  return storage16_.data();
}
const uint16_t* Model::storage_bf16() const {
  ZOF_ASSERT(storage_dtype_ == DType::BF16);
  return storage16_.data();
}
void* Model::storage_ptr() const {
  return storage_dtype_ == DType::BF16 ? (void*)storage16_.data() : (void*)storage_.data();
}
void* Model::param_ptr(int pi) const {
  return static_cast<char*>(storage_ptr()) + params_[pi].offset * (int64_t)dtype_size(storage_dtype_);
}

namespace {
bool bf16_non_finite(uint16_t h) { return (h & 0x7F80u) == 0x7F80u; }
bool any_non_finite_bf16(const uint16_t* x, int64_t n) {
  bool any = false;
  for (int64_t i = 0; i < n; ++i) any |= bf16_non_finite(x[i]);
  return any;
}
}  // namespace

Model::NonFinite Model::find_non_finite_in(int64_t from, int64_t n) const {
  constexpr int64_t kChunk = int64_t(1) << 16;
  const bool half = storage_dtype_ == DType::BF16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int any = 0;
#pragma omp parallel for schedule(static) reduction(| : any) if (chunks > 8)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t m = std::min(kChunk, n - c * kChunk), at = from + c * kChunk;
    any |= (half ? any_non_finite_bf16(storage16_.data() + at, m)
                 : any_non_finite(storage_.data() + at, m))
               ? 1
               : 0;
  }
  if (!any) return NonFinite{};
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    if (p.offset + p.numel <= from || p.offset >= from + n) continue;
    if (half) {
      const uint16_t* h = storage16_.data() + p.offset;
      for (int64_t j = 0; j < p.numel; ++j)
        if (bf16_non_finite(h[j])) return NonFinite{(int)i, j, bf16_to_f32(h[j])};
      continue;
    }
    if (!any_non_finite(p.data, p.numel)) continue;
    for (int64_t j = 0; j < p.numel; ++j)
      if (any_non_finite(p.data + j, 1)) return NonFinite{(int)i, j, p.data[j]};
  }
  return NonFinite{};  // only padding (never written) could hold one
}

Model::NonFinite Model::find_non_finite(BlockAccess* tier,
                                        const std::function<void(int)>& while_held) const {
  if (!tier && !while_held) return find_non_finite_in(0, storage_size_);
  // Through the tier: each block's span while it is held (the gaps between blocks are padding).
  begin_in_order(tier, (int)blocks_.size());
  for (int b = 0; b < (int)blocks_.size(); ++b) {
    HeldBlock held(tier, b);
    if (while_held) while_held(b);
    const NonFinite r = find_non_finite_in(blocks_[b].offset, blocks_[b].span);
    held.done(false);
    if (r.param >= 0) return r;
  }
  return NonFinite{};
}

std::string Model::fingerprint(BlockAccess* tier) const {
  const bool half = storage_dtype_ == DType::BF16;
  FingerprintStream fs;
  if (!tier && !half) {
    fs.feed(0, storage_.data(), storage_size_);
    return fs.finish(storage_size_, half);
  }
  // Block by block (the gaps between blocks are padding, zeros), a bf16 master's values as fp32
  // a piece at a time: the hash of fp32 storage holding them.
  begin_in_order(tier, (int)blocks_.size());
  std::vector<float> wide;
  for (int b = 0; b < (int)blocks_.size(); ++b) {
    HeldBlock held(tier, b);
    const Block& blk = blocks_[b];
    if (!half) {
      fs.feed(blk.offset, storage_.data() + blk.offset, blk.span);
      held.done(false);
      continue;
    }
    constexpr int64_t kPiece = FingerprintStream::kChunk * 4;
    for (int64_t i = 0; i < blk.span; i += kPiece) {
      const int64_t m = std::min(kPiece, blk.span - i);
      wide.resize(size_t(m));
      const uint16_t* h = storage16_.data() + blk.offset + i;
#pragma omp parallel for schedule(static) if (m > (int64_t(1) << 16))
      for (int64_t j = 0; j < m; ++j) wide[j] = bf16_to_f32(h[j]);
      fs.feed(blk.offset + i, wide.data(), m);
    }
    held.done(false);
  }
  return fs.finish(storage_size_, half);
}

void Model::build_layout(bool allocate) {
  params_.clear();
  blocks_.clear();
  int64_t offset = 0;
  std::vector<int64_t> offsets;
  for (auto& [bname, specs] : layout(cfg_)) {
    Block blk{bname, {}, 0};
    for (auto& s : specs) {
      Param p;
      p.name = s.name;
      p.shape = s.shape;
      p.decay = s.decay;
      p.transposed = s.transposed;
      // Matrix-product weights: every matrix but the token and position tables (gathered; a
      // tied LM head is read through lm_head()).
      p.gemm = s.shape.size() == 2 && !s.gathered;
      p.numel = 1;
      for (auto d : s.shape) p.numel *= d;
      blk.params.push_back((int)params_.size());
      blk.numel += p.numel;
      offsets.push_back(offset);
      // Keep every tensor 16-float (64-byte) aligned relative to the storage start.
      offset += (p.numel + 15) / 16 * 16;
      params_.push_back(std::move(p));
    }
    blocks_.push_back(std::move(blk));
  }
  storage_size_ = offset;
  by_name_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].offset = offsets[i];
    by_name_[params_[i].name] = (int)i;
  }
  if (allocate) allocate_storage();
  int64_t end = 0;
  for (auto& b : blocks_) {
    if (b.params.empty()) {  // e.g. an OPT head with neither final norm nor projections
      b.offset = end;
      b.span = 0;
      continue;
    }
    b.offset = offsets[b.params.front()];
    const auto& last = params_[b.params.back()];
    b.span = offsets[b.params.back()] + last.numel - b.offset;
    end = b.offset + b.span;
  }
}

int64_t Model::num_params() const {
  int64_t n = 0;
  for (auto& p : params_) n += p.numel;
  return n;
}

int Model::index(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

const float* Weight::f32() const {
  ZOF_ASSERT(!p || dtype == DType::F32);
  return static_cast<const float*>(p);
}

Model::ParamLocator Model::in_copy(const float* base, int block) const {
  return [this, base, block](int i) -> Weight {
    return base + params_[i].offset - blocks_[block].offset;
  };
}

int Model::token_table() const {
  return blocks_.empty() ? -1 : blocks_.front().params.front();  // first in every family
}

int Model::lm_head() const { return cfg_.tie_embeddings ? token_table() : index(kLmHead); }

Model Model::load_layout(const std::string& dir, DType storage) {
  ZOF_CHECK(storage == DType::F32 || storage == DType::BF16,
            std::string("a model is held in fp32 or bf16, not ") + dtype_name(storage));
  if (gguf::is_file_path(dir)) {
    Model m = load_gguf_layout(dir);
    m.storage_dtype_ = storage;
    return m;
  }
  check_model_dir("", dir);
  Model m;
  m.source_ = dir;
  m.cfg_ = ModelConfig::load((fs::path(dir) / "config.json").string());
  auto archive = safetensors::Archive::open_dir(dir);
  check_config_against_weights(m.cfg_, archive, dir);
  m.build_layout(false);
  // The file's dtype, from the headers (what read_weights returns): bf16 or f16 where any of
  // the tensors read is.
  bool any_bf16 = false, any_f16 = false;
  for (const Param& p : m.params_) {
    const safetensors::TensorInfo* t = archive.find(name_in_files(archive, m.cfg_, p.name));
    if (!t) continue;  // read_weights names it
    any_bf16 |= t->dtype == DType::BF16;
    any_f16 |= t->dtype == DType::F16;
  }
  m.stored_dtype_ = any_bf16 ? DType::BF16 : any_f16 ? DType::F16 : DType::F32;
  m.storage_dtype_ = storage;
  return m;
}

Model Model::load_unread(const std::string& dir, DType storage) {
  Model m = load_layout(dir, storage);
  m.allocate_storage();
  return m;
}

bool Model::is_gguf(const std::string& path) { return gguf::is_file_path(path); }

Model Model::load(const std::string& dir, DType storage) {
  Model m = load_unread(dir, storage);
  m.stored_dtype_ = m.read_weights(dir);
  return m;
}

DType Model::read_weights(const std::string& dir, BlockAccess* tier, std::string* fingerprint,
                          DType fingerprint_as) {
  ZOF_ASSERT(storage_size_ > 0 && (!storage_.empty() || !storage16_.empty()));
  if (gguf::is_file_path(dir)) {
    ZOF_ASSERT(!tier);  // a GGUF file is read whole (the trainer moves its blocks out after)
    const DType t = read_gguf_weights(dir);
    if (fingerprint) {
      ZOF_ASSERT(fingerprint_as == storage_dtype_);
      *fingerprint = this->fingerprint();
    }
    return t;
  }
  auto archive = safetensors::Archive::open_dir(dir);
  bool any_bf16 = false, any_f16 = false;
  std::vector<float> wide, as_fp;
  FingerprintStream fs;
  const bool half = storage_dtype_ == DType::BF16;
  constexpr int64_t kLoadPiece = int64_t(1) << 20;  // elements converted at a time
  // Block by block: each held through the tier (every byte of its tensors written) while read.
  // No read-ahead: every block is written whole, so nothing of the store is read.
  if (tier) tier->begin_walk({});
  for (int b = 0; b < (int)blocks_.size(); ++b) {
    HeldBlock held(tier, b, /*overwrite=*/true);
    for (int pi : blocks_[b].params) {
      Param& p = params_[pi];
      std::vector<int64_t> file_shape = p.shape;
      if (p.transposed) std::swap(file_shape[0], file_shape[1]);
      const auto& t = archive.require(name_in_files(archive, cfg_, p.name), file_shape);
      any_bf16 |= t.dtype == DType::BF16;
      any_f16 |= t.dtype == DType::F16;
      // A piece at a time (a transposed tensor whole): into the storage, the file's pages of
      // the piece given back, the values fed to the fingerprint as a model held in
      // fingerprint_as holds them.
      const int64_t piece = p.transposed ? std::max<int64_t>(p.numel, 1) : kLoadPiece;
      for (int64_t at = 0; at < p.numel; at += piece) {
        const int64_t m = std::min(piece, p.numel - at);
        float* values = p.data ? p.data + at : nullptr;  // as read, in fp32
        if (half) {
          wide.resize(size_t(m));
          values = wide.data();
        }
        if (p.transposed)
          load_tensor(t, p, values);
        else
          safetensors::to_f32(t, values, at, m);
        safetensors::release_pages(t, at, m);
        if (half) {
          uint16_t* h = storage16_.data() + p.offset + at;
          for (int64_t j = 0; j < m; ++j) {
            h[j] = f32_to_bf16(values[j]);
            // A finite weight past bf16's largest (3.39e38) would become inf: say so, not
            // "damaged".
            if (std::isfinite(values[j]) && !std::isfinite(bf16_to_f32(h[j]))) {
              char v[32];
              std::snprintf(v, sizeof v, "%g", (double)values[j]);
              throw Error("tensor " + p.name + " in " + t.file + " holds " + v + " at element " +
                          std::to_string(at + j) + ", beyond bf16's range (3.39e38): a bf16 "
                          "master cannot hold it; fine-tune this model with --master fp32");
            }
          }
        }
        if (!fingerprint) continue;
        if (fingerprint_as == DType::BF16) {
          as_fp.resize(size_t(m));
          for (int64_t j = 0; j < m; ++j) as_fp[j] = bf16_round(values[j]);
          values = as_fp.data();
        }
        fs.feed(p.offset + at, values, m);
      }
    }
    // A NaN or an infinity in the weights makes every loss NaN (or a perplexity that means
    // nothing): refused here, for every command.
    if (const NonFinite bad = find_non_finite_in(blocks_[b].offset, blocks_[b].span);
        bad.param >= 0) {
      const Param& p = params_[bad.param];
      const safetensors::TensorInfo* t = archive.find(p.name);
      throw Error("tensor " + p.name + " in " + (t ? t->file : weights_file(dir)) + " holds " +
                  (std::isnan(bad.value) ? std::string("NaN") : bad.value > 0 ? "+Inf" : "-Inf") +
                  " at element " + std::to_string(bad.index) + " (of " +
                  std::to_string(p.numel) + "); the weights are damaged: re-download or "
                  "re-export the model");
    }
    held.done(true);
  }
  if (fingerprint) *fingerprint = fs.finish(storage_size_, fingerprint_as == DType::BF16);
  return any_bf16 ? DType::BF16 : any_f16 ? DType::F16 : DType::F32;
}

Model Model::zeros(const ModelConfig& cfg, bool with_storage, DType storage) {
  ZOF_CHECK(storage == DType::F32 || storage == DType::BF16,
            std::string("a model is held in fp32 or bf16, not ") + dtype_name(storage));
  Model m;
  m.cfg_ = cfg;
  m.source_ = "zeros";
  m.storage_dtype_ = storage;
  m.build_layout(with_storage);
  return m;
}

Model Model::random(const ModelConfig& cfg, uint64_t seed, DType storage) {
  Model m = zeros(cfg, true, storage);
  m.source_ = "random";
  // Each tensor from its own generator (seeded by its index): tensors in parallel, the same
  // values at any thread count.
  const int64_t np = (int64_t)m.params_.size();
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < np; ++i) {
    auto& p = m.params_[i];
    std::mt19937_64 rng(seed * 1000003u + (uint64_t)i);
    std::normal_distribution<float> nd(0.f, 0.02f);
    const bool is_norm = !p.decay && p.shape.size() == 1 && p.name.find("bias") == std::string::npos;
    // A norm's scale is 1: w = 1, or w = 0 where the norm scales by (w + 1) (Gemma).
    const float one = 1.f - m.cfg_.norm_offset;
    if (storage == DType::F32) {
      for (int64_t j = 0; j < p.numel; ++j) p.data[j] = p.decay ? nd(rng) : (is_norm ? one : 0.f);
      continue;
    }
    uint16_t* h = m.storage16_.data() + p.offset;  // the same values, rounded, in 2 bytes
    for (int64_t j = 0; j < p.numel; ++j) h[j] = f32_to_bf16(p.decay ? nd(rng) : (is_norm ? one : 0.f));
  }
  return m;
}

void Model::save(const std::string& out_dir, DType dtype, BlockAccess* tier,
                 uint64_t max_shard_bytes) const {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  ZOF_CHECK(!ec, "cannot create output directory " + out_dir + ": " + ec.message());
  // Each tensor's data as its turn comes (safetensors::OpenTensor): its block held through the
  // tier while its tensors are written, a transposed copy of one tensor at a time.
  const bool half = storage_dtype_ == DType::BF16;
  std::vector<safetensors::TensorOut> out;
  for (const Param& p : params_) {
    safetensors::TensorOut t{p.name, dtype, p.shape, nullptr};
    if (p.transposed) t.shape = {p.shape[1], p.shape[0]};  // (out, in) -> file (in, out)
    out.push_back(std::move(t));
  }
  TensorBlocks held(*this, tier);
  std::vector<float> transposed;
  std::vector<uint16_t> transposed16;
  auto open = [&](size_t pi, safetensors::TensorOut& t) {
    const Param& p = params_[pi];
    held.hold((int)pi);
    if (half)
      t.bf16 = storage16_.data() + p.offset;
    else
      t.data = p.data;
    if (!p.transposed) return;
    const int64_t rows = p.shape[0], cols = p.shape[1];
    if (half) {
      transposed16.resize(size_t(p.numel));
      for (int64_t i = 0; i < cols; ++i)
        for (int64_t o = 0; o < rows; ++o) transposed16[i * rows + o] = t.bf16[o * cols + i];
      t.bf16 = transposed16.data();
    } else {
      transposed.resize(size_t(p.numel));
      for (int64_t i = 0; i < cols; ++i)
        for (int64_t o = 0; o < rows; ++o) transposed[i * rows + o] = p.data[o * cols + i];
      t.data = transposed.data();
    }
  };
  // Shards in tensor order, each up to max_shard_bytes (a larger tensor alone).
  std::vector<size_t> first{0};  // each shard's first tensor
  uint64_t total = 0, in_shard = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t bytes = dtype_size(dtype);
    for (int64_t d : out[i].shape) bytes *= (uint64_t)d;
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      first.push_back(i);
      in_shard = 0;
    }
    in_shard += bytes;
    total += bytes;
  }
  const size_t shards = first.size();
  first.push_back(out.size());
  if (shards == 1) {
    safetensors::write((fs::path(out_dir) / "model.safetensors").string(), out,
                       {{"format", "pt"}}, open);
  } else {
    nlohmann::json map = nlohmann::json::object();
    for (size_t k = 0; k < shards; ++k) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards);
      const std::vector<safetensors::TensorOut> part(out.begin() + (ptrdiff_t)first[k],
                                                     out.begin() + (ptrdiff_t)first[k + 1]);
      safetensors::write((fs::path(out_dir) / name).string(), part, {{"format", "pt"}},
                         [&](size_t i, safetensors::TensorOut& t) { open(first[k] + i, t); });
      for (const auto& t : part) map[t.name] = name;
    }
    const nlohmann::json index{{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    write_file_atomic(fs::path(out_dir) / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  held.done();
  nlohmann::json cfg = cfg_.raw;
  if (cfg.contains("dtype")) cfg["dtype"] = dtype_torch_name(dtype);
  cfg["torch_dtype"] = dtype_torch_name(dtype);
  const auto path = fs::path(out_dir) / "config.json";
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp);
    ZOF_CHECK(f.good(), "cannot write " + tmp);
    f << cfg.dump(2) << "\n";
    ZOF_CHECK(f.good(), "cannot write " + tmp);
  }
  fs::rename(tmp, path, ec);
  ZOF_CHECK(!ec, "cannot rename " + tmp + " to " + path.string() + ": " + ec.message());
}

EmbedWeights Model::embed() const {
  return embed([this](int i) { return weight(i); });
}

EmbedWeights Model::embed(const float* base) const { return embed(in_copy(base, 0)); }

EmbedWeights Model::embed(const ParamLocator& b) const {
  return view_of(family(cfg_).embed, blocks_.front(), b);
}

LayerWeights Model::layer(int i) const {
  return layer(i, [this](int k) { return weight(k); });
}

LayerWeights Model::layer(int i, const float* base) const { return layer(i, in_copy(base, i + 1)); }

LayerWeights Model::layer(int i, const ParamLocator& b) const {
  return view_of(family(cfg_).layer, blocks_[i + 1], b);
}

HeadWeights Model::head() const {
  return head([this](int i) { return weight(i); });
}

HeadWeights Model::head(const float* base, const float* tied_tokens) const {
  const ParamLocator in_head = in_copy(base, (int)blocks_.size() - 1);
  const int tok = token_table();
  return head([&](int i) -> Weight {
    return cfg_.tie_embeddings && i == tok ? Weight(tied_tokens) : in_head(i);
  });
}

HeadWeights Model::head(const ParamLocator& b) const {
  HeadWeights w = view_of(family(cfg_).head, blocks_.back(), b);
  if (cfg_.tie_embeddings) w.lm_head = b(token_table());  // in the embedding's block
  return w;
}

}  // namespace zof
