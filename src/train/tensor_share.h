// A rank's share of a tensor-parallel run (--tensor-parallel T, zof/tensor_parallel.h): its slice
// of the model, which the ZO engine updates and the tensor-parallel forward reads, its tensor
// group over the world's ranks, and the gathering of the slices into rank 0's whole model for
// evaluations, checkpoints and the saved model.
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "zof/dist.h"
#include "zof/model.h"
#include "zof/tensor_parallel.h"

namespace zof::train {

class TensorShare {
 public:
  // This rank's slice of full (fp32 storage: the weights the run starts or resumes with).
  TensorShare(dist::Communicator& world, const dist::Grid& grid, const Model& full);
  Model& local() { return local_; }
  const tp::Plan& plan() const { return plan_; }
  tp::Group& group() { return *group_; }
  const ModelConfig& config() const { return config_; }
  // The parameters this rank's pipeline stage reads (every one without stages): its blocks',
  // and a tied LM head's token table on the head's stage (whose engine keeps that block
  // current too: ZOEngine::owns_block).
  const std::vector<int>& stage_params() const { return walk_params_; }
  // fwd walks this rank's stage: hidden states from the same tensor rank of the previous
  // stage, to that of the next.
  void wire(tp::TensorForward& fwd);
  // The first replica's slices placed in world rank 0's full model, each stage's ranks their
  // stage's blocks (every rank of the job calls it; only that replica moves bytes: the other
  // replicas hold the same).
  void gather_to_root(Model& full);
  // An optimizer-state plane the same way: mine (this rank's engine's, the slice's storage
  // layout) into whole (the whole model's storage layout) on world rank 0.
  void gather_plane_to_root(const std::vector<float>& mine, std::vector<float>& whole);
  // This rank's slice of a whole-model plane (a checkpoint's m or v): what its engine holds.
  std::vector<float> slice_plane(const std::vector<float>& whole) const;

 private:
  void gather_storage_to_root(const float* mine, Model& full);
  dist::Communicator& world_;
  dist::Grid grid_;
  int stage_ = 0;
  ModelConfig config_;
  std::vector<std::pair<int, int>> stage_blocks_;  // each stage's (first, last) block
  std::vector<std::vector<int>> stage_params_;     // each stage's blocks' parameters
  std::vector<int> walk_params_;                   // what this rank's stage reads
  tp::Plan plan_;
  Model local_;
  std::unique_ptr<tp::Group> group_;
};

}  // namespace zof::train
