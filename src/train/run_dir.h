// The run directory: run.json (the options and the model's identity), metrics.jsonl and
// zo_log.jsonl (append-only, cut back on resume to what the checkpoint saw), checkpoints and the
// `latest` file naming the complete one, every file written atomically; and where a resumed run
// starts from.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/files.h"
#include "zof/trainer.h"

namespace zof {
class DiskTier;
class Model;
class ZOEngine;
}  // namespace zof

namespace zof::train {

// The optimizer state a checkpoint writes (Momentum: m; Adam: m and v).
struct CheckpointState {
  int planes = 0;  // 0 (none), 1 or 2
  OptimizerChoice optimizer{};
  // The whole planes, storage layout (Job::gather_state): a checkpoint that holds every block.
  const std::vector<float>* m = nullptr;
  const std::vector<float>* v = nullptr;
  // A checkpoint that keeps its disk blocks in the store (RunDir::writes_store): one block's
  // state, handed to fn (its planes, blocks()[b].span floats each; v null without Adam), as
  // ZOEngine::read_state_blocks gives it. The whole planes are never gathered then.
  std::function<void(int block, const std::function<void(int, float*, float*)>& fn)> block;
};

namespace fs = std::filesystem;
// Atomic files and the byte hash (util/files.h), by the names the run directory's code uses.
using zof::ByteHash;
using zof::fsync_path;
using zof::write_file_atomic;

// A JSON file; zof::Error saying the run directory is damaged when it does not parse.
nlohmann::json read_json(const fs::path& p);
// The tokenizer's files (and generation_config.json) beside a saved model; from a GGUF model
// (`from` a file), the tokenizer.json, tokenizer_config.json and generation_config.json its
// vocabulary makes (gguf_llama.h).
void copy_tokenizer_files(const fs::path& from, const fs::path& to);
// A file's bytes as they are, with no checks (empty when it cannot be opened): the run
// directory's own small files (`latest`, summary.json, the lock's pid, a log being checked).
// Internal to the run directory's code (run_dir.cpp, run_lock.cpp).
std::string slurp(const fs::path& p);

// The data a run trains and evaluates on, as files: --data (a text or task file) or, for a task
// directory, the files load_task reads there; "files-fnv1a64:<16 hex digits>" over each file's
// name, size and bytes (run.json "data_fingerprint"). Empty when a file cannot be read (the data
// loader then says why).
std::string data_fingerprint(const TrainOptions& opt);

// An append-only JSONL file whose size (and running hash) at each checkpoint is recorded, so that
// a resumed run truncates it back to exactly what the checkpoint saw.
class JsonlLog {
 public:
  JsonlLog() = default;
  JsonlLog(const JsonlLog&) = delete;
  JsonlLog& operator=(const JsonlLog&) = delete;
  ~JsonlLog();
  void open(const fs::path& p, int64_t truncate_to);
  void write(const nlohmann::json& j);
  int64_t sync();  // the durable size
  std::string hash() const { return hash_.text(); }  // of every byte in the file (ByteHash)

