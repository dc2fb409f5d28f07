// A Hugging Face causal LM held in fp32 (or, for a bf16 master, in bf16: 2 bytes a parameter): its parameters, grouped into blocks (embedding,
// transformer layers, head), which are the unit of loading, streaming and perturbation.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zof/config.h"
#include "zof/dtype.h"

namespace zof {

struct Param {
  std::string name;             // Hugging Face tensor name
  std::vector<int64_t> shape;   // as zof holds it: Linear weights (out, in)
  bool transposed = false;      // file holds the transpose (GPT-2 Conv1D (in, out))
  bool decay = true;            // weight decay applies (false for norms and biases)
  // A matrix product's weight (every Linear, OPT's projections, an untied LM head; not the
  // token or position tables, norms or biases): what a bf16 walk reads in bf16.
  bool gemm = false;
  float* data = nullptr;        // into Model's storage when it is fp32 (null when bf16)
  int64_t offset = 0;           // elements from the start of Model's storage
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

// A weight as the primal walks read it: its memory and element type. fp32 everywhere but in a
// bf16 walk's matrix-product weights (Param::gemm), which are bf16 copies; a const float*
// converts to it. at(i) is element i (the Phi-3 views into fused tensors).
struct Weight {
  const void* p = nullptr;
  DType dtype = DType::F32;
  Weight() = default;
  Weight(const float* f) : p(f) {}  // NOLINT(google-explicit-constructor): fp32 views
  Weight(const void* q, DType t) : p(q), dtype(t) {}
  explicit operator bool() const { return p != nullptr; }
  // The fp32 data (null when absent); a bf16 weight here is a walk that forgot to convert.
  const float* f32() const;
  Weight at(int64_t i) const {
    return p ? Weight(static_cast<const char*>(p) + i * (int64_t)dtype_size(dtype), dtype)
             : Weight();
  }
};

// A block's parameters as handles of type W: Weight into the model or a perturbed copy (the
// plain walks), z or a float64 copy (the JVP walk), or a weight paired with its tangent.
// Absent slots are W{} (null). The block graph (src/model/block_graph.h) reads these fields and
// nothing else, so every walk shares one definition of each block.
// Llama: ln1=input_layernorm, ln2=post_attention_layernorm, fc1=gate_proj, up=up_proj,
// fc2=down_proj, q_norm/k_norm=self_attn.q_norm/k_norm (Qwen3, Gemma 3); Gemma:
// ln2=pre_feedforward_layernorm, post_attn_norm=post_attention_layernorm,
// post_ffn_norm=post_feedforward_layernorm; Phi-3: q_w/k_w/v_w point at the
// row ranges q, k, v of self_attn.qkv_proj and fc1_w/up_w at those of mlp.gate_up_proj (views
// into one parameter each, no copies). OPT: ln1=self_attn_layer_norm,
// ln2=final_layer_norm. GPT-2: qkv_w is the fused c_attn (3C, C), transposed on load.
template <class W>
struct LayerT {
  W ln1_w{}, ln1_b{};
  W q_w{}, q_b{}, k_w{}, k_b{}, v_w{}, v_b{}, qkv_w{}, qkv_b{};
  W o_w{}, o_b{};
  W ln2_w{}, ln2_b{};
  W fc1_w{}, fc1_b{}, up_w{}, up_b{};
  W fc2_w{}, fc2_b{};
  W q_norm{}, k_norm{};  // Qwen3, Gemma 3: RMSNorm weights (head_dim) over each head of q and k
  W post_attn_norm{}, post_ffn_norm{};  // Gemma: RMSNorm of the attention and FFN outputs
  // Every slot, for maps over them (zip a weight view with its z, move pointers into a copy).
  static constexpr auto slots() {
    return std::array{&LayerT::ln1_w, &LayerT::ln1_b, &LayerT::q_w,   &LayerT::q_b,
                      &LayerT::k_w,   &LayerT::k_b,   &LayerT::v_w,   &LayerT::v_b,
                      &LayerT::qkv_w, &LayerT::qkv_b, &LayerT::o_w,   &LayerT::o_b,
                      &LayerT::ln2_w, &LayerT::ln2_b, &LayerT::fc1_w, &LayerT::fc1_b,
                      &LayerT::up_w,  &LayerT::up_b,  &LayerT::fc2_w, &LayerT::fc2_b,
                      &LayerT::q_norm, &LayerT::k_norm, &LayerT::post_attn_norm,
                      &LayerT::post_ffn_norm};
  }
};
template <class W>
struct EmbedT {
  W tokens{};      // (V, E), E = word_embed_proj_dim (OPT) or hidden
  W positions{};   // (P, C) learned positions (OPT: P = max_pos + 2)
  W project_in{};  // OPT (C, E)
  static constexpr auto slots() {
    return std::array{&EmbedT::tokens, &EmbedT::positions, &EmbedT::project_in};
  }
};
template <class W>
struct HeadT {
  W norm_w{}, norm_b{};  // final norm (absent for OPT-350m)
  W project_out{};       // OPT (E, C)
  W lm_head{};           // (V, E); == tokens when tied
  static constexpr auto slots() {
    return std::array{&HeadT::norm_w, &HeadT::norm_b, &HeadT::project_out, &HeadT::lm_head};
  }
};
// The view with f applied to every slot: map_slots(w, f) has slot s = f(w.s).
template <template <class> class View, class A, class F>
auto map_slots(const View<A>& w, F f) {
  using R = decltype(f(A{}));
  View<R> out;
  constexpr auto in = View<A>::slots();
  constexpr auto to = View<R>::slots();
  for (size_t i = 0; i < in.size(); ++i) out.*to[i] = f(w.*in[i]);
  return out;
}
// Two views slot by slot: zip_slots(a, b, f) has slot s = f(a.s, b.s).
template <template <class> class View, class A, class B, class F>
auto zip_slots(const View<A>& a, const View<B>& b, F f) {
  using R = decltype(f(A{}, B{}));
  View<R> out;
  constexpr auto sa = View<A>::slots();
  constexpr auto sb = View<B>::slots();
  constexpr auto to = View<R>::slots();
  for (size_t i = 0; i < sa.size(); ++i) out.*to[i] = f(a.*sa[i], b.*sb[i]);
  return out;
}
using LayerWeights = LayerT<Weight>;
using EmbedWeights = EmbedT<Weight>;
using HeadWeights = HeadT<Weight>;
// slots() lists every field (a field left out would be dropped by map_slots/zip_slots).
static_assert(sizeof(LayerWeights) == LayerWeights::slots().size() * sizeof(Weight));
static_assert(sizeof(EmbedWeights) == EmbedWeights::slots().size() * sizeof(Weight));
static_assert(sizeof(HeadWeights) == HeadWeights::slots().size() * sizeof(Weight));

// Memory straight from the system (anonymous mmap) for the weights: pages that are never written
// are never resident, so a model held in a disk tier (disk_tier.h) can be laid out whole while
// only its blocks in RAM take memory; and resize() leaves the system's zeros untouched instead
// of writing them (a value-initializing vector would touch every page).
void* storage_pages(size_t bytes);               // zof::Error (out of memory) on failure
void free_storage_pages(void* p, size_t bytes);  // the pages go back to the system
template <class T>
struct StorageAllocator {
  using value_type = T;
  StorageAllocator() = default;
  template <class U>
  StorageAllocator(const StorageAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) { return static_cast<T*>(storage_pages(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { free_storage_pages(p, n * sizeof(T)); }
  template <class U>
  void construct(U* p) noexcept {  // default-initialized: the zeros as the system gave them
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const StorageAllocator<U>&) const noexcept { return true; }
};
template <class T>
using StorageVector = std::vector<T, StorageAllocator<T>>;

// Who holds a model's blocks in host memory when the storage is not all resident: the disk
// tier (disk_tier.h) keeps some blocks in a file and brings each back while it is acquired. A
// reader or writer of a block's span acquires it first and releases it after; overwrite: every
// byte of the span will be written before any is read (nothing is read from the file);
// changed: the span was written. begin_walk gives the coming order (what is read ahead).
// Model's methods that take one (null: the storage is whole and resident) go block by block, so
// a model larger than RAM is loaded, checked, fingerprinted, rounded and saved through it.
class BlockAccess {
 public:
  virtual ~BlockAccess() = default;
  virtual void begin_walk(std::vector<int> order) = 0;
  virtual void acquire(int block, bool overwrite) = 0;
  virtual void release(int block, bool changed) = 0;
};

class Model {
 public:
  // Loads DIR/config.json and DIR's safetensors; validates every tensor the architecture needs.
  // DIR may instead be a GGUF file of llama.cpp's llama architecture: the config its metadata
  // make, each tensor dequantized to fp32 (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K) with
  // the q/k rows in Hugging Face's order (src/model/model_gguf.cpp).
  // storage: how the weights are held, F32, or BF16 (each tensor rounded to nearest even as it
  // is read, never held whole in fp32: a bf16 master of a model twice the memory's size in fp32).
  static Model load(const std::string& dir, DType storage = DType::F32);
  // DIR's config and weights checked as load() checks them, nothing read or allocated: a model
  // with its layout only (no storage), to compare a checkpoint with the model it goes into.
  // storage: the type the layout says the weights would be held in (storage_dtype(); nothing is
  // allocated), for sizes such as DiskTier::all_bytes.
  static Model load_layout(const std::string& dir, DType storage = DType::F32);
  // load_layout's model with its storage (of type `storage`) laid out and nothing read: the
  // system's untouched zeros, none resident until written. read_weights fills it (through a
  // disk tier: a model larger than RAM).
  static Model load_unread(const std::string& dir, DType storage);
  // Whether load() reads `path` as a GGUF file (else a Hugging Face directory).
  static bool is_gguf(const std::string& path);
  // DIR's tensors read into this model's storage, in its type (as load(dir, storage_dtype())
  // holds them), one tensor at a time, each found by name and shape as load() finds it; a NaN
  // or infinity refused as load() refuses it (the weights are then partly overwritten: discard
  // the model). Returns the file's dtype (what stored_dtype() reports after load(); this
  // model's is left as it was).
  // tier: each block acquired (to be overwritten) while its tensors are read, and released as
  // changed; fingerprint (optional): fingerprint() of the weights as read, held in type
  // `fingerprint_as` (F32: the file's values; BF16: rounded), taken as they pass.
  DType read_weights(const std::string& dir, BlockAccess* tier = nullptr,
                     std::string* fingerprint = nullptr, DType fingerprint_as = DType::F32);
  // A model of this config with random weights (normal, std 0.02; norms 1, biases 0): for
  // benchmarks and tests. In bf16 storage: the fp32 values rounded to nearest even.
  static Model random(const ModelConfig& cfg, uint64_t seed, DType storage = DType::F32);
  // A model of this config with storage of zeros in type `storage` (with_storage), or its layout
  // only (names, shapes and offsets, no storage): what a tensor-parallel rank fills with its
  // slice, and the plan that says where each parameter sits, without drawing weights it throws
  // away. The zeros are the system's untouched pages: none is resident until written (a model
  // far larger than RAM, filled block by block into a disk tier: bench/disk_bench.cpp).
  static Model zeros(const ModelConfig& cfg, bool with_storage = true,
                     DType storage = DType::F32);

  Model() = default;
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Writes out_dir/config.json and out_dir/model.safetensors in dtype (default: as loaded),
  // atomically, in Hugging Face layout (tied LM head omitted, GPT-2 Conv1D transposed back).
  // tier: read block by block through it (its whole span is never resident at once).
  // Weights of more than max_shard_bytes (Hugging Face's save_pretrained default, 5 GB) are
  // written as shards, as save_pretrained writes them: model-0000i-of-0000n.safetensors, each
  // at most that size (a larger tensor alone), and model.safetensors.index.json mapping every
  // tensor to its shard (written last: the directory is a model once it is there).
  static constexpr uint64_t kMaxShardBytes = 5'000'000'000;
  void save(const std::string& out_dir, DType dtype, BlockAccess* tier = nullptr,
            uint64_t max_shard_bytes = kMaxShardBytes) const;
  // Writes the file `path` as a GGUF that llama.cpp loads (a plain LLaMA): the matrices in dtype
  // (F32, F16 or BF16), the norms in F32 (as llama.cpp's converter writes them), the q/k rows in
  // llama.cpp's order, atomically. The metadata: base's when base (the model this one was loaded
  // from) is a GGUF file; else llama.* from the config and tokenizer.ggml.* from base's
  // tokenizer.json. zof::Error, before anything is written, for what GGUF cannot express.
  // tier: read block by block through it (a disk tier).
  void save_gguf(const std::string& path, DType dtype, const std::string& base,
                 BlockAccess* tier = nullptr) const;
  // The refusals of save_gguf(path, dtype, base), nothing written: a run checks before it starts.
  void check_gguf_save(const std::string& base) const;
  // Every weight rounded to dtype's nearest value (nearest even; F32 changes nothing), held in
  // the storage's type again: the weights save(dtype) writes, for evaluating what is saved (bf16
  // storage stays bf16: a bf16 value rounded to f16 is a bf16 value).
  void round_to(DType dtype, BlockAccess* tier = nullptr);
  // How the weights are held: F32, or BF16 (a bf16 master, --master bf16). Converting to BF16
  // rounds to nearest even; to F32 is exact. Views and pointers taken before are invalid after.
  DType storage_dtype() const { return storage_dtype_; }
  void set_storage_dtype(DType t);

  const ModelConfig& config() const { return cfg_; }
  DType stored_dtype() const { return stored_dtype_; }
  const std::string& source() const { return source_; }
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  int64_t num_params() const;  // parameters (not counting alignment padding)
  // The first NaN or infinity in the weights: its parameter's index into params() and its
  // element index there (param -1: every value is finite). One parallel pass over storage().
  struct NonFinite {
    int param = -1;
    int64_t index = -1;
    float value = 0;
  };
  // while_held: called with each block's index while the tier holds it (its bytes present), in
  // the same pass (a checkpoint hashes the disk tier's blocks as it checks them).
  NonFinite find_non_finite(BlockAccess* tier = nullptr,
                            const std::function<void(int)>& while_held = nullptr) const;
  // A 64-bit hash of the weights' values as fp32 (layout included), computed in 1 MiB chunks
  // in parallel and combined in order, so any thread count gives the same value; as hex,
  // "storage-f32-mix64:<16 digits>", or "storage-bf16-mix64:" when held in bf16 (the same hash
  // of the rounded values: the label says the base was rounded). A run records its base
  // model's in run.json.
  std::string fingerprint(BlockAccess* tier = nullptr) const;
  // Elements of the storage (parameters and alignment padding), whatever its type.
  int64_t storage_size() const { return storage_size_; }
  // The fp32 storage (only when storage_dtype() is F32).
  float* storage();
  const float* storage() const;
  // The bf16 storage (only when storage_dtype() is BF16).
  uint16_t* storage_bf16();
  const uint16_t* storage_bf16() const;
  // Parameter pi where it is held, typed by storage_dtype(); the storage's start.
  void* param_ptr(int pi) const;
  Weight weight(int pi) const { return Weight(param_ptr(pi), storage_dtype_); }
  void* storage_ptr() const;

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
  using ParamLocator = std::function<Weight(int)>;
  EmbedWeights embed(const ParamLocator& at) const;
  LayerWeights layer(int i, const ParamLocator& at) const;
  HeadWeights head(const ParamLocator& at) const;  // tied: lm_head = at(the token table)
  // Index of the token table, and of the LM head's matrix (the same when tied).
  int token_table() const;
  int lm_head() const;

 private:
  // The first non-finite value among the parameters within storage elements [from, from + n).
  NonFinite find_non_finite_in(int64_t from, int64_t n) const;
  // params_ and blocks_ from cfg_, and (allocate) the storage of storage_dtype_, zeroed.
  void build_layout(bool allocate = true);
  // load_layout and read_weights of a GGUF file (model_gguf.cpp).
  static Model load_gguf_layout(const std::string& path);
  DType read_gguf_weights(const std::string& path);
  void allocate_storage();
  void set_param_pointers();  // Param::data from the storage (null without fp32 storage)
  int index(const std::string& name) const;  // -1 when absent
  // A locator into base, a copy of block `block` laid out as in storage().
  ParamLocator in_copy(const float* base, int block) const;

  ModelConfig cfg_;
  DType stored_dtype_ = DType::F32;
  DType storage_dtype_ = DType::F32;
  int64_t storage_size_ = 0;
  StorageVector<uint16_t> storage16_;  // the same, in bf16 (storage_dtype_ BF16; then storage_ empty)
  std::string source_;
  std::vector<Param> params_;
  std::vector<Block> blocks_;
  StorageVector<float> storage_;  // all parameters, contiguous, block by block
  std::unordered_map<std::string, int> by_name_;
};

}  // namespace zof
