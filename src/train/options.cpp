// The run's options: their one validation, their JSON form in run.json, the ZO engine's options
// they give, and the learning-rate schedule.
#include <cmath>
#include <cstdio>

#include "zof/data.h"
#include "zof/error.h"
#include "zof/streaming.h"
#include "zof/trainer.h"

using json = nlohmann::json;

namespace zof {

namespace {

// A choice option's value among the table's words: "--z must be gaussian or rademacher, not 'x'".
void check_choice(const TrainOptions& o, const char* key) {
  const OptionSpec* s = find_option(key);
  ZOF_ASSERT(s != nullptr && !s->choices.empty());
  const std::string v = s->get(o).get<std::string>();
  for (const char* c : s->choices)
    if (v == c) return;
  std::string words;
  for (size_t i = 0; i < s->choices.size(); ++i)
    words += std::string(i == 0 ? "" : i + 1 == s->choices.size() ? " or " : ", ") + s->choices[i];
  throw Error(s->flag() + " must be " + words + ", not '" + v + "'");
}

const NumberRule& rule_of(const char* flag) {
  const NumberRule* r = train_flag_rule(flag);
  ZOF_ASSERT(r != nullptr);
  return *r;
}

}  // namespace


// The flags a user can get wrong first (estimator, optimizer, device), then the sizes: the
// order in which the errors have always come. The layout's numbers come first of all, since the
// combinations below read them.
void validate_options(const TrainOptions& o, bool new_run) {
  check_real("--dist-timeout", o.dist_timeout, rule_of("--dist-timeout"));
  check_whole("--threads", o.threads, rule_of("--threads"));
  check_whole("--pipeline-stages", o.pipeline_stages, rule_of("--pipeline-stages"));
  (void)task_kind(o.task);  // the message lists the tasks
  check_choice(o, "estimator");
  // The JVP walk has no stage split (its tangents would have to cross ranks too).
  ZOF_CHECK(o.estimator != "jvp" || o.pipeline_stages == 1,
            "--estimator jvp does not support --pipeline-stages > 1; use --pipeline-stages 1 "
            "(data parallel only) or --estimator spsa");
  check_choice(o, "z");
  check_real("--sparsity", o.sparsity, rule_of("--sparsity"));
  check_choice(o, "optimizer");
  ZOF_CHECK(o.optimizer == "sgd" || o.pipeline_stages == 1,
            "--optimizer " + o.optimizer + " keeps state per parameter, which --pipeline-stages "
            "> 1 does not gather for checkpoints yet; use --optimizer sgd or one stage");
  check_real("--beta1", o.beta1, rule_of("--beta1"));
  check_real("--beta2", o.beta2, rule_of("--beta2"));
  check_real("--adam-eps", o.adam_eps, rule_of("--adam-eps"));
  ZOF_CHECK(o.estimator != "jvp" || (o.z == "gaussian" && !o.one_sided && o.sparsity == 0.f),
            "--estimator jvp takes Gaussian, dense directions: drop --z, --one-sided and "
            "--sparsity, or use --estimator spsa");
  (void)device_memory_budget(o);
  check_whole("--steps", o.steps, rule_of("--steps"));
  check_whole("--batch", o.batch, rule_of("--batch"));
  check_whole("--micro-batches", o.micro_batches, rule_of("--micro-batches"));
  ZOF_CHECK(o.micro_batches <= o.batch,
            "--micro-batches must be a whole number from 1 to --batch (" +
                std::to_string(o.batch) + "), not " + std::to_string(o.micro_batches));
  check_whole("--queries", o.queries, rule_of("--queries"));
  check_real("--lr", o.lr, rule_of("--lr"));
  check_real("--eps", o.eps, rule_of("--eps"));
  // The forward gradient takes no finite difference: an --eps would be silently unused.
  ZOF_CHECK(!new_run || o.estimator != "jvp" || o.eps == TrainOptions().eps,
            "--estimator jvp computes the directional derivative exactly and takes no --eps "
            "(the finite-difference step of spsa): drop --eps, or use --estimator spsa");
  check_real("--weight-decay", o.weight_decay, rule_of("--weight-decay"));
  check_choice(o, "schedule");
  check_whole("--warmup", o.warmup, rule_of("--warmup"));
  // A warm-up longer than the run never reaches --lr (nor starts the schedule's decay).
  ZOF_CHECK(!new_run || o.warmup <= o.steps,
            "--warmup " + std::to_string(o.warmup) + " is longer than the run's --steps " +
                std::to_string(o.steps) + ", so the learning rate would never reach --lr: give "
                "--warmup " + std::to_string(o.steps) + " or less");
  check_whole("--eval-every", o.eval_every, rule_of("--eval-every"));
  check_whole("--save-every", o.save_every, rule_of("--save-every"));
  check_whole("--train-examples", o.train_examples, rule_of("--train-examples"));
  check_whole("--eval-examples", o.eval_examples, rule_of("--eval-examples"));
  check_whole("--seq-len", o.seq_len, rule_of("--seq-len"));
  check_whole("--max-bad-steps", o.max_bad_steps, rule_of("--max-bad-steps"));
  check_whole("--round-every", o.round_every, rule_of("--round-every"));
  check_choice(o, "objective");
  const bool candidates = o.task == "sst2" || o.task == "rte" || o.task == "cb" || o.task == "copa";
  ZOF_CHECK(o.objective != "classification" || candidates,
            "--objective classification compares a task's candidate answers, and --task " +
                o.task + " has none; use it with sst2, rte, cb or copa, or --objective lm");
  check_choice(o, "dtype");
  check_choice(o, "save_dtype");
  check_choice(o, "master");
  // A rounding window (ZOStepOptions::round_every) sums ZO-SGD's updates on a bf16 master
  // (window_closes_after).
  if (o.round_every > 1) {
    const std::string n = std::to_string(o.round_every);
    ZOF_CHECK(o.master == "bf16", "--round-every " + n + " rounds a bf16 master once every " +
                                      n + " steps: add --master bf16, or drop --round-every");
    ZOF_CHECK(o.optimizer == "sgd",
              "--round-every sums ZO-SGD's updates, and --optimizer " + o.optimizer +
                  " updates through its state every step: use --optimizer sgd, or drop "
                  "--round-every");
    ZOF_CHECK(o.estimator == "spsa",
              "--round-every is for the SPSA estimator (--estimator spsa); the JVP estimator "
              "keeps its master in fp32 storage: drop --round-every");
    // A resumed run's window is its run.json's (auto resolved when it started); only the
    // layout may change.
    ZOF_CHECK(o.pipeline_stages == 1,
              new_run ? "--round-every does not combine with --pipeline-stages > 1; use "
                        "--pipeline-stages 1 (data parallel only), or drop --round-every"
                      : "--pipeline-stages " + std::to_string(o.pipeline_stages) +
                            ": this run rounds its bf16 master once every " + n +
                            " steps (run.json's round_every), which pipeline stages do not do; "
                            "resume it with --pipeline-stages 1 (data parallel only)");
    ZOF_CHECK(o.round_every * o.queries <= 128,
              "--round-every " + n + " with --queries " + std::to_string(o.queries) + " sums " +
                  std::to_string(o.round_every * o.queries) + " directions in a pass, more than "
                  "the 128 a pass takes: lower --round-every or --queries");
  }
  ZOF_CHECK(o.estimator != "jvp" || training_objective(o) == "lm",
            "--estimator jvp differentiates the token loss only, not --objective "
            "classification" +
                std::string(o.objective == "auto" ? " (MeZO's choice for --task " + o.task +
                                                        ", the default)"
                                                  : "") +
                "; add --objective lm, or use --estimator spsa");
}

// --gpu-mem / --sim-device / --device: the device budget in bytes (0: none given).
uint64_t device_memory_budget(const TrainOptions& o) {
  check_choice(o, "device");
  ZOF_CHECK(o.device == "cpu" || !o.sim_device,
            "--sim-device simulates a GPU on the CPU: drop it with --device cuda");
  ZOF_CHECK(!o.tf32 || o.device == "cuda",
            "--tf32 runs a GPU's fp32 products on TF32 tensor cores: it needs --device cuda");
  const bool device = o.sim_device || o.device == "cuda";
  const uint64_t bytes = o.gpu_mem.empty() ? 0 : parse_memory_size(o.gpu_mem, "--gpu-mem");
  if (!device) {
    ZOF_CHECK(o.gpu_mem.empty(),
              "--gpu-mem budgets device memory, and --device cpu has none; add --device cuda, or "
              "--sim-device to run the streaming schedule on the simulated device");
    return 0;
  }
  ZOF_CHECK(o.pipeline_stages == 1,
            "--gpu-mem / --sim-device / --device cuda (parameter streaming) do not combine with "
            "--pipeline-stages > 1; use --pipeline-stages 1 (data parallel only)");
  return bytes;
}

DType save_dtype(const TrainOptions& o, const Model& model) {
  if (o.save_dtype == "bf16") return DType::BF16;
  if (o.save_dtype == "f16") return DType::F16;
  if (o.save_dtype == "input") return model.stored_dtype();
  if (o.save_dtype == "auto" && o.master == "bf16") return DType::BF16;  // auto: the master's
  return DType::F32;
}

DType weight_storage(const TrainOptions& o) {
  if (o.master != "bf16") return DType::F32;
  return o.estimator != "jvp" && o.pipeline_stages == 1 ? DType::BF16 : DType::F32;
}

int64_t round_every_of(const TrainOptions& o) {
  if (o.round_every > 0) return o.round_every;
  // auto: a window of 8 wherever one applies (a bf16 master's ZO-SGD, one stage), no wider
  // than the 128 directions a pass takes.
  const bool applies = o.master == "bf16" && o.optimizer == "sgd" && o.estimator == "spsa" &&
                       o.pipeline_stages == 1;
  return applies ? std::max<int64_t>(1, std::min<int64_t>(8, 128 / std::max<int64_t>(1, o.queries)))
                 : 1;
}

bool window_closes_after(const TrainOptions& o, int64_t step) {
  const int64_t next = step + 1, k = round_every_of(o);
  auto at = [&](int64_t every) { return every > 0 && next % every == 0; };
  return k <= 1 || at(k) || at(o.eval_every) || at(o.save_every) || next >= o.steps;
}

DType fingerprint_storage(const std::string& recorded, DType otherwise) {
  if (recorded.rfind("storage-bf16-", 0) == 0) return DType::BF16;
  if (recorded.rfind("storage-f32-", 0) == 0) return DType::F32;
  return otherwise;
}

ZOStepOptions zo_step_options(const TrainOptions& o) {
  ZOStepOptions zo;
  zo.eps = o.eps;
  zo.weight_decay = o.weight_decay;
  zo.queries = o.queries;
  zo.seed = o.seed;
  zo.dist = o.z == "rademacher" ? kZRademacher : kZGaussian;
  zo.one_sided = o.one_sided;
  zo.sparsity = o.sparsity;
  zo.optimizer = o.optimizer == "adam"       ? ZOStepOptions::Optimizer::Adam
                 : o.optimizer == "momentum" ? ZOStepOptions::Optimizer::Momentum
                                             : ZOStepOptions::Optimizer::SGD;
  zo.beta1 = o.beta1;
  zo.beta2 = o.beta2;
  zo.adam_eps = o.adam_eps;
  // The JVP walk estimates g itself: the engine only applies the updates.
  zo.perturb = o.estimator != "jvp";
  // finetune() resolves auto first (run.json holds the word); replay applies updates only,
  // which no dtype changes.
  zo.compute = o.dtype == "bf16" ? DType::BF16 : DType::F32;
  zo.master = o.master == "bf16" ? DType::BF16 : DType::F32;
  zo.round_every = (int)round_every_of(o);
  return zo;
}

float learning_rate(const TrainOptions& o, int64_t step) {
  if (o.warmup > 0 && step < o.warmup) return o.lr * (float)(step + 1) / (float)o.warmup;
  const int64_t decay_steps = std::max<int64_t>(1, o.steps - o.warmup);
  const double t = std::min(1.0, (double)(step - o.warmup) / (double)decay_steps);
  if (o.schedule == "linear") return (float)(o.lr * (1.0 - t));
  if (o.schedule == "cosine") return (float)(o.lr * 0.5 * (1.0 + std::cos(M_PI * t)));
  return o.lr;
}

}  // namespace zof
