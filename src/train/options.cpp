// The run's options: their one validation, their JSON form in run.json, the ZO engine's options
// they give, and the learning-rate schedule.
#include <cmath>

#include "zof/error.h"
#include "zof/streaming.h"
#include "zof/trainer.h"

using json = nlohmann::json;

namespace zof {

// The flags a user can get wrong first (estimator, optimizer, device), then the sizes: the
// order in which the errors have always come.
void validate_options(const TrainOptions& o) {
  ZOF_CHECK(o.dist_timeout >= 0 && std::isfinite(o.dist_timeout),
            "--dist-timeout must be a non-negative number of seconds (0: wait for ever)");
  ZOF_CHECK(o.estimator == "spsa" || o.estimator == "jvp",
            "--estimator must be spsa or jvp, not '" + o.estimator + "'");
  // The JVP walk has no stage split (its tangents would have to cross ranks too).
  ZOF_CHECK(o.estimator != "jvp" || o.pipeline_stages == 1,
            "--estimator jvp does not support --pipeline-stages > 1; use --pipeline-stages 1 "
            "(data parallel only) or --estimator spsa");
  ZOF_CHECK(o.z == "gaussian" || o.z == "rademacher",
            "--z must be gaussian or rademacher, not '" + o.z + "'");
  ZOF_CHECK(o.sparsity >= 0.f && o.sparsity < 1.f,
            "--sparsity must be in [0, 1) (the fraction of each weight matrix left unperturbed), "
            "not " + std::to_string(o.sparsity));
  ZOF_CHECK(o.optimizer == "sgd" || o.optimizer == "momentum" || o.optimizer == "adam",
            "--optimizer must be sgd, momentum or adam, not '" + o.optimizer + "'");
  ZOF_CHECK(o.optimizer == "sgd" || o.pipeline_stages == 1,
            "--optimizer " + o.optimizer + " keeps state per parameter, which --pipeline-stages "
            "> 1 does not gather for checkpoints yet; use --optimizer sgd or one stage");
  ZOF_CHECK(o.beta1 >= 0.f && o.beta1 < 1.f, "--beta1 must be in [0, 1)");
  ZOF_CHECK(o.beta2 >= 0.f && o.beta2 < 1.f, "--beta2 must be in [0, 1)");
  ZOF_CHECK(o.adam_eps > 0.f, "--adam-eps must be positive");
  ZOF_CHECK(o.estimator != "jvp" || (o.z == "gaussian" && !o.one_sided && o.sparsity == 0.f),
            "--estimator jvp takes Gaussian, dense directions: drop --z, --one-sided and "
            "--sparsity, or use --estimator spsa");
  (void)device_memory_budget(o);
  ZOF_CHECK(o.steps >= 1, "--steps must be at least 1");
  ZOF_CHECK(o.batch >= 1, "--batch must be at least 1");
  ZOF_CHECK(o.micro_batches >= 1 && o.micro_batches <= o.batch,
            "--micro-batches must be between 1 and --batch");
  ZOF_CHECK(o.lr >= 0 && std::isfinite(o.lr), "--lr must be a non-negative number");
  ZOF_CHECK(o.schedule == "constant" || o.schedule == "linear" || o.schedule == "cosine",
            "--schedule must be constant, linear or cosine, not '" + o.schedule + "'");
  ZOF_CHECK(o.objective == "auto" || o.objective == "lm" || o.objective == "classification",
            "--objective must be auto, lm or classification, not '" + o.objective + "'");
  const bool candidates = o.task == "sst2" || o.task == "rte" || o.task == "cb" || o.task == "copa";
  ZOF_CHECK(o.objective != "classification" || candidates,
            "--objective classification compares a task's candidate answers, and --task " +
                o.task + " has none; use it with sst2, rte, cb or copa, or --objective lm");
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
  ZOF_CHECK(o.device == "cpu" || o.device == "cuda",
            "--device must be cpu or cuda, not '" + o.device + "'");
  ZOF_CHECK(o.device == "cpu" || !o.sim_device,
            "--sim-device simulates a GPU on the CPU: drop it with --device cuda");
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
  return zo;
}

json TrainOptions::to_json() const {
  return nlohmann::json{{"model", model},
              {"task", task},
              {"objective", objective},
              {"data", data},
              {"out", out},
              {"steps", steps},
              {"lr", lr},
              {"eps", eps},
              {"weight_decay", weight_decay},
              {"batch", batch},
              {"micro_batches", micro_batches},
              {"queries", queries},
              {"seed", seed},
              {"schedule", schedule},
              {"estimator", estimator},
              {"z", z},
              {"one_sided", one_sided},
              {"sparsity", sparsity},
              {"optimizer", optimizer},
              {"beta1", beta1},
              {"beta2", beta2},
              {"adam_eps", adam_eps},
              {"warmup", warmup},
              {"eval_every", eval_every},
              {"save_every", save_every},
              {"train_examples", train_examples},
              {"eval_examples", eval_examples},
              {"seq_len", seq_len},
              {"max_bad_steps", max_bad_steps}};
}

TrainOptions TrainOptions::from_json(const nlohmann::json& j) {
  TrainOptions o;
  auto get = [&](const char* k, auto& v) {
    if (j.contains(k)) j.at(k).get_to(v);
  };
  get("model", o.model);
  get("task", o.task);
  // Runs from before --objective trained every task on the answer's tokens.
  o.objective = "lm";
  get("objective", o.objective);
  get("data", o.data);
  get("out", o.out);
  get("steps", o.steps);
  get("lr", o.lr);
  get("eps", o.eps);
  get("weight_decay", o.weight_decay);
  get("batch", o.batch);
  get("micro_batches", o.micro_batches);
  get("queries", o.queries);
  get("seed", o.seed);
  get("schedule", o.schedule);
  get("estimator", o.estimator);  // absent in runs from before --estimator: spsa
  get("z", o.z);                  // absent in older runs: the defaults (MeZO)
  get("one_sided", o.one_sided);
  get("sparsity", o.sparsity);
  get("optimizer", o.optimizer);
  get("beta1", o.beta1);
  get("beta2", o.beta2);
  get("adam_eps", o.adam_eps);
  get("warmup", o.warmup);
  get("eval_every", o.eval_every);
  get("save_every", o.save_every);
  get("train_examples", o.train_examples);
  get("eval_examples", o.eval_examples);
  get("seq_len", o.seq_len);
  get("max_bad_steps", o.max_bad_steps);
  return o;
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
