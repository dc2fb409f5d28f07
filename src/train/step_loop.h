// The step loop: each step's batch, the estimator's sums, the one reduction, the update (or a
// skipped step), the step log and metrics, evaluations, progress and checkpoints. SIGINT and
// SIGTERM to any rank (or the sink's request) stop every rank after the same step.
#pragma once
#include <signal.h>

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/run_dir.h"
#include "zof/trainer.h"

namespace zof::train {

class Estimator;
class Evaluator;
class Job;

// SIGINT and SIGTERM, from construction to destruction, ask the loop to stop at the end of a
// step (with a checkpoint) instead of ending the process; the old handlers come back after.
// finetune() installs it before it creates --out: a signal from then on never leaves a run
// directory half made.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

// How the loop ended.
struct LoopEnd {
  int64_t step = 0;          // steps done
  bool interrupted = false;  // stopped before --steps: a signal or the sink
  int signal = 0;            // the signal this rank received (0: none)
  bool sink_stop = false;    // this rank's sink asked to stop
  uint64_t step_bytes = 0;   // bytes this rank sent during steps (activations, the reduction)
  uint64_t tensor_bytes = 0;  // of which it handed its tensor group (Estimator::exchanged_bytes)
};

class StepLoop {
 public:
  // c: the counters the run starts (or resumes) with, kept current as the steps go.
  StepLoop(const TrainOptions& opt, Job& job, RunDir& dir, ZOEngine& engine, Model& model,
           Estimator& estimator, TrainData& data, Evaluator& eval, TrainSink& sink,
           RunCounters& c);
  // The evaluation before the first step (unless a resumed run has it), then the steps; a
  // signal (StopSignals, installed by the caller) stops them after the step in progress.
  LoopEnd run();
  // Every rank: the weights gathered to rank 0, which writes checkpoint-<step>.
  void save_checkpoint(int64_t step);
  // Mean training loss of the last 50 finite steps (NaN: none).
  double recent_loss() const;

 private:
  struct Outcome;
  Outcome estimate(int64_t step);
  nlohmann::json record(int64_t step, const Outcome& s);
  void check_bad_run(int64_t step);
  void report(int64_t step, const nlohmann::json& record, bool evaluated);
  void hint_if_stalled();

  const TrainOptions& opt_;
  Job& job_;
  RunDir& dir_;
  ZOEngine& engine_;
  Model& model_;
  Estimator& est_;
  TrainData& data_;
  Evaluator& eval_;
  TrainSink& sink_;
  RunCounters& c_;
  const int64_t start_;
  std::vector<double> recent_;  // (l+ + l-)/2 of recent steps
  nlohmann::json last_eval_;
  uint64_t step_bytes_ = 0, tensor_bytes_ = 0;
  double t_step0_ = 0;
  bool sink_stop_ = false;
  int evals_during_ = 0;  // evaluations during this process's steps
};

}  // namespace zof::train
