// The fine-tuning loop: ZO steps over deterministic batches, learning-rate schedule, guard
// against non-finite losses, evaluation, metrics (JSONL), progress, atomic checkpoints with
// exact resume, the (seed, g) step log, and replay of that log onto the base model.
// Under mpirun the same loop runs on every rank: data-parallel replicas each walk their share
// of the step's batch, pipeline stages their share of the blocks, and one ordered reduction of
// 2q + 3 doubles per step (the loss sums, the token counts, a stop flag) leaves every rank with
// the same projected gradients, hence the same weights, without moving a gradient or a weight.
#include "zof/trainer.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <omp.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "zof/backend.h"
#include "zof/cuda.h"
#include "zof/dist.h"
#include "zof/error.h"
#include "zof/jvp.h"
#include "zof/model.h"
#include "zof/safetensors.h"
#include "cpu/sim_device.h"
#include "zof/streaming.h"
#include "zof/tokenizer.h"
#include "zof/version.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace zof {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Writes text to path atomically: temporary file, fsync, rename, fsync of the directory.
void write_file_atomic(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp." + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ZOF_CHECK(fd >= 0, "cannot write " + tmp + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("cannot write " + tmp + ": " + std::strerror(e));
    }
    off += (size_t)w;
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path.string() + ": " + std::strerror(e));
  }
  int dfd = ::open(path.parent_path().empty() ? "." : path.parent_path().c_str(), O_RDONLY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  ZOF_CHECK(f.good(), "cannot read " + p.string());
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw Error(p.string() + " is not valid JSON (" + e.what() + "); the run directory is damaged");
  }
}

// An append-only JSONL file whose size at each checkpoint is recorded, so that a resumed run
// truncates it back to exactly what the checkpoint saw.
class JsonlLog {
 public:
  void open(const fs::path& p, int64_t truncate_to) {
    path_ = p;
    if (truncate_to >= 0 && fs::exists(p)) fs::resize_file(p, (uintmax_t)truncate_to);
    f_ = std::fopen(p.c_str(), truncate_to == 0 ? "w" : "a");
    ZOF_CHECK(f_, "cannot write " + p.string() + ": " + std::strerror(errno));
  }
  ~JsonlLog() {
    if (f_) std::fclose(f_);
  }
  void write(const json& j) {
    const std::string s = j.dump() + "\n";
    ZOF_CHECK(std::fwrite(s.data(), 1, s.size(), f_) == s.size(),
              "cannot write " + path_.string() + " (disk full?)");
    std::fflush(f_);
  }
  int64_t sync() {  // durable size
    std::fflush(f_);
    ::fsync(fileno(f_));
    return (int64_t)fs::file_size(path_);
  }

 private:
  fs::path path_;
  std::FILE* f_ = nullptr;
};

void copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                           "generation_config.json"}) {
    if (!fs::exists(from / name)) continue;
    std::ifstream f(from / name, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    write_file_atomic(to / name, ss.str());
  }
}

std::string fmt_eta(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char b[32];
  if (s >= 3600)
    std::snprintf(b, sizeof b, "%dh%02dm", (int)(s / 3600), (int)std::fmod(s / 60, 60));
  else
    std::snprintf(b, sizeof b, "%dm%02ds", (int)(s / 60), (int)std::fmod(s, 60));
  return b;
}

// The latest complete checkpoint of a run directory, or empty.
fs::path latest_checkpoint(const fs::path& run) {
  const fs::path latest = run / "latest";
  if (!fs::exists(latest)) return {};
  std::ifstream f(latest);
  std::string name;
  std::getline(f, name);
  const fs::path dir = run / name;
  ZOF_CHECK(!name.empty() && fs::exists(dir / "state.json") && fs::exists(dir / "model.safetensors"),
            "the run directory " + run.string() + " names checkpoint '" + name +
                "' in its 'latest' file, but that checkpoint is incomplete; the run cannot resume");
  return dir;
}

