// The transformer forward pass written once over the Backend interface, as a walk over blocks:
// embed -> layer 0..L-1 -> head. Each piece takes its weights explicitly, so a caller can run a
// block on perturbed copies (the ZO dual forward) or on weights streamed to a device. Every
// pointer a piece takes is device memory (on the CPU backends: host memory); inputs reach the
// device through upload(), and the whole-model methods copy their results back to the host.
#pragma once
#include <cstdint>
#include <vector>

#include "zof/backend.h"
#include "zof/model.h"

namespace zof {

// A batch of B token sequences in one of two layouts:
//   padded (starts empty): sequence b at rows b*T .., lengths[b] real tokens, then padding;
//   packed (starts set): sequence b at rows starts[b] .. starts[b] + lengths[b] - 1, back to
//     back with no padding (T is then the longest length). Every matrix product runs over real
//     tokens only and attention runs per sequence at its own length, so on the CPU a sequence's
//     values do not depend on what else the batch holds (Backend::matmul: unless a product has
//     one row) or how long the others are: the training walk's layout.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids;      // (rows())
  std::vector<int32_t> lengths;  // (B)
  std::vector<int32_t> starts;   // packed: (B + 1), starts[B] = rows(); padded: empty
  bool packed() const { return !starts.empty(); }
  int64_t rows() const { return packed() ? starts.back() : B * T; }
  // The row of sequence b's token t.
  int64_t row(int64_t b, int64_t t) const { return (packed() ? starts[size_t(b)] : b * T) + t; }
  // Builds a batch from sequences, padding with pad_id. Sequences must be non-empty.
  static Batch from_sequences(const std::vector<std::vector<int32_t>>& seqs, int32_t pad_id = 0);
  // The same sequences packed (a packed batch is returned as it is).
  Batch pack() const;
};

// Keys and values of every layer for incremental decoding. (B, capacity, Hkv, D) per layer.
// A batch's inputs in device memory (the Forward's own buffers, valid until the next upload).
struct DeviceInputs {
  const int32_t* ids = nullptr;        // (rows) token ids, in range
  const int32_t* pos = nullptr;        // (rows) positions (RoPE)
  const int32_t* embed_pos = nullptr;  // (rows) rows of a learned position table (OPT: pos + 2)
  const uint8_t* key_mask = nullptr;   // (rows) 1 for a real token, 0 for padding; packed: null
  int64_t B = 0, T = 0;
  int64_t rows = 0;                    // B * T, or a packed batch's tokens
  const int32_t* starts = nullptr;     // host memory: a packed batch's Batch::starts, else null
};

class BlockStreamer;  // streaming.h

// Keys and values of the positions decoded so far, per layer (B, capacity, num_kv_heads *
// head_dim), in the memory of the backend that made it (Forward::make_cache): host memory on
// the CPU, device memory on a GPU or the simulated device. Move-only; frees its buffers.
struct KVCache {
  int64_t B = 0, capacity = 0, length = 0;  // length: positions filled so far
  std::vector<float*> k, v;
  Backend* backend = nullptr;
  KVCache() = default;
  KVCache(KVCache&& o) noexcept { *this = std::move(o); }
  KVCache& operator=(KVCache&& o) noexcept;
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;
  ~KVCache();

 private:
  void release();
};

class Forward {
 public:
  // max_rows: the most tokens (B*T) one call will see; buffers are sized for it.
  Forward(const Model& model, Backend& backend, int64_t max_rows);
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  // logits (rows(), V) at every position of the batch (padding positions hold garbage).
  void logits(const Batch& batch, std::vector<float>& out);
  // nll (rows()): at each row r of the batch, -log p(targets[r]); targets < 0 give 0.
  // Logits are formed in chunks of rows, never all at once.
  void nll(const Batch& batch, const int32_t* targets, float* nll);
  // nll (n): -log p(targets[i]) at row rows[i] (Batch::row) of the batch; a position may be
  // scored for several targets (the candidates of one prompt in one row). zof::Error for a row
  // or target out of range.
  void nll_at(const Batch& batch, const int32_t* rows, const int32_t* targets, int64_t n,
              float* nll);
  // Next-token NLL of the batch's own tokens: nll (rows()), position t scores token t+1.
  void next_token_nll(const Batch& batch, std::vector<float>& nll);

  // Incremental decoding: runs ids (B, T) at positions cache.length.., appends to the cache and
  // returns the logits (B, V) of each row's last position. All rows advance together. The cache
  // is host memory: host backends only.
  void decode_step(const int32_t* ids, int64_t B, int64_t T, KVCache& cache,
                   std::vector<float>& last_logits);
  KVCache make_cache(int64_t B, int64_t capacity) const;

  // Where the whole-model methods (logits, nll, decode_step) read the weights: the Model's
  // storage (null, the default) or blocks acquired from a streamer (device backends).
  void set_weights(BlockStreamer* s);
  // Or from the Model's storage where blocks are held through `host` (a disk tier: each block
  // acquired while the walk reads it). null: the storage is whole and resident. Either way the
  // bf16 copies then cover one block at a time, as with a streamer.
  void set_host_blocks(BlockAccess* host);

  // The type of the walk's matrix products (Backend::matmul's weights): F32 (the default), or
  // BF16, read from bf16 copies of the matrix weights (Param::gemm and the LM head), rounded to
  // nearest even from the fp32 weights. Norms, biases, the embedding tables and every
  // activation stay fp32. Resident weights (no streamer) keep their copies between walks until
  // weights_changed(); streamed blocks are converted as each arrives.
  void set_compute(DType t);
  DType compute() const { return compute_; }
  // Whoever writes the model's weights (or the streamer's blocks) while this Forward lives says
  // so here: bf16 copies are made again before the next walk reads them.
  void weights_changed();
  // Device bytes the bf16 copies take with a streamer (scratch for one block and the LM head):
  // a streaming plan counts them among its buffers.
  size_t streamed_compute_bytes() const;