 private:
  fs::path path_;
  std::FILE* f_ = nullptr;
  ByteHash hash_;
};

// The loop's counters that a checkpoint keeps (state.json), and the logs' sizes at that point.
struct RunCounters {
  int64_t step = 0, bad_run = 0;
  nlohmann::json eval_before;  // null until the evaluation before the first step
  double tokens = 0, train_s = 0;
  int64_t metrics_bytes = 0, log_bytes = 0;
  std::string log_hash;  // ByteHash of the step log's log_bytes; empty from an older zof
  std::string run_seal;  // run_json_seal of run.json when written; empty from an older zof
  // A checkpoint written by a stop inside a bf16 master's rounding window: the window's first
  // step (its master is the one before that step; the window's updates are the log's records
  // from there to step); -1: none (every other checkpoint is at a window's end).
  int64_t window_from = -1;
};

// "the run directory is damaged; ..." (the fix every damaged-file message ends with).
extern const char* const kDamaged;
// "checkpoint-<digits>" (no leading zeros, as save_checkpoint names them): its step; else -1.
int64_t checkpoint_step(const std::string& name);

// A checkpoint's state.json, validated like any input file: every field's type and range (step
// in [0, max_steps], the run's --steps; bad_run in [0, step]; tokens and train_s finite and
// >= 0; the logs' sizes non-negative integers; log_hash and run_seal absent or a ByteHash text;
// eval_before null or an evaluation record).
// zof::Error naming the file and the field. (Whether the sizes fit the logs is checked against
// the files, on resume.)
RunCounters parse_state(const nlohmann::json& j, const std::string& file, int64_t max_steps);

// A checkpoint's open rounding window (RunCounters::window_from): the updates of the step log's
// records [from, to) added to the engine's pending window, unrounded, as the interrupted run
// held them (src/train/replay.cpp, which reads the log the same way).
void reopen_window(const std::string& log, ZOEngine& engine, const TrainOptions& o,
                   int64_t from, int64_t to);

// run.json's "options": every field's JSON type checked against the option's (a string, a
// boolean, an integer in range, a finite number), then TrainOptions::from_json. zof::Error
// naming the file and the field.
TrainOptions parse_run_options(const nlohmann::json& run_json, const std::string& file);

// run.json's format: 2 is sealed ("format": 2 and "seal"); a run.json without "format" is an
// older zof's, unsealed. 3 is format 2 for a run that a zof reading only 2 would get silently
// wrong, since it drops the options it does not know: a --low-rank run (it would resume and
// replay it with dense directions). Only such runs are written as 3 (run_json_format), so
// every other run stays readable by the zofs before.
constexpr int kRunJsonFormat = 2;
constexpr int kRunJsonFormatNewest = 3;
int run_json_format(const TrainOptions& o);
// run.json's seal: the ByteHash of the canonical dump (keys sorted, no spaces) of its fields but
// "seal" itself and the options that only say where the inputs and the run are (options.model,
// options.data, options.out: what they hold is fingerprinted, base_fingerprint and
// data_fingerprint, so they may be moved). Layout and white space do not change it.
std::string run_json_seal(const nlohmann::json& run_json);
// A sealed run.json (or one whose "format" says it should be) against its seal; a "format" this
// zof does not know is refused. zof::Error naming the file, saying that it was edited after the
// run started and what to do. An older zof's run.json (neither field) passes.
void check_run_seal(const nlohmann::json& run_json, const std::string& file);
// A checkpoint's state.json (and a summary.json that has it) records the seal of run.json as
// the run held it ("run_seal", run_json_seal, also of an older unsealed run.json): zof::Error
// when run.json's fields no longer hash to it (run.json edited and its seal removed or
// recomputed). state: the file as read (before it is validated: an edited --steps would
// otherwise be blamed on state.json). Nothing recorded (an older zof): passes.
void check_recorded_seal(const nlohmann::json& state, const std::string& state_file,
                         const nlohmann::json& run_json, const std::string& file);

// Refuses (zof::Error) an output directory that is, holds or lies inside an input path,
// comparing real paths (symlinks resolved), before anything is created: writing there would
// overwrite or mix with the input. out_flag/in_flag name them ("--out", "--model").
void check_apart(const fs::path& out, const std::string& out_flag, const fs::path& input,
                 const std::string& in_flag);

// What zof itself may leave in an output directory when a process stops before it wrote
// anything else: `.lock`, and `NAME.tmp.PID` files (write_file_atomic's) of processes that are
// gone. foreign_entries: the other entries of dir (at most max names, then "N more").
std::vector<std::string> foreign_entries(const fs::path& dir, size_t max = 3);
// Removes the `NAME.tmp.PID` files in dir whose process is gone (a SIGKILL's leftovers).
void remove_stale_tmp(const fs::path& dir);
// Refuses (zof::Error) an existing out that holds anything but zof's leftovers: writing there
// would overwrite or mix with what it holds. what: the rest of the message ("a new run writes
// into a new or empty directory").
void check_empty_out(const fs::path& out, const std::string& flag, const std::string& what);

// An exclusive flock(2) on RUN/.lock held for the life of the process by the run's one writer
// (compatible with util-linux flock(1)); a second writer is refused naming the holder's pid (as
// this process, when the holder is the caller itself: a run started from inside another).
class RunLock {
 public:
  RunLock() = default;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  ~RunLock();
  // flag: how the user named the run directory ("--resume", "--out"), for the message.
  void acquire(const fs::path& run, const std::string& flag);
  bool held() const { return fd_ >= 0; }
  void write_pid();  // the holder's pid into the file, for whoever is refused next

