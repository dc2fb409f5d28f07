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

const NumberRule& rule_of(const char* flag) {
  const NumberRule* r = train_flag_rule(flag);
  ZOF_ASSERT(r != nullptr);
  return *r;
}

}  // namespace


// The combinations a user can get wrong first (estimator, optimizer, device), then the sizes:
// the order in which the errors have always come. The layout's numbers come first of all, since
// the combinations below read them. A choice's word was checked as it was read (choices.h).
void validate_options(const TrainOptions& o, bool new_run) {
  check_real("--dist-timeout", o.dist_timeout, rule_of("--dist-timeout"));
  check_whole("--threads", o.threads, rule_of("--threads"));
  check_whole("--pipeline-stages", o.pipeline_stages, rule_of("--pipeline-stages"));
  const bool jvp = o.estimator == EstimatorChoice::Jvp;
  // The JVP walk has no stage split (its tangents would have to cross ranks too).
  ZOF_CHECK(!jvp || o.pipeline_stages == 1,
            "--estimator jvp does not support --pipeline-stages > 1; use --pipeline-stages 1 "
            "(data parallel only) or --estimator spsa");
  check_real("--sparsity", o.sparsity, rule_of("--sparsity"));
  ZOF_CHECK(o.optimizer == OptimizerChoice::Sgd || o.pipeline_stages == 1,
            std::string("--optimizer ") + word(o.optimizer) + " keeps state per parameter, which "
            "--pipeline-stages > 1 does not gather for checkpoints yet; use --optimizer sgd or "
            "one stage");
  check_whole("--tensor-parallel", o.tensor_parallel, rule_of("--tensor-parallel"));
  if (o.tensor_parallel > 1) {  // what the tensor-parallel step does not do yet, by name
    const std::string t = "--tensor-parallel " + std::to_string(o.tensor_parallel);
    // A resumed run's choices are its run.json's: it resumes without tensor parallel.
    auto refuse_unless = [&](bool ok, const std::string& what, const std::string& fix) {
      ZOF_CHECK(ok, t + " " + what + (new_run ? ": " + fix
                                              : "; this run's run.json asks for it: resume it "
                                                "without --tensor-parallel"));
    };
    refuse_unless(!jvp, "runs the SPSA estimator", "use --estimator spsa");
    ZOF_CHECK(o.device == DeviceChoice::Cpu && !o.sim_device && o.gpu_mem.empty(),
              t + " runs on the CPU for now: drop --device cuda, --sim-device and --gpu-mem");
    refuse_unless(o.dtype != ComputeChoice::Bf16 && o.master != MasterChoice::Bf16,
                  "computes and keeps its master in fp32 for now",
                  "drop --dtype bf16 and --master bf16");
    refuse_unless(!o.one_sided && o.sparsity == 0.f,
                  "draws two-sided directions without Sparse MeZO's mask for now",
                  "drop --one-sided and --sparsity");
    ZOF_CHECK(o.host_mem.empty(),
              t + " holds each rank's slice in host memory: drop --host-mem (the disk tier)");
  }
  check_whole("--low-rank", o.low_rank, rule_of("--low-rank"));
  check_whole("--low-rank-every", o.low_rank_every, rule_of("--low-rank-every"));
  if (o.low_rank > 0) {  // LOZO's factors are Gaussian, drawn where the engine's walk passes
    const std::string r = "--low-rank " + std::to_string(o.low_rank);
    ZOF_CHECK(!jvp, r + " is a direction of the SPSA estimator; the JVP estimator draws dense "
                        "Gaussian tangents: drop --low-rank, or use --estimator spsa");
    ZOF_CHECK(o.z == ZChoice::Gaussian,
              r + " draws Gaussian factors U and V, and --z rademacher +-1 elements: drop "
                  "--z rademacher, or drop --low-rank");
  } else {
    ZOF_CHECK(!new_run || o.low_rank_every == TrainOptions().low_rank_every,
              "--low-rank-every sets how often --low-rank draws its factor V, and --low-rank is "
              "0 (dense directions): add --low-rank R, or drop --low-rank-every");
  }
  check_real("--beta1", o.beta1, rule_of("--beta1"));
  check_real("--beta2", o.beta2, rule_of("--beta2"));
  check_real("--adam-eps", o.adam_eps, rule_of("--adam-eps"));
  ZOF_CHECK(!jvp || (o.z == ZChoice::Gaussian && !o.one_sided && o.sparsity == 0.f),
            "--estimator jvp takes Gaussian, dense directions: drop --z, --one-sided and "
            "--sparsity, or use --estimator spsa");
  (void)device_memory_budget(o);
  (void)host_memory_budget(o);
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
  ZOF_CHECK(!new_run || !jvp || o.eps == TrainOptions().eps,
            "--estimator jvp computes the directional derivative exactly and takes no --eps "
            "(the finite-difference step of spsa): drop --eps, or use --estimator spsa");
  check_real("--weight-decay", o.weight_decay, rule_of("--weight-decay"));
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
  ZOF_CHECK(o.objective != Objective::Classification || has_candidates(o.task),
            std::string("--objective classification compares a task's candidate answers, and "
                        "--task ") + word(o.task) +
                " has none; use it with sst2, rte, cb or copa, or --objective lm");
  // A rounding window (ZOStepOptions::round_every) sums ZO-SGD's updates on a bf16 master
  // (window_closes_after).
  if (o.round_every > 1) {
    const std::string n = std::to_string(o.round_every);
    ZOF_CHECK(o.master == MasterChoice::Bf16, "--round-every " + n + " rounds a bf16 master once every " +
                                      n + " steps: add --master bf16, or drop --round-every");
    ZOF_CHECK(o.optimizer == OptimizerChoice::Sgd,
              std::string("--round-every sums ZO-SGD's updates, and --optimizer ") +
                  word(o.optimizer) +
                  " updates through its state every step: use --optimizer sgd, or drop "
                  "--round-every");
    ZOF_CHECK(!jvp,
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
  ZOF_CHECK(!jvp || training_objective(o) == Objective::Lm,
            "--estimator jvp differentiates the token loss only, not --objective "
            "classification" +
                std::string(o.objective == Objective::Auto
                                ? std::string(" (MeZO's choice for --task ") + word(o.task) +
                                      ", the default)"
                                : "") +
                "; add --objective lm, or use --estimator spsa");
}

// --gpu-mem / --sim-device / --device: the device budget in bytes (0: none given).
uint64_t device_memory_budget(const TrainOptions& o) {
  ZOF_CHECK(o.device != DeviceChoice::Reference,
            "--device must be cpu or cuda, not 'reference'");
  const bool cuda = o.device == DeviceChoice::Cuda;
  ZOF_CHECK(!cuda || !o.sim_device,
            "--sim-device simulates a GPU on the CPU: drop it with --device cuda");
  ZOF_CHECK(!o.tf32 || cuda,
            "--tf32 runs a GPU's fp32 products on TF32 tensor cores: it needs --device cuda");
  const bool device = o.sim_device || cuda;
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

uint64_t host_memory_budget(const TrainOptions& o) {
  ZOF_CHECK(o.offload_dir.empty() || !o.host_mem.empty(),
            "--offload-dir holds the blocks that do not fit --host-mem: add --host-mem SIZE, or "
            "drop --offload-dir");
  check_whole("--write-back-every", o.write_back_every, rule_of("--write-back-every"));
  if (o.write_back_every > 1) {
    const std::string n = "--write-back-every " + std::to_string(o.write_back_every);
    ZOF_CHECK(!o.host_mem.empty(), n + " writes the disk tier's blocks back less often: add "
                                   "--host-mem SIZE, or drop --write-back-every");
    ZOF_CHECK(o.optimizer == OptimizerChoice::Sgd,
              n + " rebuilds a block from ZO-SGD's updates, and --optimizer " +
                  word(o.optimizer) + " updates through its state: use --optimizer sgd, or "
                  "drop --write-back-every");
    ZOF_CHECK(round_every_of(o) == 1,
              n + " does not combine with a bf16 master's rounding window (--round-every " +
                  std::to_string(round_every_of(o)) + " already writes a disk block once a "
                  "window): add --round-every 1, or drop --write-back-every");
    ZOF_CHECK(!o.sim_device && o.device == DeviceChoice::Cpu,
              n + " runs on the host backend for now: drop --sim-device and --device cuda, or "
                  "drop --write-back-every");
  }
  if (o.host_mem.empty()) return 0;
  const uint64_t bytes = parse_memory_size(o.host_mem, "--host-mem");
  ZOF_CHECK(o.estimator == EstimatorChoice::Spsa,
            "--host-mem (the disk tier) runs the SPSA walk only; use --estimator spsa, or drop "
            "--host-mem");
  ZOF_CHECK(o.pipeline_stages == 1,
            "--host-mem (the disk tier) does not combine with --pipeline-stages > 1; use "
            "--pipeline-stages 1");
  // The CUDA backend pins the host masters (cudaHostRegister, cudaHostAlloc): pages the tier
  // gave back would stay pinned, and uploads would read them, not what the tier reads back.
  ZOF_CHECK(o.device != DeviceChoice::Cuda,
            "--host-mem (the disk tier) runs on the host backend and --sim-device for now, not "
            "--device cuda (which pins the host masters); drop --host-mem, or use --device cpu");
  return bytes;
}

DType save_dtype(const TrainOptions& o, const Model& model) {
  switch (o.save_dtype) {
    case SaveChoice::Bf16: return DType::BF16;
    case SaveChoice::F16: return DType::F16;
    case SaveChoice::Input: return model.stored_dtype();
    case SaveChoice::Auto:  // the master's
      return o.master == MasterChoice::Bf16 ? DType::BF16 : DType::F32;
    case SaveChoice::Fp32: break;
  }
  return DType::F32;
}

DType weight_storage(const TrainOptions& o) {
  if (o.master != MasterChoice::Bf16) return DType::F32;
  return o.estimator != EstimatorChoice::Jvp && o.pipeline_stages == 1 ? DType::BF16
                                                                       : DType::F32;
}

int64_t round_every_of(const TrainOptions& o) {
  if (o.round_every > 0) return o.round_every;
  // auto: a window of 8 wherever one applies (a bf16 master's ZO-SGD, one stage), no wider
  // than the 128 directions a pass takes.
  const bool applies = o.master == MasterChoice::Bf16 && o.optimizer == OptimizerChoice::Sgd &&
                       o.estimator == EstimatorChoice::Spsa && o.pipeline_stages == 1;
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
  zo.dist = o.z == ZChoice::Rademacher ? kZRademacher : kZGaussian;
  zo.one_sided = o.one_sided;
  zo.sparsity = o.sparsity;
  zo.low_rank = (uint32_t)o.low_rank;
  zo.low_rank_every = (uint32_t)o.low_rank_every;
  zo.optimizer = o.optimizer == OptimizerChoice::Adam       ? ZOStepOptions::Optimizer::Adam
                 : o.optimizer == OptimizerChoice::Momentum ? ZOStepOptions::Optimizer::Momentum
                                                            : ZOStepOptions::Optimizer::SGD;
  zo.beta1 = o.beta1;
  zo.beta2 = o.beta2;
  zo.adam_eps = o.adam_eps;
  // The JVP walk estimates g itself: the engine only applies the updates.
  zo.perturb = o.estimator != EstimatorChoice::Jvp;
  // finetune() resolves auto first (run.json holds the word); replay applies updates only,
  // which no dtype changes.
  zo.compute = o.dtype == ComputeChoice::Bf16 ? DType::BF16 : DType::F32;
  zo.master = o.master == MasterChoice::Bf16 ? DType::BF16 : DType::F32;
  zo.round_every = (int)round_every_of(o);
  zo.write_back_every = (int)o.write_back_every;
  return zo;
}

float learning_rate(const TrainOptions& o, int64_t step) {
  if (o.warmup > 0 && step < o.warmup) return o.lr * (float)(step + 1) / (float)o.warmup;
  const int64_t decay_steps = std::max<int64_t>(1, o.steps - o.warmup);
  const double t = std::min(1.0, (double)(step - o.warmup) / (double)decay_steps);
  switch (o.schedule) {
    case Schedule::Linear: return (float)(o.lr * (1.0 - t));
    case Schedule::Cosine: return (float)(o.lr * 0.5 * (1.0 + std::cos(M_PI * t)));
    case Schedule::Constant: break;
  }
  return o.lr;
}

}  // namespace zof