// Test hooks for the failure tests: ZOF_FAULT_KILL_AT_STEP / ZOF_FAULT_TERM_AT_STEP /
// ZOF_FAULT_HANG_AT_STEP = step make rank ZOF_FAULT_RANK (every rank when unset) die by SIGKILL,
// receive SIGTERM, or stop answering at the start of that step.
void inject_step_fault(int rank, int64_t step) {
  const char* r = std::getenv("ZOF_FAULT_RANK");
  if (r && std::atoi(r) != rank) return;
  if (const char* k = std::getenv("ZOF_FAULT_KILL_AT_STEP"); k && std::atoll(k) == step)
    ::raise(SIGKILL);
  if (const char* t = std::getenv("ZOF_FAULT_TERM_AT_STEP"); t && std::atoll(t) == step)
    ::raise(SIGTERM);
  if (const char* h = std::getenv("ZOF_FAULT_HANG_AT_STEP"); h && std::atoll(h) == step)
    for (;;) ::pause();
}

constexpr int kWeightsTag = 30000;  // pipeline stages' blocks gathered to rank 0

// --estimator: checked before the job is laid out (and again for a resumed run's saved value).
void check_estimator(const TrainOptions& o) {
  ZOF_CHECK(o.estimator == "spsa" || o.estimator == "jvp",
            "--estimator must be spsa or jvp, not '" + o.estimator + "'");
  // The JVP walk has no stage split (its tangents would have to cross ranks too).
  ZOF_CHECK(o.estimator != "jvp" || o.pipeline_stages == 1,
            "--estimator jvp does not support --pipeline-stages > 1; use --pipeline-stages 1 "
            "(data parallel only) or --estimator spsa");
}

// --gpu-mem / --sim-device: the device budget in bytes (0: none given), checked before any work.
uint64_t check_streaming(const TrainOptions& o) {
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

}  // namespace

ZOStepOptions zo_step_options(const TrainOptions& o) {
  ZOStepOptions zo;
  zo.eps = o.eps;
  zo.weight_decay = o.weight_decay;
  zo.queries = o.queries;
  zo.seed = o.seed;
  ZOF_CHECK(o.z == "gaussian" || o.z == "rademacher",
            "--z must be gaussian or rademacher, not '" + o.z + "'");
  zo.dist = o.z == "rademacher" ? kZRademacher : kZGaussian;
  zo.one_sided = o.one_sided;
  ZOF_CHECK(o.sparsity >= 0.f && o.sparsity < 1.f,
            "--sparsity must be in [0, 1) (the fraction of each weight matrix left unperturbed), "
            "not " + std::to_string(o.sparsity));
  zo.sparsity = o.sparsity;
  if (o.optimizer == "sgd")
    zo.optimizer = ZOStepOptions::Optimizer::SGD;
  else if (o.optimizer == "momentum")
    zo.optimizer = ZOStepOptions::Optimizer::Momentum;
  else if (o.optimizer == "adam")
    zo.optimizer = ZOStepOptions::Optimizer::Adam;
  else
    throw Error("--optimizer must be sgd, momentum or adam, not '" + o.optimizer + "'");
  ZOF_CHECK(zo.optimizer == ZOStepOptions::Optimizer::SGD || o.pipeline_stages == 1,
            "--optimizer " + o.optimizer + " keeps state per parameter, which --pipeline-stages "
            "> 1 does not gather for checkpoints yet; use --optimizer sgd or one stage");
  ZOF_CHECK(o.beta1 >= 0.f && o.beta1 < 1.f, "--beta1 must be in [0, 1)");
  ZOF_CHECK(o.beta2 >= 0.f && o.beta2 < 1.f, "--beta2 must be in [0, 1)");
  ZOF_CHECK(o.adam_eps > 0.f, "--adam-eps must be positive");
  zo.beta1 = o.beta1;
  zo.beta2 = o.beta2;
  zo.adam_eps = o.adam_eps;
  ZOF_CHECK(o.estimator != "jvp" || (o.z == "gaussian" && !o.one_sided && o.sparsity == 0.f),
            "--estimator jvp takes Gaussian, dense directions: drop --z, --one-sided and "
            "--sparsity, or use --estimator spsa");
  // The JVP walk estimates g itself: the engine only applies the updates.
  zo.perturb = o.estimator != "jvp";
  return zo;
}