 private:
  int fd_ = -1;
  fs::path path_;
};

class RunDir {
 public:
  // --resume: replaces opt with the run's saved options, keeping this command's layout flags
  // (threads, ranks, device; they may change between runs), and finds the latest checkpoint.
  // Reads only. A new run: the directory is --out.
  explicit RunDir(TrainOptions& opt);
  // A run that this process created and that never started is removed again (an error
  // between creating --out and the first write of run.json leaves nothing behind).
  ~RunDir();
  // Before anything is loaded: a new run refuses an --out that holds a run, that cannot be
  // created or written, or that is, holds or lies inside --model or --data; a resumed run, a
  // run directory that is, holds or lies inside them.
  void check_out(const TrainOptions& opt) const;
  // Rank 0 of a resumed run, before it loads anything: the run's lock (a second writer is
  // refused), then the logs against the checkpoint (long enough, cut at a line boundary, one
  // zo_log line per step): a damaged log is refused by name, never appended to.
  void lock_resumed();
  // A new run, once everything is loaded and checked: creates --out (and rank 0 takes its lock).
  void create(bool root);
  // A resumed run whose last checkpoint is its --steps and that wrote its summary: nothing
  // is left to do, and it is refused (after every other check) rather than rewritten.
  void check_unfinished() const;
  bool resuming() const { return resuming_; }
  // run.json's base_fingerprint of a resumed run ("": a new run, or none recorded).
  std::string saved_fingerprint() const;
  // run_json_seal of the run's run.json (once started, or resumed): what each checkpoint's
  // state.json records as "run_seal" (summary.json may record it too: replay checks it there).
  const std::string& run_seal() const { return run_seal_; }
  const fs::path& path() const { return run_; }
  // A resumed run: zof::Error unless model_id (config and size) and the base model's weights'
  // fingerprint are the run's (an empty fingerprint: the config alone, the weights checked
  // later). Returns a warning for a run recorded without a fingerprint.
  std::string check_model(const nlohmann::json& model_id, const std::string& fingerprint,
                          const std::string& model_dir) const;
  // The run's data (data_fingerprint): kept for run.json (start); a resumed run refuses data
  // that differ from run.json's "data_fingerprint" (a run from an older zof has none: accepted).
  void check_data(const std::string& fingerprint, const std::string& data);

  // The checkpoint the run continues from: its weights into model, its counters; nothing and
  // zero counters for a run that starts at step 0.
  // tier: the model's blocks are held through it (a disk tier), read into it block by block.
  // A checkpoint whose blocks are in the disk tier's store (checkpoint_store()) needs the tier
  // that adopted it (DiskStore): its other blocks are read in, the store's slots taken back
  // (DiskTier::restore_committed) and each block's hash checked against store.json.
  RunCounters load_checkpoint(Model& model, BlockAccess* tier = nullptr) const;
  // The latest checkpoint's blocks in the disk tier's store (its store.json; a checkpoint of a
  // run whose blocks did not all fit --host-mem): the store's file and, per block, the slot
  // holding it (-1: the block is in the checkpoint's resident.safetensors) and its hash.
  // Checked against the model's layout held with `planes` planes (weights and optimizer state):
  // zof::Error naming the file and the field. Nothing for any other checkpoint.
  struct CheckpointStore {
    fs::path file;
    std::vector<int> slot;
    std::vector<uint64_t> hash;
  };
  std::optional<CheckpointStore> checkpoint_store(const Model& model, int planes) const;
  bool checkpoint_in_store() const;  // the latest checkpoint has a store.json
  // Its counters alone (zero for a run that starts at step 0).
  RunCounters checkpoint_counters() const { return ckpt_.empty() ? RunCounters{} : state_; }
  // Momentum/Adam state beside the checkpoint's weights, when the engine keeps any (for a
  // checkpoint in the store, after load_checkpoint: the blocks it holds itself, one at a time;
  // the store's slots brought the others' state).
  void load_optimizer_state(ZOEngine& engine, const Model& model,
                            OptimizerChoice optimizer) const;
  // The same planes read (m, and v when planes is 2; n floats each: the whole model's storage
  // layout) without an engine to write them to; false (nothing read) for a run at step 0.
  bool read_optimizer_state(int planes, int64_t n, OptimizerChoice optimizer,
                            std::vector<float>& m, std::vector<float>& v) const;

