// The ranks of a training job: their layout into pipeline stages and data-parallel replicas,
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

class Job {
 public:
  // zof::Error unless the ranks divide into the stages.
  Job(dist::Communicator& comm, int pipeline_stages);
  // zof::Error unless --batch gives every replica's every micro-batch an example.
  void check_batch(const TrainOptions& opt) const;
  // Pipeline: this rank walks its stage's blocks; the hidden states of each micro-batch come
  // from the previous stage's rank and go to the next one's (stream index as the tag).
  void wire_pipeline(ZOEngine& engine, int num_layers);
  // Brings rank 0's copy of every block up to date (before evaluating or saving): each stage of
  // the first replica sends its own blocks once; the other replicas hold the same weights.
  void gather_weights(ZOEngine& engine, Model& model);
  // The step's one reduction: loss sums and counts from each replica's last stage, the stop
  // flag from every rank (so that all ranks leave after the same step). Returns whether any
  // rank asked to stop.
  bool reduce_step(int queries, QueryLosses& sums, double& tokens, bool stop);
  // ", MPI ...: S pipeline stage(s) x R data-parallel replica(s), T thread(s) each" (empty for
  // one process), for the run's first line.
  std::string describe(int threads) const;

  dist::Communicator& comm;
  const dist::Layout layout;
  const int rank, stage, replica;
  const bool root, last_stage;

 private:
  std::vector<std::pair<int, int>> ranges_;  // each stage's blocks
};

}  // namespace zof::train
