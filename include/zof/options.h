// The options of `zof finetune` and the one table that describes them (train_options()): each
// option's name, type, default, accepted values, help text, whether run.json saves it and what a
// run from before it existed computed. The CLI's flags and --config lines, run.json's "options",
// Python's keywords and docstring, the validation of single values and --resume's rule are all
// read from it, so a new option is a field here and one entry in src/options/option_table.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "zof/choices.h"
#include "zof/number_rule.h"

namespace zof {

// The options of `zof finetune`, one field per flag (--micro-batches: micro_batches). What each
// numeric field accepts is its train_flag_rule; validate_options checks them all, alone and
// together.
struct TrainOptions {
  std::string model;
  Task task = Task::Text;
  std::string data, out;
  // What a candidate task trains on (training_objective): lm, the correct answer's tokens; or
  // classification, MeZO's cross-entropy over the candidates (LossBatch::choices); auto:
  // MeZO's choice for the task.
  Objective objective = Objective::Auto;
  // The type of the matrix products (--dtype): fp32, bf16, or auto (bf16 where it is faster:
  // AMX, tensor cores). A new run records the resolved choice; runs from before it were fp32.
  ComputeChoice dtype = ComputeChoice::Auto;
  // The saved model's tensors (--save-dtype): fp32, bf16, f16, input (the input model's dtype),
  // or auto, the master weights' dtype (--master), which keeps every update. The evaluation after
  // the run scores the weights rounded so: what is saved is what was evaluated. Runs from
  // before the flag saved as the input.
  SaveChoice save_dtype = SaveChoice::Auto;
  // The fine-tuned model's file (--save-format): safetensors (a Hugging Face directory: the run
  // directory holds config.json, model.safetensors and the tokenizer's files) or gguf (the run
  // directory's model.gguf, which llama.cpp loads; save_dtype's F32, F16 or BF16 matrices).
  // Runs from before the flag saved safetensors.
  SaveFormat save_format = SaveFormat::Safetensors;
  // The master weights (--master): fp32, or bf16 (updates rounded back stochastically, bits
  // from (seed, step, tensor, element): ZOStepOptions::master). Runs from before it were fp32.
  MasterChoice master = MasterChoice::Fp32;
  // --tf32: with --device cuda, the fp32 products on TF32 tensor cores (saved: it changes what
  // a run computes; off, fp32 is strict).
  bool tf32 = false;
  int64_t steps = 1000;
  float lr = 1e-6f, eps = 1e-3f, weight_decay = 0.f;
  int64_t batch = 16;        // examples (or text windows) per step
  int64_t micro_batches = 1; // gradient accumulation: the batch is split into this many
  int queries = 1;
  uint64_t seed = 0;
  Schedule schedule = Schedule::Constant;
  EstimatorChoice estimator = EstimatorChoice::Spsa;  // two-point MeZO, or jvp.h
  // The ZO estimator's direction and the optimizer (ZOStepOptions; zo.h).
  ZChoice z = ZChoice::Gaussian;
  bool one_sided = false;             // (L(theta + eps z) - L(theta)) / eps
  float sparsity = 0.f;               // Sparse MeZO: fraction of each matrix left unperturbed
  int64_t low_rank = 0;               // LOZO: rank of each matrix's z (0: dense)
  int64_t low_rank_every = 50;        // LOZO: steps between draws of the factor V
  OptimizerChoice optimizer = OptimizerChoice::Sgd;
  float beta1 = 0.9f, beta2 = 0.999f, adam_eps = 1e-8f;
  int64_t warmup = 0;                 // steps of linear warm-up
  int64_t eval_every = 0;             // 0: only before and after
  int64_t save_every = 0;             // 0: only at the end (and on SIGINT/SIGTERM)
  int64_t train_examples = 1000, eval_examples = 500;
  int64_t seq_len = 128;              // text windows; max sequence length for tasks
  int64_t max_bad_steps = 10;         // consecutive non-finite losses before giving up
  // --round-every: a bf16 master rounded once every N steps (ZOStepOptions::round_every); 0,
  // auto: 8 where a window applies (round_every_of), else 1. A new run records the number.
  int64_t round_every = 0;
  int threads = 0;
  bool json = false;
  bool no_report = false;  // --no-report: no report.html at the end (not saved: output only)
  std::string resume;  // run directory to continue
  // How the job is laid out, not what it computes (not saved in run.json: a run may resume on
  // another number of ranks or stages). Under mpirun, ranks = pipeline_stages x replicas; each
  // step's batch is split across replicas (data parallel) and the blocks across stages.
  int pipeline_stages = 1;
  // Tensor parallel (zof/tensor_parallel.h): each tensor group of this many consecutive ranks
  // holds one slice of every matrix; ranks = tensor x data-parallel replicas.
  int tensor_parallel = 1;
  double dist_timeout = 600;  // seconds a rank may wait on the others before the job aborts
  // Parameter streaming (streaming.h), layout too: the device memory budget --gpu-mem ("16GiB",
  // "512MiB", bytes; empty: what the device has free), and --sim-device: run on the simulated
  // device (host memory with that budget, sim_device.h), the streaming schedule without a GPU.
  std::string gpu_mem;
  bool sim_device = false;
  // The disk tier (disk_tier.h), layout too: --host-mem, the host memory budget for the master
  // weights and the optimizer state (empty: no budget, everything in RAM); the blocks beyond it
  // live in --offload-dir (empty: offload/ in the run directory).
  std::string host_mem, offload_dir;
  // --write-back-every: a disk-resident block written back once every N steps, rebuilt from the
  // window's updates between (ZOStepOptions::write_back_every; no bit changes).
  int64_t write_back_every = 1;
  // Where the steps run: cpu (the host backend, weights in the model's storage) or cuda (the
  // CUDA backend; the weights stream from host memory within --gpu-mem, resident if they fit).
  DeviceChoice device = DeviceChoice::Cpu;