  // Rank 0: run.json of a new run (with the base model's fingerprint and what computed it:
  // {"dtype", "unit"}), then the logs, open at the checkpoint's sizes.
  void start(const TrainOptions& opt, const nlohmann::json& model_id,
             const std::string& fingerprint, const nlohmann::json& compute,
             const RunCounters& c);
  JsonlLog& metrics() { return metrics_; }
  JsonlLog& zo_log() { return zlog_; }

  // Rank 0: checkpoint-<c.step> (the weights as held, fp32 or a bf16 master's bf16: exact;
  // optimizer state, counters), then `latest` names
  // it and the older checkpoints go. The weights must be current (flushed and gathered).
  // Weights that are not finite are never written: zof::Error saying after which step they
  // went so (the first step whose loss was not finite), the latest checkpoint (which is kept:
  // it holds the last finite weights) and what to do; the logs stay as they are. Weights whose
  // last step's loss was not finite are not written either: mid-run the checkpoint is skipped
  // (the previous one stays), at the run's last step that is the same error.
  // The optimizer state goes beside the weights (optimizer.safetensors): whole planes "m" and
  // "v", or for a checkpoint that keeps its disk blocks in the store (writes_store), the state
  // of the blocks it holds itself only, a tensor per block and plane ("m.<block>"): the store's
  // slots hold the other blocks' state with their weights.
  // tier: the model's blocks held through it (a disk tier), read block by block. A disk tier
  // with a run's store (DiskStore) and blocks on disk: the checkpoint copies no disk block; it
  // names their slots and hashes (store.json) and holds the resident blocks
  // (resident.safetensors); the tier then keeps those slots (DiskTier::committed).
  // state: the optimizer's (CheckpointState).
  void save_checkpoint(const RunCounters& c, const Model& model, const CheckpointState& state,
                       BlockAccess* tier = nullptr);
  // Whether a checkpoint of a run whose blocks are held through `tier` keeps its disk blocks in
  // the tier's store (a disk tier with a run's store and blocks on disk), not in the checkpoint.
  static bool writes_store(BlockAccess* tier);

 private:
  // load_checkpoint of a checkpoint whose blocks are in the disk tier's store.
  void load_from_store(Model& model, DiskTier& disk) const;
  // hash: the ByteHash the checkpoint records of the first `recorded` bytes ("": none).
  void check_log(const fs::path& file, int64_t recorded, const char* field, int64_t lines,
                 const std::string& hash = "") const;

  fs::path run_, ckpt_;
  bool resuming_ = false;
  nlohmann::json saved_;  // run.json of a resumed run
  RunCounters state_;     // state.json of its checkpoint, validated
  JsonlLog metrics_, zlog_;
  RunLock lock_;
  fs::path created_;      // the topmost directory this process created for --out
  bool started_ = false;  // run.json written: the directory holds a run from here on
  std::string data_fingerprint_;  // of a new run's data, for run.json
  bool finished_ = false;  // a resumed run that has nothing left to do (check_unfinished)
  fs::path finished_model_;  // then: its model, as a new run's --model
  std::string run_seal_;  // run_json_seal of run.json, for each checkpoint's state.json
  float lr_ = 0, weight_decay_ = 0;  // the run's, for the message about non-finite weights
  int64_t steps_ = 0;                // the run's --steps: its last checkpoint
};

// The latest complete checkpoint of a run directory, or empty.
fs::path latest_checkpoint(const fs::path& run);

}  // namespace zof::train