  // ---- the pieces of the walk (device pointers) --------------------------------------------
  // Checks the batch (ids in the vocabulary, positions within the context) and copies its ids,
  // positions and key mask to the device. ids, when given, replace the batch's (rows of a
  // compact table the caller built and checked).
  DeviceInputs upload(const Batch& batch, const int32_t* ids = nullptr);
  // h (B*T, C) = embeddings of ids at embed_pos (DeviceInputs' arrays).
  void embed(const EmbedWeights& w, const int32_t* ids, const int32_t* embed_pos, int64_t rows,
             float* h);
  // One transformer layer in place on h (in.rows, C), the batch's inputs as upload() left them;
  // with a cache (host backends), the layer appends its keys/values at cache.length and attends
  // to all length + T keys.
  void layer(int li, const LayerWeights& w, float* h, const DeviceInputs& in,
             KVCache* cache = nullptr);
  // Final norm and projection: rows of h (rows, C) -> logits (rows, V).
  void head_logits(const HeadWeights& w, const float* h, int64_t rows, float* logits);
  // Final norm and OPT's project_out without the LM head: h (rows, C) -> x (rows, E), E the
  // LM head's input width; rows <= max_rows. x may not alias h.
  void head_features(const HeadWeights& w, const float* h, int64_t rows, float* x);
  int64_t head_width() const;  // E
  // Final norm and projection, then nll per row for targets (rows); chunked over rows. h on the
  // device, targets and nll on the host.
  void head_nll(const HeadWeights& w, const float* h, int64_t rows, const int32_t* targets,
                float* nll);
  // The same for n (row, target) pairs: nll[i] at row sel[i] of h for tg[i] (host arrays,
  // checked by the caller).
  void head_nll_at(const HeadWeights& w, const float* h, const int32_t* sel, const int32_t* tg,
                   int64_t n, float* nll);
  // Device scratch of max_rows ints for a caller's row indices (the ZO head's scored rows).
  int32_t* index_buffer() { return ibuf(kSel); }

  Backend& backend() { return be_; }
  const Model& model() const { return model_; }

 private:
  enum IBuf { kIds, kLocal, kPos, kEmbedPos, kSel, kTargets, kNIBuf };
  float* buf(int i) { return bufs_[i]; }
  int32_t* ibuf(int i) { return ibufs_[i]; }
  // The batch through the embedding and every layer at the model's weights, into buf(HID).
  void hidden(const Batch& batch);
  void walk_blocks(const DeviceInputs& in, KVCache* cache);
  // Weight views of the walk's blocks: acquire/release are no-ops without a streamer.
  void acquire(int block);
  void release(int block);
  Model::ParamLocator locator(int block);
  EmbedWeights embed_weights();
  LayerWeights layer_weights(int li);
  HeadWeights head_weights();
  // The head's blocks: the last one, and the embedding when the LM head is tied.
  std::vector<int> head_blocks() const;
  // logits (n, V) of device rows h, copied to the host at out.
  void logits_to_host(const float* h, int64_t n, float* out);
  // Where parameter pi's bf16 copy lives when block `block` is converted (allocating the copies
  // on first use), and the conversion of a block's matrices (tied_head: of the tied LM head),
  // skipped while resident copies are current.
  uint16_t* copy_of(int pi, int block);
  void convert(int block, bool tied_head);
  // A model held in bf16 (a bf16 master): the walk reads its matrices as they are held in a
  // bf16 walk, and everything else in fp32 from wide_: the parameters that are not matrix
  // weights, widened once until weights_changed() (resident, compact), then, in an fp32 walk,
  // the current block's matrices (widened per block).
  float* wide_of(int pi, int block);
  void widen(int block, bool tied_head);
  int64_t wide_floats(bool streamed) const;  // wide_'s size
  // Parameter pi where it is held now: the streamer's device block, or the model's storage.
  Theta held(int pi) const;
  const Model& model_;
  const ModelConfig& cfg_;
  Backend& be_;
  int64_t max_rows_;
  DType compute_ = DType::F32;
  // bf16 copies: resident, one per element of the model's storage (at the same offsets);
  // streamed, one block's span, then a tied LM head. fresh_[b] (resident only): block b's copy
  // is current (the last entry: the tied LM head's).
  uint16_t* copies_ = nullptr;
  std::vector<bool> fresh_;
  float* wide_ = nullptr;
  std::vector<int64_t> wide_off_;  // per parameter: in wide_'s resident part (-1: a matrix)
  int64_t wide_resident_ = 0;      // floats of the resident part
  bool wide_fresh_ = false;
  std::vector<float*> bufs_;
  std::vector<int32_t*> ibufs_;
  uint8_t* mask_ = nullptr;
  std::vector<int32_t> starts_;  // the uploaded batch's Batch::starts (DeviceInputs::starts)
  BlockStreamer* weights_ = nullptr;
  BlockAccess* host_ = nullptr;
  // Frees the bf16 copies and the fp32 scratch (made again, in the new layout, when next read).
  void drop_copies();
  // Copies one block at a time (a streamer, or host blocks through a tier), not resident ones.
  bool per_block() const { return weights_ != nullptr || host_ != nullptr; }
};

}  // namespace zof
