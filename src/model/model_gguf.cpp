// Model from and to GGUF, llama.cpp's file: the llama architecture's config, tensor names and q/k
// row order come from hf/gguf_llama.h; here they become a Model (each tensor checked against the
// config before anything is allocated, dequantized to fp32, its rows put in Hugging Face's order)
// and a Model becomes a GGUF file llama.cpp loads.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <set>

#include "hf/gguf.h"
#include "hf/gguf_llama.h"
#include "model/tensor_blocks.h"
#include "zof/error.h"
#include "zof/model.h"

namespace zof {
namespace {

constexpr const char* kFlag = "--save-format gguf";

std::string dims_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// The layers the file holds tensors of: the highest N of "blk.N." plus one.
int64_t layers_in(const gguf::File& f) {
  int64_t layers = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    int64_t i = 0;
    size_t at = 4, digits = 0;
    while (at < t.name.size() && std::isdigit((unsigned char)t.name[at]) && digits < 9)
      i = i * 10 + (t.name[at++] - '0'), ++digits;
    if (digits > 0 && at < t.name.size() && t.name[at] == '.') layers = std::max(layers, i + 1);
  }
  return layers;
}

// The config's sizes against the tensors that show them (GGUF dimensions: the contiguous one
// first), before a layout is built from them: a size the file does not hold is refused naming
// the metadata key.
void check_sizes(const gguf::File& f, const ModelConfig& c) {
  const int64_t layers = layers_in(f);
  if (layers != c.num_layers)
    f.fail("llama.block_count", "is " + std::to_string(c.num_layers) + " but the file holds " +
                                    std::to_string(layers) + " layers' tensors; the file is damaged");
  const int64_t C = c.hidden_size;
  const struct {
    const char* key;
    const char* tensor;
    std::vector<int64_t> dims;
  } shown[] = {
      {"llama.embedding_length and llama.vocab_size", "token_embd.weight", {C, c.vocab_size}},
      {"llama.feed_forward_length", "blk.0.ffn_gate.weight", {C, c.intermediate_size}},
      {"llama.attention.head_count", "blk.0.attn_q.weight", {C, c.num_heads * c.head_dim}},
      {"llama.attention.head_count_kv", "blk.0.attn_k.weight", {C, c.num_kv_heads * c.head_dim}},
  };
  for (const auto& s : shown) {
    const gguf::TensorInfo* t = f.tensor(s.tensor);
    if (!t)
      f.fail(std::string("tensor ") + s.tensor,
             "is missing; the file is damaged or not a complete llama model");
    if (t->dims != s.dims)
      f.fail(s.key, "make tensor " + std::string(s.tensor) + " " + dims_str(s.dims) +
                        ", but the file holds it as " + dims_str(t->dims) + "; the file is damaged");
  }
}

// The tensor of parameter p, checked again (the file may have changed since the layout was
// read): present, of p's shape, of a type zof dequantizes.
const gguf::TensorInfo& tensor_of(const gguf::File& f, const Param& p, const ModelConfig& c) {
  const std::string g = gguf::llama_tensor_name(p.name);
  ZOF_ASSERT(!g.empty());
  const gguf::TensorInfo* t = f.tensor(g);
  if (!t)
    f.fail("tensor " + g, "is missing (the model's " + p.name +
                              "); the file is damaged or not a complete llama model");
  if (t->shape() != p.shape)
    f.fail("tensor " + g, "has shape " + dims_str(t->shape()) + " but the metadata make " +
                              dims_str(p.shape) + "; the file is damaged");
  const gguf::TypeTraits* tt = gguf::type_traits(static_cast<uint32_t>(t->type));
  if (!tt->readable)
    f.fail("tensor " + g, std::string("is ") + tt->name + ", which zof does not dequantize (it reads " +
                              gguf::readable_type_names() + "): requantize the model to one of "
                              "them with llama.cpp's llama-quantize, or give zof its Hugging "
                              "Face directory");
  if (const int64_t heads = gguf::llama_permuted_heads(p.name, c);
      heads && p.shape[0] % (2 * heads))
    f.fail("tensor " + g, std::to_string(p.shape[0]) + " rows are not " + std::to_string(heads) +
                              " heads of an even size: llama.cpp's q/k row order cannot be undone");
  return *t;
}

// The metadata save_gguf writes for base (a GGUF file, or a Hugging Face directory).
gguf::Metadata metadata_for(const ModelConfig& c, const std::string& base, uint32_t file_type) {
  gguf::check_llama_writable(c, kFlag);
  if (!gguf::is_file_path(base)) return gguf::metadata_from_hf(c, base, file_type, kFlag);
  const gguf::File src = gguf::File::open(base);
  ZOF_CHECK(gguf::llama_config(src) == c.raw,
            std::string(kFlag) + ": " + base + " is not the GGUF file this model was read from "
            "(its metadata make another config), so its metadata cannot describe the model");
  return gguf::metadata_from_gguf(src, file_type);
}

}  // namespace

Model Model::load_gguf_layout(const std::string& path) {
  const gguf::File f = gguf::File::open(path);
  Model m;
  m.source_ = path;
  m.cfg_ = ModelConfig::from_json(gguf::llama_config(f), path);
  check_sizes(f, m.cfg_);
  m.build_layout(false);
  std::set<std::string> wanted;
  for (const Param& p : m.params_) {
    tensor_of(f, p, m.cfg_);
    wanted.insert(gguf::llama_tensor_name(p.name));
  }
  for (const gguf::TensorInfo& t : f.tensors())
    if (!wanted.count(t.name))
      f.fail("tensor " + t.name,
             "is not one of the llama tensors zof reads (e.g. rope_freqs.weight is Llama 3's "
             "RoPE scaling, which zof does not read from GGUF); give zof the model's Hugging "
             "Face directory");
  return m;
}

