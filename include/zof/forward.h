// The transformer forward pass written once over the Backend interface, as a walk over blocks:
// embed -> layer 0..L-1 -> head. Each piece takes its weights explicitly, so a caller can run a
// block on perturbed copies (the ZO dual forward) or on weights streamed to a device.
#pragma once
#include <cstdint>
#include <vector>

#include "zof/backend.h"
#include "zof/model.h"

namespace zof {

// A right-padded batch of token sequences. Row b holds lengths[b] real tokens, then padding.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> ids;      // (B, T)
  std::vector<int32_t> lengths;  // (B)
  // Builds a batch from sequences, padding with pad_id. Sequences must be non-empty.
  static Batch from_sequences(const std::vector<std::vector<int32_t>>& seqs, int32_t pad_id = 0);
};

// Keys and values of every layer for incremental decoding. (B, capacity, Hkv, D) per layer.
struct KVCache {
  int64_t B = 0, capacity = 0, length = 0;  // length: positions filled so far
  std::vector<std::vector<float>> k, v;
};

class Forward {
 public:
  // max_rows: the most tokens (B*T) one call will see; buffers are sized for it.
  Forward(const Model& model, Backend& backend, int64_t max_rows);
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  // logits (B*T, V) at every position of the batch (padding positions hold garbage).
  void logits(const Batch& batch, std::vector<float>& out);
  // nll (B*T): at each position t of row b, -log p(targets[b*T+t]); targets < 0 give 0.
  // Logits are formed in chunks of rows, never all at once.
  void nll(const Batch& batch, const int32_t* targets, float* nll);
  // Next-token NLL of the batch's own tokens: nll (B*T), position t scores token t+1.
  void next_token_nll(const Batch& batch, std::vector<float>& nll);

  // Incremental decoding: runs ids (B, T) at positions cache.length.., appends to the cache and
  // returns the logits (B, V) of each row's last position. All rows advance together.
  void decode_step(const int32_t* ids, int64_t B, int64_t T, KVCache& cache,
                   std::vector<float>& last_logits);
  KVCache make_cache(int64_t B, int64_t capacity) const;

  // ---- the pieces of the walk ------------------------------------------------------------
  // h (B*T, C) = embeddings of ids at positions pos (B*T).
  void embed(const EmbedWeights& w, const int32_t* ids, const int32_t* pos, int64_t rows, float* h);
  // One transformer layer in place on h (B, T, C). key_mask (B, Tk) or null; with a cache, the
  // layer appends its keys/values at cache.length and attends to all Tk = length + T keys.
  void layer(int li, const LayerWeights& w, float* h, int64_t B, int64_t T, const int32_t* pos,
             const uint8_t* key_mask, KVCache* cache);
  // Final norm and projection: rows of h (rows, C) -> logits (rows, V).
  void head_logits(const HeadWeights& w, const float* h, int64_t rows, float* logits);
  // Final norm and OPT's project_out without the LM head: h (rows, C) -> x (rows, E), E the
  // LM head's input width; rows <= max_rows. x may not alias h.
  void head_features(const HeadWeights& w, const float* h, int64_t rows, float* x);
  int64_t head_width() const;  // E
  // Final norm and projection, then nll per row for targets (rows); chunked over rows.
  void head_nll(const HeadWeights& w, const float* h, int64_t rows, const int32_t* targets,
                float* nll);

  Backend& backend() { return be_; }
  const Model& model() const { return model_; }

 private:
  float* buf(int i) { return bufs_[i]; }
  // h (B*T, C): the batch through the embedding and every layer at the model's own weights.
  void hidden(const Batch& batch, std::vector<float>& h);
  const Model& model_;
  const ModelConfig& cfg_;
  Backend& be_;
  int64_t max_rows_;
  std::vector<float*> bufs_;
  std::vector<int32_t> pos_;
  std::vector<uint8_t> mask_;
};

}  // namespace zof
