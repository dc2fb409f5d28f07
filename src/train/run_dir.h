// The run directory: run.json (the options and the model's identity), metrics.jsonl and
// zo_log.jsonl (append-only, cut back on resume to what the checkpoint saw), checkpoints and the
// `latest` file naming the complete one, every file written atomically; and where a resumed run
// starts from.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "zof/trainer.h"

namespace zof {
class Model;
class ZOEngine;
}  // namespace zof

namespace zof::train {

namespace fs = std::filesystem;

// Writes text to path atomically: temporary file, fsync, rename, fsync of the directory.
void write_file_atomic(const fs::path& path, const std::string& text);
// A JSON file; zof::Error saying the run directory is damaged when it does not parse.
nlohmann::json read_json(const fs::path& p);
// The tokenizer's files (and generation_config.json) beside a saved model.
void copy_tokenizer_files(const fs::path& from, const fs::path& to);

// An append-only JSONL file whose size at each checkpoint is recorded, so that a resumed run
// truncates it back to exactly what the checkpoint saw.
class JsonlLog {
 public:
  JsonlLog() = default;
  JsonlLog(const JsonlLog&) = delete;
  JsonlLog& operator=(const JsonlLog&) = delete;
  ~JsonlLog();
  void open(const fs::path& p, int64_t truncate_to);
  void write(const nlohmann::json& j);
  int64_t sync();  // the durable size

 private:
  fs::path path_;
  std::FILE* f_ = nullptr;
};

// The loop's counters that a checkpoint keeps (state.json), and the logs' sizes at that point.
struct RunCounters {
  int64_t step = 0, bad_run = 0;
  nlohmann::json eval_before;  // null until the evaluation before the first step
  double tokens = 0, train_s = 0;
  int64_t metrics_bytes = 0, log_bytes = 0;
};

class RunDir {
 public:
  // --resume: replaces opt with the run's saved options, keeping this command's layout flags
  // (threads, ranks, device; they may change between runs), and finds the latest checkpoint.
  // Reads only. A new run: the directory is --out.
  explicit RunDir(TrainOptions& opt);
  // A new run: refuses a directory that holds one, creates it and checks it can be written.
  void prepare() const;
  bool resuming() const { return resuming_; }
  const fs::path& path() const { return run_; }
  // A resumed run: zof::Error unless model_id (config and size) is the run's.
  void check_model(const nlohmann::json& model_id, const std::string& model_dir) const;

  // The checkpoint the run continues from: its weights into model, its counters; nothing and
  // zero counters for a run that starts at step 0.
  RunCounters load_checkpoint(Model& model) const;
  // Momentum/Adam state beside the checkpoint's weights, when the engine keeps any.
  void load_optimizer_state(ZOEngine& engine, const Model& model,
                            const std::string& optimizer) const;

  // Rank 0: run.json of a new run, then the logs, open at the checkpoint's sizes.
  void start(const TrainOptions& opt, const nlohmann::json& model_id, const RunCounters& c);
  JsonlLog& metrics() { return metrics_; }
  JsonlLog& zo_log() { return zlog_; }

  // Rank 0: checkpoint-<c.step> (fp32 weights, optimizer state, counters), then `latest` names
  // it and the older checkpoints go. The weights must be current (flushed and gathered).
  void save_checkpoint(const RunCounters& c, const Model& model, ZOEngine& engine,
                       const std::string& optimizer);

 private:
  fs::path run_, ckpt_;
  bool resuming_ = false;
  nlohmann::json saved_;  // run.json of a resumed run
  nlohmann::json state_;  // state.json of its checkpoint
  JsonlLog metrics_, zlog_;
};

// The latest complete checkpoint of a run directory, or empty.
fs::path latest_checkpoint(const fs::path& run);

}  // namespace zof::train
