// The blocks of a model's tensors held through a tier (zof/model.h's BlockAccess) as a writer
// reaches the tensors in order (Model::save, Model::save_gguf): one block at a time, each
// acquired once, in an in-order walk (what the tier reads ahead).
#pragma once
#include <vector>

#include "zof/model.h"

namespace zof {

class TensorBlocks {
 public:
  // tier null: nothing is held (the storage is resident).
  TensorBlocks(const Model& m, BlockAccess* tier) : tier_(tier) {
    if (!tier_) return;
    const auto& blocks = m.blocks();
    block_of_.assign(m.params().size(), -1);
    std::vector<int> order(blocks.size());
    for (int b = 0; b < (int)blocks.size(); ++b) {
      order[b] = b;
      for (int pi : blocks[b].params) block_of_[pi] = b;
    }
    tier_->begin_walk(std::move(order));
  }
  // A writer that stops on an error releases quietly: its error is the one to hear.
  ~TensorBlocks() {
    try {
      done();
    } catch (...) {
    }
  }
  TensorBlocks(const TensorBlocks&) = delete;
  TensorBlocks& operator=(const TensorBlocks&) = delete;

  // Parameter pi's block held (the one held before released).
  void hold(int pi) {
    if (!tier_ || block_of_[pi] == held_) return;
    done();
    tier_->acquire(block_of_[pi], false);
    held_ = block_of_[pi];
  }
  // The block held, released (a transfer's error is thrown here).
  void done() {
    if (held_ < 0) return;
    const int b = held_;
    held_ = -1;
    tier_->release(b, false);
  }

 private:
  BlockAccess* tier_;
  std::vector<int> block_of_;
  int held_ = -1;
};

}  // namespace zof
