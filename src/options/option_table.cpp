// The table of `zof finetune`'s options (zof/options.h): one entry per option, from which the
// CLI declares its flags, run.json is written and read, Python takes its keywords, single values
// are read and checked, and --resume's rule knows what a run saved.
#include <cmath>
#include <type_traits>

#include "zof/error.h"
#include "zof/options.h"

using json = nlohmann::json;

namespace zof {
namespace {

using O = TrainOptions;

constexpr int64_t kMaxRows = int64_t(1) << 20;  // --batch, --seq-len: far beyond any model's use

// The numeric flags of `zof finetune` and what each accepts.
struct FlagRule {
  const char* flag;
  NumberRule rule;
};
const FlagRule kTrainRules[] = {
    // z and the step log key steps by a 32-bit counter (ZKey::step).
    {"--steps", {.whole = true, .lo = 1, .hi = 4294967295.0}},
    {"--batch", {.whole = true, .lo = 1, .hi = double(kMaxRows)}},
    {"--micro-batches", {.whole = true, .lo = 1, .hi = double(kMaxRows)}},
    {"--queries", {.whole = true, .lo = 1, .hi = 1024}},
    {"--lr", {.lo = 0}},
    {"--eps", {.lo = 0, .lo_open = true, .note = "the perturbation's scale"}},
    {"--weight-decay", {.lo = 0}},
    {"--sparsity",
     {.lo = 0, .hi = 1, .hi_open = true,
      .note = "the fraction of each weight matrix left unperturbed"}},
    {"--low-rank", {.whole = true, .lo = 0, .hi = 64, .note = "0: dense directions"}},
    {"--low-rank-every", {.whole = true, .lo = 1, .hi = 4294967295.0}},
    {"--beta1", {.lo = 0, .hi = 1, .hi_open = true}},
    {"--beta2", {.lo = 0, .hi = 1, .hi_open = true}},
    {"--adam-eps", {.lo = 0, .lo_open = true}},
    {"--warmup", {.whole = true, .lo = 0}},
    {"--eval-every", {.whole = true, .lo = 0, .note = "0: before and after only"}},
    {"--save-every", {.whole = true, .lo = 0, .note = "0: at the end only"}},
    {"--train-examples", {.whole = true, .lo = 1}},
    {"--eval-examples", {.whole = true, .lo = 1}},
    {"--seq-len", {.whole = true, .lo = 2, .hi = double(kMaxRows)}},
    {"--max-bad-steps", {.whole = true, .lo = 1}},
    {"--round-every",
     {.whole = true, .lo = 0, .hi = 128, .note = "0: auto; 1: every update rounded"}},
    {"--threads", {.whole = true, .lo = 0, .hi = 4096, .note = "0: all cores"}},
    {"--pipeline-stages", {.whole = true, .lo = 1, .hi = 4096}},
    {"--tensor-parallel", {.whole = true, .lo = 1, .hi = 4096}},
    {"--write-back-every", {.whole = true, .lo = 1, .hi = 1024}},
    {"--dist-timeout", {.lo = 0, .note = "seconds; 0: wait for ever"}},
};

const char* const kDtypeHelp =
    "Matrix products in bf16 (weights rounded to bf16, fp32 accumulation) or fp32; auto: bf16 "
    "where it is faster (AMX CPUs, GPU tensor cores), else fp32";

// What a run computes (saved in run.json), then where and how it runs (not saved: a resumed run
// may change them), in the order --help lists them. Built on first use: no dependence on the
// order in which other files' static initializers run.
const std::vector<OptionSpec>& options_table() {
  static const std::vector<OptionSpec> table = {
      {"model", &O::model, "Hugging Face model directory, or a GGUF file (llama architecture)"},
      {"resume", &O::resume,
       "Continue the run in this directory with its saved options (a flag that would change one "
       "is refused; --threads, --json, --no-report and the mpirun and device flags may change)",
       {}, false},
      {"task", &O::task, "text | sst2 | rte | cb | copa | jsonl"},
      {"data", &O::data, "Data file or directory of the task"},
      // Runs from before --objective trained every task on the answer's tokens.
      {"objective", &O::objective,
       "What sst2/rte/cb/copa train on: lm (the correct answer's tokens) | classification (MeZO's "
       "cross-entropy over the candidates' mean log-likelihoods) | auto (MeZO's choice: "
       "classification for sst2, rte and cb, lm for copa; lm for text and jsonl)",
       {}, true, "lm"},
      {"out", &O::out, "Run directory: metrics, checkpoints and the fine-tuned model"},
      // Runs from before --dtype computed in fp32.
      {"dtype", &O::dtype, kDtypeHelp, {}, true, "fp32"},
      {"tf32", &O::tf32,
       "With --device cuda: the fp32 products on TF32 tensor cores (off: strict fp32; --dtype bf16 "
       "is faster still)"},
      // Runs from before --save-dtype saved in the input's dtype.
      {"save_dtype", &O::save_dtype,
       "The saved model's tensors: fp32, bf16, f16, input (as the input model), or auto (the "
       "master weights' dtype: every update kept); the final evaluation scores the saved weights",
       {}, true, "input"},
      // Runs from before --save-format saved safetensors.
      {"save_format", &O::save_format,
       "The fine-tuned model's file: safetensors (config.json, model.safetensors and the "
       "tokenizer in the run directory) | gguf (the run directory's model.gguf, which llama.cpp "
       "loads: --save-dtype's F32, F16 or BF16 matrices; a LLaMA-architecture model with a "
       "byte-level BPE tokenizer)",
       {}, true, "safetensors"},
      {"master", &O::master,
       "The master weights: fp32, or bf16 (the model rounded to bf16, each update computed in fp32 "
       "and rounded back stochastically with bits of (seed, step, tensor, element): exact on "
       "resume, replay and data parallel; held in 2 bytes a parameter, streamed in bf16; in fp32 "
       "storage with the JVP estimator or pipeline stages)"},
      {"steps", &O::steps, "ZO steps"},
      {"lr", &O::lr,
       "Learning rate. MeZO's 1e-6 and 1e-7 suit 13B-class models; small models need larger steps "
       "(the demo's stories260K: 1e-4)"},
      {"eps", &O::eps, "Perturbation scale epsilon"},
      {"weight_decay", &O::weight_decay, "Weight decay (not on norms and biases)"},
      {"batch", &O::batch, "Examples (or text windows) per step"},
      {"micro_batches", &O::micro_batches,
       "Split each batch into this many forward passes (gradient accumulation)"},
      {"queries", &O::queries, "Random directions averaged per step"},
      {"seed", &O::seed, "Seed of perturbations and data sampling (0 to 2^64 - 1)"},
      {"schedule", &O::schedule, "constant | linear | cosine"},
      {"estimator", &O::estimator,
       "spsa (two-point MeZO) | jvp (forward gradient: exact directional derivatives by "
       "forward-mode AD, no --eps)"},
      {"z", &O::z, "Perturbation directions: gaussian (MeZO) | rademacher (+-1)"},
      {"one_sided", &O::one_sided,
       "One-sided differences (L(theta+eps z) - L(theta)) / eps: q + 1 forwards per step instead "
       "of 2q"},
      {"sparsity", &O::sparsity,
       "Sparse MeZO: fraction of each weight matrix (largest |theta|) left unperturbed and "
       "unchanged; 0: dense"},
      // Runs from before --low-rank drew dense directions.
      {"low_rank", &O::low_rank,
       "LOZO: each weight matrix's z is U V^T / sqrt(R), Gaussian factors of rank R (vectors "
       "dense): directions in the span of few rank-one matrices; 0: dense (MeZO)",
       {}, true, 0},
      {"low_rank_every", &O::low_rank_every,
       "With --low-rank: draw V (the factor along a matrix's columns) anew every N steps, U every "
       "step (LOZO's lazy V)",
       {}, true, 50},
      {"optimizer", &O::optimizer,
       "sgd (MeZO) | momentum (ZO-SGD with momentum) | adam (ZO-Adam; state in memory, saved with "
       "checkpoints)"},
      {"beta1", &O::beta1, "Momentum / Adam first-moment decay"},
      {"beta2", &O::beta2, "Adam second-moment decay"},
      {"adam_eps", &O::adam_eps, "Adam's denominator epsilon"},
      {"warmup", &O::warmup, "Linear warm-up steps"},
      {"eval_every", &O::eval_every, "Evaluate every N steps (0: before and after only)"},
      {"save_every", &O::save_every, "Checkpoint every N steps (0: at the end only)"},
      {"train_examples", &O::train_examples, "Training examples sampled (MeZO: 1000)"},
      {"eval_examples", &O::eval_examples, "Evaluation examples sampled"},
      {"seq_len", &O::seq_len, "Text window length; longest task sequence"},
      {"max_bad_steps", &O::max_bad_steps, "Stop after this many non-finite steps in a row"},
      // Runs from before --round-every rounded every update.
      {"round_every", &O::round_every,
       "With --master bf16 (ZO-SGD): round the master once every N steps, the steps between summed "
       "in fp32 from their seeds on every pass (up to N z's regenerated): less rounding noise. 0 "
       "(auto): 8 with --master bf16 and ZO-SGD, else 1 (every update rounded). Evaluations, "
       "checkpoints and the end also close a window",
       {}, true, 1},
      // ---- where and how a run runs: not saved ----
      {"threads", &O::threads, "CPU threads (0: all cores)", {}, false},
      {"json", &O::json, "Print one JSON object as the last line", {}, false},
      {"no_report", &O::no_report,
       "Do not write report.html (zof report) into the run directory at the end", {}, false},
      {"pipeline_stages", &O::pipeline_stages,
       "Under mpirun: split the blocks into this many pipeline stages on consecutive ranks (ranks "
       "= stages x data-parallel replicas)",
       {}, false},
      {"tensor_parallel", &O::tensor_parallel,
       "Under mpirun: split every matrix over this many consecutive ranks, Megatron-style (ranks "
       "= T x pipeline stages x data-parallel replicas; the LLaMA family, fp32 on the CPU)",
       {}, false},
      {"dist_timeout", &O::dist_timeout,
       "Under mpirun: seconds a rank may wait on the others before the whole job stops with an "
       "error (0: wait for ever)",
       {}, false},
      {"gpu_mem", &O::gpu_mem,
       "Device memory budget for parameter streaming, e.g. 16GiB, 512MiB or bytes (default: what "
       "the device has free): blocks that fit stay on the device, the rest stream through it each "
       "step (with their momentum/Adam state)",
       {}, false},
      {"device", &O::device,
       "cpu, or cuda: the steps on the GPU, the weights streamed from host memory within "
       "--gpu-mem (all resident if they fit)",
       {"cpu", "cuda"}, false},
      {"host_mem", &O::host_mem,
       "Host memory budget for the master weights and optimizer state, e.g. 8GiB or bytes: "
       "blocks that fit stay in RAM, the rest live in --offload-dir and are read ahead and "
       "written back each step; loading, evaluation, checkpoints and the save go through it "
       "block by block (default: all in RAM where the model fits the free host memory, or its "
       "container's limit, less a margin of 1 GiB and a tenth; else that budget)",
       {}, false},
      {"offload_dir", &O::offload_dir,
       "With --host-mem: the directory (on a local file system) for the blocks beyond it "
       "(default: offload/ in the run directory)",
       {}, false},
      {"write_back_every", &O::write_back_every,
       "With --host-mem and ZO-SGD: write a disk block back once every N steps instead of every "
       "step; the steps between rebuild it from their seeds (up to N - 1 z's regenerated per "
       "weight and pass). The same bits at every N: fewer bytes written for more compute",
       {}, false},
      {"sim_device", &O::sim_device,
       "Run on the simulated device (host memory with the --gpu-mem budget, threads as copy "
       "streams): the streaming schedule without a GPU",
       {}, false},
  };
  static const std::vector<OptionSpec> filled = [] {
    std::vector<OptionSpec> t = table;
    for (OptionSpec& s : t)
      std::visit(
          [&](auto f) {
            using T = std::remove_reference_t<decltype(O{}.*f)>;
            if constexpr (std::is_enum_v<T>)
              if (s.choices.empty())
                for (const char* w : choice_words(T{})) s.choices.push_back(w);
          },
          s.field);
    return t;
  }();
  return filled;
}

}  // namespace

const NumberRule* train_flag_rule(const std::string& flag) {
  for (const auto& r : kTrainRules)
    if (flag == r.flag) return &r.rule;
  return nullptr;
}

std::string option_flag(const std::string& key) {
  std::string f = "--" + key;
  for (auto& c : f) c = c == '_' ? '-' : c;
  return f;
}

std::string OptionSpec::flag() const { return option_flag(key); }

const NumberRule* OptionSpec::rule() const { return train_flag_rule(flag()); }

json OptionSpec::get(const TrainOptions& o) const {
  return std::visit(
      [&](auto f) {
        if constexpr (std::is_enum_v<std::remove_reference_t<decltype(o.*f)>>)
          return json(word(o.*f));
        else
          return json(o.*f);
      },
      field);
}

void OptionSpec::set(TrainOptions& o, const std::string& text) const {
  const std::string name = flag();
  const NumberRule* r = rule();
  const NumberRule any{};
  const NumberRule& rule = r ? *r : any;
  std::visit(
      [&](auto f) {
        using T = std::remove_reference_t<decltype(o.*f)>;
        if constexpr (std::is_same_v<T, std::string>)
          o.*f = text;
        else if constexpr (std::is_enum_v<T>)
          o.*f = read_choice_text<T>(name, text, choices);
        else if constexpr (std::is_same_v<T, bool>)
          o.*f = read_switch_text(name, text);
        else if constexpr (std::is_same_v<T, float>)
          o.*f = read_float_text(name, text, rule);
        else if constexpr (std::is_same_v<T, double>)
          o.*f = read_real_text(name, text, rule);
        else if constexpr (std::is_same_v<T, int>)
          o.*f = read_int_text(name, text, rule);
        else if constexpr (std::is_same_v<T, uint64_t>)
          o.*f = read_seed_text(name, text);
        else
          o.*f = read_whole_text(name, text, rule);
      },
      field);
}

void OptionSpec::set(TrainOptions& o, const json& value) const {
  std::visit(
      [&](auto f) {
        using T = std::remove_reference_t<decltype(o.*f)>;
        if constexpr (std::is_enum_v<T>)
          o.*f = read_choice_text<T>(flag(), value.get<std::string>(), choices);
        else
          value.get_to(o.*f);
      },
      field);
}

const std::vector<OptionSpec>& train_options() { return options_table(); }

const OptionSpec* find_option(const std::string& key) {
  for (const OptionSpec& s : options_table())
    if (key == s.key) return &s;
  return nullptr;
}

bool has_candidates(Task t) {
  return t == Task::Sst2 || t == Task::Rte || t == Task::Cb || t == Task::Copa;
}

Objective training_objective(const TrainOptions& o) {
  if (o.objective != Objective::Auto) return o.objective;
  return has_candidates(o.task) && o.task != Task::Copa ? Objective::Classification
                                                        : Objective::Lm;
}

void set_train_option(TrainOptions& o, const std::string& key, const std::string& text) {
  const OptionSpec* s = find_option(key);
  ZOF_CHECK(s != nullptr, "'" + key + "' is not an option of zof finetune");
  s->set(o, text);
}

// nlohmann::json by name: inside TrainOptions, json is the --json field.
nlohmann::json TrainOptions::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const OptionSpec& s : options_table())
    if (s.saved) j[s.key] = s.get(*this);
  return j;
}

TrainOptions TrainOptions::from_json(const nlohmann::json& j) {
  TrainOptions o;
  for (const OptionSpec& s : options_table()) {
    if (!s.saved) continue;
    if (auto it = j.find(s.key); it != j.end())
      s.set(o, *it);
    else if (!s.before.is_null())
      s.set(o, s.before);  // what a run from before the option computed
  }
  return o;
}

}  // namespace zof