DType Model::read_gguf_weights(const std::string& path) {
  const gguf::File f = gguf::File::open(path);
  bool any_quant = false, any_bf16 = false, any_f16 = false;
  std::vector<float> wide, rows_hf;
  for (Param& p : params_) {
    const gguf::TensorInfo& t = tensor_of(f, p, cfg_);
    any_bf16 |= t.type == gguf::TensorType::BF16;
    any_f16 |= t.type == gguf::TensorType::F16;
    any_quant |= gguf::type_traits(static_cast<uint32_t>(t.type))->block > 1;
    const int64_t heads = gguf::llama_permuted_heads(p.name, cfg_);
    const bool direct = storage_dtype_ == DType::F32 && !heads;
    float* dst = direct ? p.data : (wide.resize(size_t(p.numel)), wide.data());
    gguf::dequantize(t.type, t.data, p.numel, dst);
    gguf::release_pages(t);
    if (direct) continue;
    const float* hf = dst;
    if (heads) {  // llama.cpp's row order back to Hugging Face's
      const int64_t rows = p.shape[0], cols = p.numel / rows;
      float* out = storage_dtype_ == DType::F32 ? p.data : (rows_hf.resize(size_t(p.numel)), rows_hf.data());
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(dst + gguf::gguf_row_of(r, rows, heads) * cols, cols, out + r * cols);
      if (storage_dtype_ == DType::F32) continue;
      hf = out;
    }
    uint16_t* h = storage16_.data() + p.offset;
    for (int64_t j = 0; j < p.numel; ++j) {
      h[j] = f32_to_bf16(hf[j]);
      if (std::isfinite(hf[j]) && !std::isfinite(bf16_to_f32(h[j]))) {
        char v[32];
        std::snprintf(v, sizeof v, "%g", (double)hf[j]);
        f.fail("tensor " + t.name, std::string("holds ") + v + " at element " + std::to_string(j) +
                                       ", beyond bf16's range (3.39e38): a bf16 master cannot hold "
                                       "it; fine-tune this model with --master fp32");
      }
    }
  }
  if (const NonFinite bad = find_non_finite(); bad.param >= 0) {
    const Param& p = params_[bad.param];
    f.fail("tensor " + gguf::llama_tensor_name(p.name),
           std::string("holds ") +
               (std::isnan(bad.value) ? "NaN" : bad.value > 0 ? "+Inf" : "-Inf") +
               " (element " + std::to_string(bad.index) + " of " + p.name +
               "); the weights are damaged: re-download or re-convert the model");
  }
  // A quantized tensor's values are products of its scales: fp32 holds them exactly.
  return any_quant ? DType::F32 : any_bf16 ? DType::BF16 : any_f16 ? DType::F16 : DType::F32;
}

void Model::check_gguf_save(const std::string& base) const {
  metadata_for(cfg_, base, 0);
  for (const Param& p : params_)
    ZOF_CHECK(!gguf::llama_tensor_name(p.name).empty(),
              std::string(kFlag) + ": tensor " + p.name + " has no name in llama.cpp's llama");
}

void Model::save_gguf(const std::string& path, DType dtype, const std::string& base,
                      BlockAccess* tier) const {
  const gguf::TensorType mt = dtype == DType::BF16  ? gguf::TensorType::BF16
                              : dtype == DType::F16 ? gguf::TensorType::F16
                                                    : gguf::TensorType::F32;
  const gguf::Metadata md = metadata_for(cfg_, base, gguf::file_type_of(mt));
  // Through a tier, the block of the tensor whose rows are asked for is held (the writer asks
  // tensor by tensor, in order: each block is acquired once).
  TensorBlocks held(*this, tier);
  std::vector<gguf::TensorOut> out;
  for (size_t pi = 0; pi < params_.size(); ++pi) {
    const Param& p = params_[pi];
    gguf::TensorOut t;
    t.name = gguf::llama_tensor_name(p.name);
    ZOF_CHECK(!t.name.empty(), std::string(kFlag) + ": tensor " + p.name +
                                   " has no name in llama.cpp's llama");
    // Norms stay F32, as llama.cpp's converter writes them (its kernels read them so).
    t.type = p.shape.size() == 1 ? gguf::TensorType::F32 : mt;
    t.dims.assign(p.shape.rbegin(), p.shape.rend());
    const int64_t heads = gguf::llama_permuted_heads(p.name, cfg_);
    const int64_t rows = p.shape.size() == 2 ? p.shape[0] : 1, cols = p.numel / rows;
    ZOF_CHECK(!heads || rows % (2 * heads) == 0,
              std::string(kFlag) + ": " + p.name + " has " + std::to_string(rows) +
                  " rows, not " + std::to_string(heads) + " heads of an even size");
    const void* base_ptr = param_ptr((int)pi);
    const bool half = storage_dtype_ == DType::BF16;
    t.rows = [=, &held](int64_t first, int64_t n, float* o) {
      held.hold((int)pi);
      for (int64_t r = first; r < first + n; ++r) {
        const int64_t src = heads ? gguf::hf_row_of(r, rows, heads) : r;
        float* dst = o + (r - first) * cols;
        if (half) {
          const uint16_t* h = static_cast<const uint16_t*>(base_ptr) + src * cols;
          for (int64_t j = 0; j < cols; ++j) dst[j] = bf16_to_f32(h[j]);
        } else {
          std::copy_n(static_cast<const float*>(base_ptr) + src * cols, cols, dst);
        }
      }
    };
    out.push_back(std::move(t));
  }
  gguf::write(path, md, out);
  held.done();
}

}  // namespace zof
