// `zof finetune`: the training loop around ZOEngine: schedules, evaluation, metrics, progress,
// atomic checkpoints and exact resume, the (seed, g) step log, and replay from that log.
// The parts live in src/train/, one file each (see the first lines of each); the options and
// their table in zof/options.h, a run's data in zof/data.h.
#pragma once
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zof/data.h"
#include "zof/forward.h"
#include "zof/number_rule.h"
#include "zof/options.h"
#include "zof/tensor_parallel.h"
#include "zof/zo.h"

namespace zof {

namespace dist {
class Communicator;
struct Grid;
}  // namespace dist

// The dtype a run saves its model in: --save-dtype, "input" as the model loaded, auto the
// master's (--master).
DType save_dtype(const TrainOptions& o, const Model& model);

// How a run holds its weights (Model::storage_dtype). A bf16 master (--master bf16) is held in
// 2 bytes a parameter wherever its walk reads it so: the SPSA walk in one pipeline stage, on the
// host or streamed through a device (blocks cross the bus in bf16). The JVP estimator and
// pipeline stages hold it in fp32 storage, rounded to the same bf16 values (the same bits
// either way), so a run may resume with other such flags.
DType weight_storage(const TrainOptions& o);
// Whether a bf16 master's rounding window (--round-every) closes after step `step`: at
// multiples of round_every, and wherever the run reads its master (each evaluation and
// checkpoint, flushed; the end). All are fixed by the run's options, so a resumed run and its
// replay round where the run did; a stop runs on to the next one.
bool window_closes_after(const TrainOptions& o, int64_t step);
// --round-every with auto (0) resolved.
int64_t round_every_of(const TrainOptions& o);
// How to load a run's base model so that its fingerprint compares with the one the run
// recorded (whose label names the storage it was taken in): "storage-bf16-..." in bf16 (the
// base rounded), "storage-f32-..." in fp32; `otherwise` when none is recorded. The model is then
// held as weight_storage() says (Model::set_storage_dtype).
DType fingerprint_storage(const std::string& recorded, DType otherwise);

// Every field of the options, alone and together, checked once before anything is created: a bad
// value throws zof::Error naming the flag and the fix. (That --batch covers every data-parallel
// replica is checked once the ranks are known.) Numbers are checked against the rules of
// train_flag_rule: "--steps must be a whole number of at least 1, not 0". new_run: also refuse
// flags a new run would silently not use (--eps with --estimator jvp); a saved run's options
// (run.json, which an older zof may have written with them) pass without.
void validate_options(const TrainOptions& opt, bool new_run = true);



// The device memory budget of --gpu-mem in bytes (0: none given; the device's free memory).
uint64_t device_memory_budget(const TrainOptions& opt);
// --host-mem / --offload-dir: the host budget in bytes (0: none given), the flags' combinations
// checked (the directory itself is checked by the trainer once the model is known).
uint64_t host_memory_budget(const TrainOptions& opt);

// The engine's options from the run's (which passed validate_options).
ZOStepOptions zo_step_options(const TrainOptions& opt);

// Learning rate at step (0-based) under the options' schedule and warm-up.
float learning_rate(const TrainOptions& opt, int64_t step);

// What the step loop reports to a sink after each step (on rank 0).
struct StepReport {
  int64_t step = 0;        // steps done: the step just finished is step - 1
  int64_t steps = 0;       // the run's --steps
  int64_t first_step = 0;  // where this process started (a resumed run: the checkpoint's step)
  bool evaluated = false;  // an evaluation ran after this step
  double recent_loss = 0;  // mean training loss of the last 50 finite steps (NaN: none yet)
  std::string metric;      // the latest evaluation ("ppl", "accuracy", "nll") and its value
  double metric_value = 0;
  double tokens_per_s = 0;  // over the run's steps so far (resumed runs included)
  double elapsed_s = 0;     // wall time since this process's first step
  const nlohmann::json* record = nullptr;  // the step's metrics.jsonl record
};

// Where a run's progress goes: the terminal (make_terminal_sink), or a caller's own (a Python
// binding's on_step callback). Called on rank 0 only.
class TrainSink {
 public:
  virtual ~TrainSink() = default;
  // One line for the user: the run's description, evaluations, skipped steps, interruptions.
  virtual void message(const std::string& line) = 0;
  // After every step. true asks the run to stop as SIGINT does (a checkpoint, then a summary
  // with "interrupted"): the request joins the next step's reduction, so that every rank of
  // the job stops after that same step.
  virtual bool on_step(const StepReport& report) = 0;
  virtual void finish() = 0;  // the loop is over (the terminal ends its progress line)
};

// Progress on stderr: a line every 2% of the steps and at evaluations, or one line rewritten in
// place after every step when stderr is a terminal.
std::unique_ptr<TrainSink> make_terminal_sink();

// Runs (or resumes) a fine-tuning run; returns the final JSON summary. Throws zof::Error.
// Started by mpirun, the ranks of the job train one model together (see TrainOptions); rank 0
// alone writes the run directory and returns the summary, the other ranks return
// {"rank": r} only. sink: rank 0's progress (null: the terminal).
// given: the options the caller set (GivenOptions), for --resume's rule; null: none checked.
nlohmann::json finetune(TrainOptions opt, TrainSink* sink = nullptr,
                        const GivenOptions* given = nullptr);

// Rebuilds fine-tuned weights from a base model and a run's step log; writes a model directory.
// The log must be the run's: as long as, and hashing to, what the run's latest checkpoint (else
// its summary.json, else run.json's --steps) records. steps > 0 rebuilds only the log's first
// `steps` steps (replay --steps), which a cut log may then hold.
nlohmann::json replay(const std::string& base_model, const std::string& run_dir,
                      const std::string& out_dir, int threads, int64_t steps = 0);

// The tensor group of the world's rank in grid: what the tensor-parallel forward
// (zof/tensor_parallel.h) exchanges through, over dist::group_all_gather. finetune and
// zof eval --tensor-parallel use it.
std::unique_ptr<tp::Group> make_tensor_group(dist::Communicator& world, const dist::Grid& grid);

}  // namespace zof
