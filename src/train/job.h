// The ranks of a training job: their grid of tensor groups, pipeline stages and data-parallel
// replicas,
// the wiring of this rank's stage into the engine, the gathering of every block to rank 0, and
// the step's one ordered reduction that leaves every rank with the same sums.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "zof/dist.h"
#include "zof/trainer.h"
#include "zof/zo.h"

namespace zof::train {

class TensorShare;

class Job {
 public:
  // zof::Error unless the ranks divide into the stages and tensor groups (dist::Grid).
  Job(dist::Communicator& comm, int pipeline_stages, int tensor_parallel = 1);
  // zof::Error unless --batch gives every replica's every micro-batch an example.
  void check_batch(const TrainOptions& opt) const;
  // Pipeline: this rank walks its stage's blocks; the hidden states of each micro-batch come
  // from the previous stage's rank and go to the next one's (stream index as the tag).
  void wire_pipeline(ZOEngine& engine, int num_layers);
  // Brings rank 0's copy of every block up to date (before evaluating or saving): each stage of
  // the first replica sends its own blocks once; the other replicas hold the same weights.
  void gather_weights(ZOEngine& engine, Model& model);
  // Tensor parallel: the engine walks this rank's slice (share), and rank 0 evaluates the whole
  // model, gathered, with full (null on the other ranks).
  void set_tensor_share(TensorShare* share, Forward* full);
  // Rank 0's m and v (the whole model's storage layout; v empty for momentum) for a checkpoint:
  // the engine's, or under tensor parallel the first replica's slices gathered (every rank
  // calls it then). Nothing elsewhere.
  void gather_state(ZOEngine& engine, std::vector<float>& m, std::vector<float>& v);
  // What rank 0 evaluates with: the engine's forward, or the whole model's under tensor parallel.
  Forward& eval_forward(ZOEngine& engine);
  // The step's one reduction: loss sums and counts from each replica's last stage, the stop
  // flag from every rank (so that all ranks leave after the same step). Returns whether any
  // rank asked to stop.
  bool reduce_step(int queries, QueryLosses& sums, double& tokens, bool stop);
  // ", MPI ...: S pipeline stage(s) x R data-parallel replica(s), T thread(s) each" (empty for
  // one process), for the run's first line.
  std::string describe(int threads) const;

  dist::Communicator& comm;
  const dist::Grid grid;
  const dist::Layout layout;  // stages x replicas (each replica a tensor group of grid.tensor)
  const int rank, stage, replica, tensor_rank;
  const bool root, last_stage;

 private:
  TensorShare* share_ = nullptr;
  Forward* full_ = nullptr;
  std::vector<std::pair<int, int>> ranges_;  // each stage's blocks
};

}  // namespace zof::train