  // run.json's "options": the saved entries of train_options(), by key. from_json takes what an
  // older zof wrote: a missing entry is its `before` value (what runs from before it computed).
  nlohmann::json to_json() const;
  static TrainOptions from_json(const nlohmann::json& j);
};

// One entry of the table.
struct OptionSpec {
  const char* key;  // the field and Python's keyword: "micro_batches" (flag --micro-batches)
  // The field it sets, by type: text (a path, a size), a choice among words (choices.h), a
  // switch, or a number.
  std::variant<std::string TrainOptions::*, Task TrainOptions::*, Objective TrainOptions::*,
               ComputeChoice TrainOptions::*, SaveChoice TrainOptions::*,
               SaveFormat TrainOptions::*,
               MasterChoice TrainOptions::*, Schedule TrainOptions::*,
               EstimatorChoice TrainOptions::*, ZChoice TrainOptions::*,
               OptimizerChoice TrainOptions::*, DeviceChoice TrainOptions::*,
               bool TrainOptions::*, int TrainOptions::*, int64_t TrainOptions::*,
               uint64_t TrainOptions::*, float TrainOptions::*, double TrainOptions::*>
      field;
  const char* help;
  // The words a choice accepts (empty: all of its enum's; train_options() fills them in). Any
  // other text is refused as it is read: "--z must be gaussian or rademacher, not 'x'".
  std::vector<const char*> choices = {};
  // Saved in run.json: what a run computes (a resumed run keeps it; --resume refuses a change).
  // The others are where and how it runs (threads, ranks, device, output) and may change.
  bool saved = true;
  // The value a run.json written before the option existed means (null: the default).
  nlohmann::json before = nullptr;

  std::string flag() const;                           // "--micro-batches"
  const NumberRule* rule() const;                     // numbers: train_flag_rule(flag())
  nlohmann::json get(const TrainOptions& o) const;   // the field's value as JSON
  // The field from text, read as the CLI reads the flag's value (number_rule.h): zof::Error
  // with the flag's rule, or a switch's "true"/"false".
  void set(TrainOptions& o, const std::string& text) const;
  void set(TrainOptions& o, const nlohmann::json& value) const;  // a value of get()'s type
};

// Every option of `zof finetune`, in the order --help lists them.
const std::vector<OptionSpec>& train_options();
// The objective a run trains on: lm or classification. auto is MeZO's choice
// (--train_as_classification for SST-2, RTE and CB; not for COPA, nor for jsonl and text, which
// have no candidates to compare).
Objective training_objective(const TrainOptions& o);
// Whether a task's examples have candidate answers to compare (sst2, rte, cb, copa).
bool has_candidates(Task t);

// The rule of a numeric `zof finetune` flag ("--steps"); null for the others.
const NumberRule* train_flag_rule(const std::string& flag);
// The entry for a key; null for none.
const OptionSpec* find_option(const std::string& key);

// "--micro-batches" for the key micro_batches.
std::string option_flag(const std::string& key);
// Sets the option named key from text (OptionSpec::set); zof::Error for an unknown key.
void set_train_option(TrainOptions& o, const std::string& key, const std::string& text);

// The options a caller set (CLI flags given, Python keywords), each with where it came from
// ("--config FILE line N"; empty: the command line). --resume continues a run with the options in
// its run.json: a given option that would change one of them would be ignored, so finetune()
// refuses it; one that restates the run's value, an "auto" that the run resolved when it started
// (--dtype, --save-dtype, --round-every) and the layout options (threads, ranks, device, output)
// pass.
using GivenOptions = std::map<std::string, std::string>;

}  // namespace zof