json TrainOptions::to_json() const {
  return nlohmann::json{{"model", model},
              {"task", task},
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

json finetune(TrainOptions opt) {
  // ---- the job: ranks, stages, replicas ------------------------------------------------------
  ZOF_CHECK(opt.dist_timeout >= 0 && std::isfinite(opt.dist_timeout),
            "--dist-timeout must be a non-negative number of seconds (0: wait for ever)");
  check_estimator(opt);
  (void)zo_step_options(opt);  // refuses bad estimator/optimizer flags before any work
  (void)check_streaming(opt);
  auto comm = dist::connect_world(opt.dist_timeout);
  const int rank = comm->rank();
  const bool root = rank == 0;
  const dist::Layout layout = dist::Layout::make(comm->size(), opt.pipeline_stages);
  const int stage = layout.stage(rank), replica = layout.replica(rank);
  const bool last_stage = stage == layout.stages - 1;

  // ---- options, run directory, resume -------------------------------------------------------
  const bool resuming = !opt.resume.empty();
  fs::path run;
  json state;
  fs::path ckpt;
  if (resuming) {
    run = opt.resume;
    ZOF_CHECK(fs::exists(run / "run.json"),
              "--resume " + run.string() + ": not a zof run directory (no run.json)");
    const json saved = read_json(run / "run.json");
    TrainOptions s = TrainOptions::from_json(saved.at("options"));
    ZOF_CHECK(opt.model.empty() || fs::weakly_canonical(opt.model) == fs::weakly_canonical(s.model),
              "--resume " + run.string() + " was started from model " + s.model +
                  ", not --model " + opt.model + "; resume with the same model or start a new run");
    s.threads = opt.threads;
    s.json = opt.json;
    s.pipeline_stages = opt.pipeline_stages;
    s.gpu_mem = opt.gpu_mem;
    s.sim_device = opt.sim_device;
    s.device = opt.device;
    s.dist_timeout = opt.dist_timeout;
    s.resume = opt.resume;
    s.out = run.string();
    opt = s;
    ckpt = latest_checkpoint(run);
    if (!ckpt.empty()) state = read_json(ckpt / "state.json");
  } else {
    ZOF_CHECK(!opt.out.empty(), "--out is required: the run directory to write");
    run = opt.out;
    ZOF_CHECK(!fs::exists(run / "run.json"),
              "--out " + run.string() + " already holds a run; continue it with --resume " +
                  run.string() + " or choose another --out");
    std::error_code ec;
    fs::create_directories(run, ec);
    ZOF_CHECK(!ec, "--out " + run.string() + ": cannot create the directory (" + ec.message() + ")");
    ZOF_CHECK(::access(run.c_str(), W_OK) == 0,
              "--out " + run.string() + " is not writable; choose a directory you can write");
  }
  ZOF_CHECK(opt.steps >= 1, "--steps must be at least 1");
  ZOF_CHECK(opt.batch >= 1, "--batch must be at least 1");
  ZOF_CHECK(opt.micro_batches >= 1 && opt.micro_batches <= opt.batch,
            "--micro-batches must be between 1 and --batch");
  ZOF_CHECK(opt.batch >= (int64_t)layout.replicas * opt.micro_batches,
            "--batch " + std::to_string(opt.batch) + " is split across " +
                std::to_string(layout.replicas) + " data-parallel replicas (ranks / stages) and " +
                std::to_string(opt.micro_batches) + " micro-batches each, so it needs at least " +
                std::to_string((int64_t)layout.replicas * opt.micro_batches) +
                " examples; raise --batch or use fewer ranks");
  ZOF_CHECK(opt.lr >= 0 && std::isfinite(opt.lr), "--lr must be a non-negative number");
  ZOF_CHECK(opt.schedule == "constant" || opt.schedule == "linear" || opt.schedule == "cosine",
            "--schedule must be constant, linear or cosine, not '" + opt.schedule + "'");
  check_estimator(opt);
  (void)zo_step_options(opt);  // refuses bad estimator/optimizer flags before any work
  const uint64_t gpu_mem = check_streaming(opt);  // a resumed run's estimator is known now

  // Ranks sharing a node share its cores (results do not depend on the thread count).
  if (opt.threads == 0 && comm->local_size() > 1)
    opt.threads = std::max(1, omp_get_num_procs() / comm->local_size());
  if (opt.threads > 0) omp_set_num_threads(opt.threads);  // host passes outside the backend too
  // --device cuda: ranks on one node take its GPUs in turn.
  std::unique_ptr<Backend> backend =
      opt.device == "cuda"
          ? std::unique_ptr<Backend>(make_cuda_backend(
                comm->local_rank() % std::max(1, cuda_device_count())))
          : make_cpu_backend(opt.threads);
  SimDevice* sim = nullptr;  // --sim-device: the CPU backend behind the simulated device
  if (opt.sim_device) {
    SimDeviceOptions so;
    so.budget = gpu_mem;  // 0: what the host has available
    auto d = make_sim_device(std::move(backend), so);
    sim = d.get();
    backend = std::move(d);
  }
  Model model = Model::load(opt.model);
  Tokenizer tok = Tokenizer::load(opt.model);
  const json model_id{{"config", model.config().raw}, {"num_params", model.num_params()}};
  if (resuming) {
    const json saved = read_json(run / "run.json");
    ZOF_CHECK(saved.at("model_id") == model_id,
              "--resume " + run.string() + ": the model in " + opt.model +
                  " is not the one this run started from (config or size differ)");
  }
  auto data = make_train_data(opt, tok, model.config().max_position);
  const ZOStepOptions zo = zo_step_options(opt);
  ZOEngine engine(model, *backend, data->max_rows(), zo);
  // --estimator jvp: g_j from forward-mode AD instead of two perturbed losses; the engine still
  // schedules and applies the updates, so the step log and replay are the same.
  std::unique_ptr<JVPEstimator> jvp;
  if (opt.estimator == "jvp") {
    const size_t before = backend->free_memory();
    jvp = std::make_unique<JVPEstimator>(model, *backend, data->max_rows(), opt.queries);
    const size_t after = backend->free_memory();
    engine.add_buffer_bytes(before > after ? before - after : 0);  // in the streaming budget
  }
  // Pipeline: this rank walks its stage's blocks; the hidden states of each micro-batch come
  // from the previous stage's rank and go to the next one's (stream index as the tag).
  const auto ranges = dist::stage_blocks((int)model.config().num_layers, layout.stages);
  if (layout.stages > 1) {
    StageIO io;
    const int prev = rank - 1, next = rank + 1;
    dist::Communicator* c = comm.get();
    if (stage > 0) io.recv = [c, prev](int s, float* h, int64_t n) { c->recv(h, n, prev, s); };
    if (!last_stage)
      io.send = [c, next](int s, const float* h, int64_t n) { c->send(h, n, next, s); };
    engine.set_stage(ranges[stage].first, ranges[stage].second, std::move(io));
  }
  // Brings rank 0's copy of every block up to date (before evaluating or saving): each stage of
  // the first replica sends its own blocks once; the other replicas hold the same weights.
  auto gather_weights = [&] {
    engine.flush();
    if (layout.stages == 1 || replica != 0) return;
    const auto& blocks = model.blocks();
    for (int s = 1; s < layout.stages; ++s) {
      const Block &b0 = blocks[ranges[s].first], &b1 = blocks[ranges[s].second];
      const int64_t n = b1.offset + b1.span - b0.offset;
      if (rank == s) comm->send(model.storage() + b0.offset, n, 0, kWeightsTag);
      if (root) comm->recv(model.storage() + b0.offset, n, s, kWeightsTag);
    }
  };

  int64_t start = 0, bad_run = 0;
  json eval_before;
  double tokens_done = 0, time_done = 0;
  int64_t metrics_size = 0, log_size = 0;
  if (!ckpt.empty()) {
    Model saved = Model::load(ckpt.string());
    ZOF_CHECK(saved.storage_size() == model.storage_size(),
              "checkpoint " + ckpt.string() + " does not match the model's layout");
    std::copy(saved.storage(), saved.storage() + saved.storage_size(), model.storage());
    start = state.at("step");
    bad_run = state.value("bad_run", 0);
    eval_before = state.value("eval_before", json());
    tokens_done = state.value("tokens", 0.0);
    time_done = state.value("train_s", 0.0);
    metrics_size = state.at("metrics_bytes");
    log_size = state.at("log_bytes");
  }
  // Streaming starts from the weights the run starts (or resumes) with: the model's storage,
  // which stays the master copy (current after every flush: evaluation, checkpoints, the end).
  // On a device (simulated or CUDA) the weights always stream: every block resident when they fit.
  // The JVP walk reads the same device blocks.
  if (opt.sim_device || opt.device == "cuda") {
    engine.enable_streaming(gpu_mem);
    if (jvp) jvp->set_weights(engine.streamer());
  }
  // Momentum/Adam state beside the checkpoint's weights, once streaming (which keeps it in host
  // memory) is settled.
  if (!ckpt.empty() && engine.state_planes() > 0) {
    const fs::path f = ckpt / "optimizer.safetensors";
    ZOF_CHECK(fs::exists(f), "checkpoint " + ckpt.string() + " has no optimizer.safetensors: it "
              "was not written by a --optimizer " + opt.optimizer + " run");
    auto st = safetensors::Archive::open_file(f.string());
    const int64_t n = model.storage_size();
    std::vector<float> m(n), v(engine.state_planes() == 2 ? n : 0);
    safetensors::to_f32(st.require("m", {n}), m.data());
    if (!v.empty()) safetensors::to_f32(st.require("v", {n}), v.data());
    engine.write_state(m, v);
  }
  // Every rank has checked the run directory before rank 0 writes into it.
  comm->barrier();
  if (!resuming && root)
    write_file_atomic(run / "run.json",
                      json{{"options", opt.to_json()},
                           {"model_id", model_id},
                           {"zof_version", version()}}
                          .dump(1));
  JsonlLog metrics, zlog;  // rank 0's
  if (root) {
    metrics.open(run / "metrics.jsonl", resuming ? metrics_size : 0);
    zlog.open(run / "zo_log.jsonl", resuming ? log_size : 0);
  }

  const bool tty = root && ::isatty(STDERR_FILENO);
  auto say = [&](const std::string& s) {
    if (root) std::fprintf(stderr, "%s%s\n", tty ? "\r\033[K" : "", s.c_str());
  };
  std::string job;
  if (comm->size() > 1)
    job = "; " + comm->name() + ": " + std::to_string(layout.stages) + " pipeline stage(s) x " +
          std::to_string(layout.replicas) + " data-parallel replica(s), " +
          std::to_string(opt.threads) + " thread(s) each";
  say("zof finetune: " + std::to_string(model.num_params()) + " parameters, " + data->describe() +
      job + (resuming ? ", resuming at step " + std::to_string(start) : ""));
  if (engine.streamer()) say("streaming on " + backend->name() + ": " + engine.streamer()->describe());

  // Rank 0 evaluates with the whole model; the others go on to the next step and wait for it.
  auto evaluate = [&](int64_t step, const char* when) {
    gather_weights();
    if (!root) return json{{"metric", ""}, {"value", 0.0}};
    const double t0 = now_s();
    auto m = data->evaluate(engine.forward());
    json j{{"type", "eval"}, {"step", step}, {"metric", m.name}, {"value", m.value},
           {"when", when}, {"eval_s", now_s() - t0}};
    metrics.write(j);
    char b[160];
    std::snprintf(b, sizeof b, "eval @ step %lld: %s %.4f", (long long)step, m.name.c_str(), m.value);
    say(b);
    return j;
  };

  auto save_checkpoint = [&](int64_t step) {
    gather_weights();
    if (!root) return;
    const std::string name = "checkpoint-" + std::to_string(step);
    const fs::path tmp = run / (name + ".tmp");
    const fs::path dst = run / name;
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    model.save(tmp.string(), DType::F32);  // fp32 master weights: exact resume
    // Momentum/Adam state beside the weights (storage layout), for an exact resume.
    if (engine.state_planes() > 0) {
      const int64_t n = model.storage_size();
      std::vector<float> m, v;
      engine.read_state(m, v);
      std::vector<safetensors::TensorOut> t{{"m", DType::F32, {n}, m.data()}};
      if (!v.empty()) t.push_back({"v", DType::F32, {n}, v.data()});
      safetensors::write((tmp / "optimizer.safetensors").string(), t,
                         {{"optimizer", opt.optimizer}});
    }
    // Fault injection for the crash tests: die mid-write, before the checkpoint is complete.
    if (const char* f = std::getenv("ZOF_FAULT_KILL_IN_CHECKPOINT"); f && std::atoll(f) == step)
      ::raise(SIGKILL);
    json st{{"step", step},         {"bad_run", bad_run},          {"eval_before", eval_before},
            {"tokens", tokens_done}, {"train_s", time_done},
            {"metrics_bytes", metrics.sync()}, {"log_bytes", zlog.sync()}};
    write_file_atomic(tmp / "state.json", st.dump(1));
    fsync_path(tmp);
    fs::remove_all(dst);
    fs::rename(tmp, dst);
    fsync_path(run);
    write_file_atomic(run / "latest", name + "\n");
    // Older checkpoints are now redundant.
    for (auto& e : fs::directory_iterator(run)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("checkpoint-", 0) == 0 && n != name) fs::remove_all(e.path());
    }
  };

  if (eval_before.is_null()) eval_before = evaluate(start, "before");

  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);

  std::vector<double> recent;  // (l+ + l-)/2 of recent steps
  uint64_t step_bytes = 0;     // bytes this rank sent during steps (activations, reduction)
  json last_eval = eval_before;
  double t_step0 = now_s();
  int64_t step = start;
  bool interrupted = false, stop_requested = false;
  const int64_t print_every = std::max<int64_t>(1, opt.steps / 50);
  for (; step < opt.steps; ++step) {
    inject_step_fault(rank, step);
    const double t0 = now_s();
    const uint64_t bytes0 = comm->bytes_sent();
    const float lr = learning_rate(opt, step);
    std::vector<LossBatch> micro = data->batch((uint64_t)step, replica, layout.replicas);
    double real_tokens = 0;
    for (auto& mb : micro)
      for (auto l : mb.batch.lengths) real_tokens += l;
    QueryLosses ql;
    if (jvp) {
      // The walk reads theta: the previous step's update goes in first (on the device, when
      // streaming: the JVP walk reads the streamer's blocks, not the host copy).
      engine.flush(/*to_host=*/false);
      std::vector<ZKey> keys;
      for (int j = 0; j < opt.queries; ++j) keys.push_back(ZKey{opt.seed, (uint32_t)step, (uint32_t)j});
      const JVPSums js = jvp->directional_derivatives(keys, micro);
      // The same reduction: the + slots carry the directional derivatives, the - slots the
      // loss at theta (the same number in each).
      ql.sum_plus = js.sum_dir;
      ql.sum_minus.assign(opt.queries, js.sum_loss);
      ql.count = js.count;
    } else {
      ql = engine.perturbed_losses((uint32_t)step, micro);
    }
    {
      // The step's one reduction: loss sums and counts from each replica's last stage, the
      // stop flag from every rank (so that all ranks leave after the same step).
      const int q = opt.queries;
      std::vector<double> red(2 * q + 3, 0.0);
      if (last_stage) {
        for (int j = 0; j < q; ++j) {
          red[j] = ql.sum_plus[j];
          red[q + j] = ql.sum_minus[j];
        }
        red[2 * q] = ql.count;
        red[2 * q + 1] = real_tokens;
      }
      red[2 * q + 2] = g_stop_signal ? 1.0 : 0.0;
      comm->allreduce_sum_ordered(red.data(), (int)red.size());
      for (int j = 0; j < q; ++j) {
        ql.sum_plus[j] = red[j];
        ql.sum_minus[j] = red[q + j];
      }
      ql.count = red[2 * q];
      real_tokens = red[2 * q + 1];
      stop_requested = red[2 * q + 2] > 0;
    }
    step_bytes += comm->bytes_sent() - bytes0;
    bool finite = ql.count > 0;
    double lp = 0, lm = 0;
    for (int j = 0; j < opt.queries; ++j) {
      lp += ql.sum_plus[j] / ql.count / opt.queries;
      lm += ql.sum_minus[j] / ql.count / opt.queries;
      finite = finite && std::isfinite(ql.sum_plus[j]) && std::isfinite(ql.sum_minus[j]);
    }
    std::vector<double> g;
    if (finite) {
      g = jvp ? JVPSums{ql.sum_minus[0], ql.sum_plus, ql.count}.gradients()
              : engine.projected_gradients(ql);
      engine.schedule_update((uint32_t)step, lr, g);
      bad_run = 0;
    } else {
      ++bad_run;
      say("step " + std::to_string(step) +
          (jvp ? ": loss or directional derivative is not finite (loss " + std::to_string(lm) +
                     ", mean derivative " + std::to_string(lp)
               : ": loss is not finite (+eps " + std::to_string(lp) + ", -eps " + std::to_string(lm)) +
          "); update skipped");
    }
    const double dt = now_s() - t0;
    tokens_done += real_tokens;
    time_done += dt;
    const double loss = jvp ? ql.sum_minus[0] / ql.count : 0.5 * (lp + lm);  // jvp: at theta
    if (root) zlog.write(json{{"step", step}, {"seed", opt.seed}, {"lr", lr}, {"g", g},
                              {"wd", opt.weight_decay}, {"skipped", !finite}});
    json step_rec{{"type", "step"}, {"step", step}, {"loss", finite ? json(loss) : json()},
                  {"loss_plus", finite ? json(lp) : json()},
                  {"loss_minus", finite ? json(lm) : json()}, {"g", g}, {"lr", lr},
                  {"tokens", real_tokens}, {"step_s", dt},
                  {"tokens_per_s", real_tokens / std::max(dt, 1e-9)}};
    if (jvp) {  // no perturbed losses: "loss" is the loss at theta
      step_rec.erase("loss_plus");
      step_rec.erase("loss_minus");
    }
    if (root) metrics.write(step_rec);
    if (finite) {
      recent.push_back(loss);
      if (recent.size() > 50) recent.erase(recent.begin());
    }
    if (bad_run >= opt.max_bad_steps) {
      // No checkpoint now: the weights that gave these losses are the problem. The latest
      // checkpoint (if any) still holds weights from before it, and --resume starts there.
      comm->barrier();
      const fs::path last = latest_checkpoint(run);
      throw Error("the loss was not finite for " + std::to_string(bad_run) +
                  " steps in a row (step " + std::to_string(step) + "); lower --lr or --eps." +
                  (last.empty() ? std::string(" No checkpoint was saved before it.")
                                : " The latest checkpoint before it is " + last.string()));
    }
    const bool do_eval = opt.eval_every > 0 && (step + 1) % opt.eval_every == 0 && step + 1 < opt.steps;
    if (do_eval) last_eval = evaluate(step + 1, "during");
    // Progress.
    if (root && (tty || (step + 1) % print_every == 0 || step + 1 == opt.steps || do_eval)) {
      double avg = 0;
      for (double x : recent) avg += x;
      avg = recent.empty() ? NAN : avg / recent.size();
      const double elapsed = now_s() - t_step0;
      const double per_step = elapsed / (double)(step + 1 - start);
      char b[256];
      std::snprintf(b, sizeof b, "step %lld/%lld  loss %.4f  %s %.4f  %.0f tok/s  ETA %s",
                    (long long)(step + 1), (long long)opt.steps, avg,
                    last_eval["metric"].get<std::string>().c_str(),
                    last_eval["value"].get<double>(), tokens_done / std::max(time_done, 1e-9),
                    fmt_eta(per_step * (double)(opt.steps - step - 1)).c_str());
      if (tty)
        std::fprintf(stderr, "\r\033[K%s", b);
      else
        std::fprintf(stderr, "%s\n", b);
    }
    if (stop_requested) {
      interrupted = true;
      ++step;
      break;
    }
    if (opt.save_every > 0 && (step + 1) % opt.save_every == 0 && step + 1 < opt.steps)
      save_checkpoint(step + 1);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (tty) std::fprintf(stderr, "\n");
  // Bytes sent per step by all ranks together (the point of ZO data parallelism: scalars).
  double dist_bytes = (double)step_bytes;
  comm->allreduce_sum_ordered(&dist_bytes, 1);
  const json dist_summary{{"ranks", comm->size()},
                          {"pipeline_stages", layout.stages},
                          {"replicas", layout.replicas},
                          {"bytes_per_step", step > start ? dist_bytes / (double)(step - start) : 0.0}};
  if (interrupted) {
    save_checkpoint(step);
    comm->barrier();  // a rank that left early with a non-zero status would end the job mid-save
    say("interrupted by " +
        (g_stop_signal ? "signal " + std::to_string((int)g_stop_signal)
                       : std::string("a signal to another rank")) +
        " at step " + std::to_string(step) +
        "; checkpoint saved, continue with: zof finetune --resume " + run.string());
    if (!root) return json{{"rank", rank}, {"interrupted", true}};
    return json{{"steps", step}, {"interrupted", true}, {"run", run.string()}};
  }
  save_checkpoint(step);
  const json after = evaluate(step, "after");
  if (!root) return json{{"rank", rank}};
  model.save(run.string(), model.stored_dtype());
  copy_tokenizer_files(opt.model, run);
  double avg = 0;
  for (double x : recent) avg += x;
  avg = recent.empty() ? NAN : avg / recent.size();
  json summary{{"steps", step},
              {"train_loss", avg},
              {"eval",
               {{"metric", after["metric"]},
                {"before", eval_before["value"]},
                {"after", after["value"]}}},
              {"tokens_per_s", tokens_done / std::max(time_done, 1e-9)},
              {"train_s", time_done},
              {"dist", dist_summary},
              {"out", run.string()}};
  if (const BlockStreamer* st = engine.streamer()) {
    int streamed = 0;
    for (int b = 0; b < (int)model.blocks().size(); ++b) streamed += !st->resident(b);
    json j{{"min_bytes", engine.streaming_minimum()}, {"buffer_bytes", engine.buffer_bytes()},
           {"device_bytes", st->device_bytes()},
           {"streamed_blocks", streamed}, {"slots", st->num_slots()},
           {"uploads", st->stats().uploads}, {"hits", st->stats().hits},
           {"bytes_uploaded", st->stats().bytes_uploaded},
           {"bytes_written_back", st->stats().bytes_written_back}};
    if (sim) {
      const SimDeviceStats ss = sim->stats();
      j["budget_bytes"] = ss.budget;
      j["peak_bytes"] = ss.peak;
      j["hazards"] = ss.hazards;
      // Operands that were not device memory: what a GPU would fault on.
      j["foreign_pointers"] = ss.foreign;
      if (ss.foreign) j["first_foreign_pointer"] = ss.first_foreign;
      j["compute_wait_s"] = ss.compute_wait_s;
    }
    summary["streaming"] = j;
  }
  return summary;
}

json replay(const std::string& base_model, const std::string& run_dir, const std::string& out_dir,
            int threads) {
  const fs::path run = run_dir;
  ZOF_CHECK(fs::exists(run / "run.json") && fs::exists(run / "zo_log.jsonl"),
            "--log " + run_dir + ": not a zof run directory (needs run.json and zo_log.jsonl)");
  const json saved = read_json(run / "run.json");
  if (threads > 0) omp_set_num_threads(threads);
  auto backend = make_cpu_backend(threads);
  Model model = Model::load(base_model);
  const json model_id{{"config", model.config().raw}, {"num_params", model.num_params()}};
  ZOF_CHECK(saved.at("model_id") == model_id,
            "--model " + base_model + " is not the base model of the run in " + run_dir);
  const TrainOptions o = TrainOptions::from_json(saved.at("options"));
  ZOStepOptions zo = zo_step_options(o);
  // The engine holds what an update needs besides (step, g): Sparse MeZO's thresholds (from the
  // base weights, as in the run) and momentum/Adam state (rebuilt from zero, as in the run).
  ZOEngine engine(model, *backend, 1, zo);
  std::ifstream f(run / "zo_log.jsonl");
  std::string line;
  int64_t n = 0, lineno = 0, expect_step = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      throw Error((run / "zo_log.jsonl").string() + " line " + std::to_string(lineno) +
                  " is not valid JSON; the log is damaged");
    }
    const int64_t step = j.at("step");
    ZOF_CHECK(step == expect_step, (run / "zo_log.jsonl").string() + " line " +
                                       std::to_string(lineno) + ": expected step " +
                                       std::to_string(expect_step) + ", found " +
                                       std::to_string(step));
    ++expect_step;
    if (j.at("skipped").get<bool>()) continue;
    zo.seed = j.at("seed");
    zo.weight_decay = j.at("wd");
    const float lr = j.at("lr");
    const std::vector<double> g = j.at("g");
    engine.set_pending(ZOEngine::make_update(zo, (uint32_t)step, lr, g));
    engine.flush();
    ++n;
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  ZOF_CHECK(!ec, "--out " + out_dir + ": cannot create the directory (" + ec.message() + ")");
  model.save(out_dir, model.stored_dtype());
  copy_tokenizer_files(base_model, out_dir);
  return json{{"steps", expect_step}, {"updates", n}, {"out", out_dir}};
}

}  // namespace zof
