// Evaluation during a run: rank 0 scores the task's held-out set with the whole model (its
// blocks gathered from the pipeline stages first), records it in metrics.jsonl and tells the
// sink; the other ranks send their blocks and wait for it (its heartbeat keeps their watchdog
// from ending the job however long the evaluation takes).
#pragma once
#include <cstdint>
#include <functional>

#include <nlohmann/json.hpp>

#include "zof/trainer.h"

namespace zof::train {

class Job;
class JsonlLog;

class Evaluator {
 public:
  // metrics and sink: rank 0's (null elsewhere).
  Evaluator(Job& job, ZOEngine& engine, Model& model, TrainData& data, JsonlLog* metrics,
            TrainSink* sink)
      : job_(job), engine_(engine), model_(model), data_(data), metrics_(metrics), sink_(sink) {}
  // The metrics.jsonl "eval" record at the weights after `step` steps; when: "before",
  // "during", "after". Other ranks get {"metric": "", "value": 0}.
  nlohmann::json evaluate(int64_t step, const char* when);

 private:
  Job& job_;
  ZOEngine& engine_;
  Model& model_;
  TrainData& data_;
  JsonlLog* metrics_;
  TrainSink* sink_;
};

// Rank 0 writes a checkpoint (save) while the other ranks wait for it under the watchdog.
void run_checkpoint_on_root(Job& job, const std::function<void()>& save);

}  // namespace zof::train
