// finetune(): a run put together from its parts, in the order they depend on each other: the
// options and the run directory, the job's ranks, the backend (from the runtime), the model, the
// task's data, the engine and the estimator, the checkpoint to continue from, then the step loop
// and the run's summary. Each part lives in its own file of src/train/.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "train/estimator.h"
#include "train/evaluation.h"
#include "train/job.h"
#include "train/resume_rule.h"
#include "train/run_dir.h"
#include "train/step_loop.h"
#include "train/tensor_share.h"
#include "util/block_io.h"
#include "zof/backend.h"
#include "zof/disk_tier.h"
#include "zof/error.h"
#include "zof/model.h"
#include "zof/report.h"
#include "zof/runtime.h"
#include "zof/streaming.h"
#include "zof/tokenizer.h"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace zof {
namespace {

using namespace train;

// The matrix products of a step's walk at `rows` rows: every weight a product reads, and the
// LM head (the token table when tied): what --dtype auto times (resolve_compute_dtype).
std::vector<MatmulShape> matmul_shapes(const Model& model, int64_t rows) {
  std::vector<MatmulShape> s;
  for (const Param& p : model.params())
    if (p.gemm && p.shape.size() == 2) s.push_back({rows, p.shape[0], p.shape[1]});
  const ModelConfig& c = model.config();
  if (c.tie_embeddings) {
    const int64_t width = c.word_embed_proj_dim > 0 ? c.word_embed_proj_dim : c.hidden_size;
    s.push_back({rows, c.vocab_size, width});
  }
  return s;
}

// ", auto: fp32 190 GFLOP/s, bf16 193 at this model's shapes" (empty when nothing was measured).
std::string probe_words(const ComputeProbe& p) {
  if (p.small) return "; auto: fp32, the model's products are too small for bf16 to pay";
  if (!p.measured) return "";
  char buf[240];
  std::snprintf(buf, sizeof buf, "; auto: fp32 %.0f GFLOP/s, bf16 %.0f at this model's shapes",
                p.fp32_gflops, p.bf16_gflops);
  std::string s = buf;
  if (p.skipped > 0) {
    std::snprintf(buf, sizeof buf, " (%d of %d, the probe's %.0f s spent)", p.shapes,
                  p.shapes + p.skipped, p.budget_s);
    s += buf;
  }
  return s;
}

// Ranks other than 0 report nothing.
class QuietSink : public TrainSink {
 public:
  void message(const std::string&) override {}
  bool on_step(const StepReport&) override { return false; }
  void finish() override {}
};

// This rank's backend: --device, its share of the node's cores, its GPU in turn; the simulated
// device within --gpu-mem for --sim-device.
std::unique_ptr<Backend> rank_backend(const TrainOptions& opt, const dist::Communicator& comm,
                                      uint64_t gpu_mem) {
  BackendOptions b;
  b.device = opt.device;
  b.threads = opt.threads;
  b.local_rank = comm.local_rank();
  b.sim_device = opt.sim_device;
  b.tf32 = opt.tf32;
  b.sim_budget = gpu_mem;  // 0: what the host has available
  return make_backend(b);
}

// What streaming did over the run, and what the simulated device saw.
json streaming_summary(ZOEngine& engine, const Model& model, const Backend& backend) {
  const BlockStreamer* st = engine.streamer();
  int streamed = 0;
  for (int b = 0; b < (int)model.blocks().size(); ++b) streamed += !st->resident(b);
  json j{{"min_bytes", engine.streaming_minimum()}, {"buffer_bytes", engine.buffer_bytes()},
         {"device_bytes", st->device_bytes()},
         {"streamed_blocks", streamed}, {"slots", st->num_slots()},
         {"uploads", st->stats().uploads}, {"hits", st->stats().hits},
         {"bytes_uploaded", st->stats().bytes_uploaded},
         {"bytes_written_back", st->stats().bytes_written_back}};
  if (const auto ss = sim_device_report(backend)) {
    j["budget_bytes"] = ss->budget;
    j["peak_bytes"] = ss->peak;
    j["hazards"] = ss->hazards;
    // Operands that were not device memory: what a GPU would fault on.
    j["foreign_pointers"] = ss->foreign;
    if (ss->foreign) j["first_foreign_pointer"] = ss->first_foreign;
    j["compute_wait_s"] = ss->compute_wait_s;
  }
  return j;
}

// Everything a run holds while it steps.
struct Run {
  TrainOptions& opt;
  RunDir& dir;
  Job& job;
  Backend& backend;
  Model& model;
  ZOEngine& engine;
  Evaluator& eval;
  StepLoop& loop;
  TrainSink& sink;
  RunCounters& c;
  DType saved;  // the saved model's dtype (save_dtype, of the model as loaded)
};

// After the loop: the final checkpoint, evaluation and model (or the interrupted run's
// checkpoint), and the summary.
json finish(Run& r, const LoopEnd& end, int64_t start) {
  // Bytes sent per step by all ranks together (the point of ZO data parallelism: scalars).
  double dist_bytes = (double)end.step_bytes;
  r.job.comm.allreduce_sum_ordered(&dist_bytes, 1);
  const double steps = end.step > start ? (double)(end.step - start) : 0.0;
  json dist_summary{{"ranks", r.job.comm.size()},
                    {"pipeline_stages", r.job.layout.stages},
                    {"tensor_parallel", r.job.grid.tensor},
                    {"replicas", r.job.layout.replicas},
                    {"bytes_per_step", steps > 0 ? dist_bytes / steps : 0.0}};
  // What a tensor rank's all-gathers carried for it a step (its part to the T - 1 others, the
  // same on every rank of a group), summed over the stages of a pipeline (each stage's group
  // exchanges for its own layers): docs/parallelism.md's formula, not the star's wire traffic.
  if (r.job.grid.tensor > 1) {
    double tb = r.job.replica == 0 && r.job.tensor_rank == 0 ? (double)end.tensor_bytes : 0.0;
    r.job.comm.allreduce_sum_ordered(&tb, 1);
    dist_summary["tensor_bytes_per_step_per_rank"] = steps > 0 ? tb / steps : 0.0;
  }
  const std::string run = r.dir.path().string();
  r.loop.save_checkpoint(end.step);
  if (end.interrupted) {
    r.job.comm.barrier();  // a rank that left early with a non-zero status would end the job mid-save
    const std::string by = end.signal      ? "signal " + std::to_string(end.signal)
                           : end.sink_stop ? std::string("a stop request from the progress sink")
                                           : std::string("a signal to another rank");
    r.sink.message("interrupted by " + by + " at step " + std::to_string(end.step) +
                   "; checkpoint saved, continue with: zof finetune --resume " + run);
    if (!r.job.root) {  // the CLI's exit status, on every rank: 128 + the signal
      json s{{"rank", r.job.rank}, {"interrupted", true}};
      if (end.signal) s["signal"] = end.signal;
      return s;
    }
    json s{{"steps", end.step}, {"interrupted", true}, {"run", run}};
    if (end.signal) s["signal"] = end.signal;  // SIGINT or SIGTERM: the CLI exits 128 + it
    return s;
  }
  // The model is saved in --save-dtype: the evaluation scores those weights (the final
  // checkpoint above keeps the exact master).
  const DType saved = r.saved;
  // The disk tier's traffic from its start (the load, when it goes through the tier) to the last
  // checkpoint, before the final evaluation and the save.
  json disk_summary;
  if (const DiskTier* t = r.engine.disk_tier()) {
    const DiskTierStats& s = t->stats();
    disk_summary = {{"blocks_on_disk", (int)std::count(t->plan().on_disk.begin(),
                                                              t->plan().on_disk.end(), true)},
                            {"ring", t->plan().ring},
                            {"o_direct", t->direct()},
                            {"reads", s.reads},
                            {"writes", s.writes},
                            {"bytes_read", s.bytes_read},
                            {"bytes_written", s.bytes_written},
                            {"stalls", s.stalls},
                            {"stall_s", s.stall_s}};
  }
  r.engine.round_weights(saved);
  const json after = r.eval.evaluate(end.step, "after");
  if (!r.job.root) return json{{"rank", r.job.rank}};
  // f16 holds at most 65504: a larger weight saved so would be inf, a file no loader takes
  // (bf16's top is a hair below fp32's too). The final checkpoint checked the master: only a
  // save in a narrower type than it needs another pass over the weights (through a disk tier,
  // a read of every disk block).
  const bool narrowed = saved != DType::F32 && saved != r.model.storage_dtype();
  if (const Model::NonFinite bad =
          narrowed ? r.model.find_non_finite(r.engine.host_blocks()) : Model::NonFinite{};
      bad.param >= 0)
    throw Error(std::string("--save-dtype ") + word(r.opt.save_dtype) + ": weight " + std::to_string(bad.index) +
                " of " + r.model.params()[bad.param].name + " is beyond " +
                dtype_torch_name(saved) + "'s range: no model was written (the logs and the "
                "checkpoint are in " + run + "); use --save-dtype bf16 or fp32 in a new run");
  // Weights that score a non-finite metric are no fine-tuned model (the checkpoint has them).
  ZOF_CHECK(std::isfinite(after["value"].get<double>()),
            "the model after step " + std::to_string(end.step) + " scores a non-finite " +
                after["metric"].get<std::string>() + " on the held-out set: no model was "
                "written (the logs and checkpoint are in " + run + "); lower --lr and start a new run");
  if (r.opt.save_format == SaveFormat::Gguf) {
    r.model.save_gguf((r.dir.path() / "model.gguf").string(), saved, r.opt.model,
                      r.engine.host_blocks());
  } else {
    r.model.save(run, saved, r.engine.host_blocks());
    copy_tokenizer_files(r.opt.model, run);
  }
  json summary{{"steps", end.step},
               {"train_loss", r.loop.recent_loss()},
               {"eval",
                {{"metric", after["metric"]},
                 {"before", r.c.eval_before["value"]},
                 {"after", after["value"]}}},
               {"tokens_per_s", r.c.tokens / std::max(r.c.train_s, 1e-9)},
               {"train_s", r.c.train_s},
               {"dist", dist_summary},
               {"compute", {{"dtype", r.opt.dtype}, {"unit", r.backend.compute_info().isa}}},
               {"save_dtype", saved == DType::F16 ? "f16" : compute_dtype_word(saved)},
               {"master", r.opt.master},
               {"master_storage", compute_dtype_word(r.model.storage_dtype())},
               {"round_every", r.opt.round_every},
               {"out", run}};
  if (r.engine.streamer()) summary["streaming"] = streaming_summary(r.engine, r.model, r.backend);
  if (!disk_summary.is_null()) summary["disk_tier"] = disk_summary;
  return summary;
}

// The run's summary.json and, unless --no-report, the run as pictures (report.h) in its
// directory: a file that cannot be written costs a warning, never the run. Read back from the run's files, it changes none of them.
void write_run_report(const TrainOptions& opt, const RunDir& dir, const json& summary,
                      const Backend& backend, TrainSink& sink) {
  json info = summary;
  info["device"] = backend.name();
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) info["peak_rss_bytes"] = (double)ru.ru_maxrss * 1024.0;
  // summary.json: what only this process knows (device, memory, streaming), for later reports.
  try {
    write_file_atomic(dir.path() / "summary.json", info.dump(2) + "\n");
  } catch (const std::exception& e) {
    sink.message(std::string("warning: no summary.json (the run is unaffected): ") + e.what());
  }
  if (opt.no_report) return;
  const std::string out = (dir.path() / "report.html").string();
  try {
    write_report({dir.path().string()}, out, info);
  } catch (const std::exception& e) {
    sink.message(std::string("warning: no report.html (the run is unaffected): ") + e.what());
  }
}

}  // namespace

// A number in a file of the cgroup file system (0 where absent or "max").
static uint64_t cgroup_number(const fs::path& p) {
  std::ifstream in(p);
  std::string v;
  if (!(in >> v) || v.empty() || v.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::strtoull(v.c_str(), nullptr, 10);
}

// The host memory free now: /proc/meminfo's MemAvailable, or less where this process's memory
// cgroup (a container's limit; v2 or v1) leaves less below its limit. ZOF_FAULT_MEM_AVAILABLE=
// BYTES stands in for it in tests. 0 where it cannot be read.
static uint64_t host_memory_available() {
  if (const char* f = std::getenv("ZOF_FAULT_MEM_AVAILABLE")) return std::strtoull(f, nullptr, 10);
  uint64_t avail = 0;
  {
    std::ifstream in("/proc/meminfo");
    for (std::string key; in >> key;) {
      uint64_t kb = 0;
      in >> kb;
      if (key == "MemAvailable:") avail = kb * 1024;
      in.ignore(1 << 10, '\n');
    }
  }
  std::ifstream cg("/proc/self/cgroup");
  for (std::string line; std::getline(cg, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    fs::path dir;
    uint64_t limit = 0, used = 0;
    if (ctl.empty()) {  // v2
      dir = fs::path("/sys/fs/cgroup") / fs::path(path).relative_path();
      limit = cgroup_number(dir / "memory.max");
      used = cgroup_number(dir / "memory.current");
    } else if (ctl == "memory") {  // v1
      dir = fs::path("/sys/fs/cgroup/memory") / fs::path(path).relative_path();
      limit = cgroup_number(dir / "memory.limit_in_bytes");
      used = cgroup_number(dir / "memory.usage_in_bytes");
    }
    if (limit > 0 && limit < (uint64_t(1) << 60)) avail = std::min(avail, limit > used ? limit - used : 0);
  }
  return avail;
}

// The optimizer's state planes beside the weights (momentum: m; Adam: m and v).
static int state_planes_of(const TrainOptions& opt) {
  return opt.optimizer == OptimizerChoice::Adam       ? 2
         : opt.optimizer == OptimizerChoice::Momentum ? 1
                                                      : 0;
}

// --host-mem's default: none (every block in RAM) where the model's host masters (its weights
// in the storage's type, and a stateful optimizer's fp32 state) fit the free host memory less a
// margin for the rest of the run (1 GiB and a tenth of what is free); where they do not, that
// budget, so that a model larger than RAM runs through the disk tier instead of running out of
// memory. Only where the tier runs (one process, the SPSA walk, no pipeline stages, not CUDA),
// and at or above the tier's least; `why` says what was chosen (empty: nothing).
static uint64_t default_host_memory(const TrainOptions& opt, const Model& layout, int ranks,
                                    std::string& why) {
  if (!opt.host_mem.empty() || ranks != 1 || opt.estimator != EstimatorChoice::Spsa ||
      opt.pipeline_stages != 1 || opt.tensor_parallel != 1 || opt.device == DeviceChoice::Cuda)
    return 0;
  const int planes = state_planes_of(opt);
  // The layout is held in the run's storage type: the tier's own sizes.
  const uint64_t need = DiskTier::all_bytes(layout, 1 + planes);
  const uint64_t least = DiskTier::min_bytes(layout, 1 + planes, DiskTier::kept_blocks(layout));
  const uint64_t free = host_memory_available();
  const uint64_t margin = (uint64_t(1) << 30) + free / 10;
  if (free == 0 || need + margin <= free) return 0;
  const uint64_t budget = free > margin ? free - margin : 0;
  if (budget < least) {
    why = "zof: warning: the model's host masters (" + format_bytes(need) + ") exceed the " +
          format_bytes(free) + " of free host memory, less than the disk tier's least (" +
          format_bytes(least) + ") with a margin of " + format_bytes(margin) +
          " for the rest of the run: running in RAM, which may run out; free memory, or give "
          "--host-mem SIZE";
    return 0;
  }
  why = "--host-mem by default: the model's host masters (" + format_bytes(need) +
        ") exceed the " + format_bytes(free) + " of free host memory less a margin of " +
        format_bytes(margin) + ", so " + format_bytes(budget) +
        " of them stay in RAM and the rest on disk (--host-mem SIZE chooses)";
  return budget;
}

// The name of a run's store in a shared --offload-dir: a hash of the run directory's absolute
// path (the run's own offload/ holds zof-store.bin).
static std::string run_store_id(const fs::path& run) {
  std::error_code ec;
  const std::string abs = fs::weakly_canonical(fs::absolute(run), ec).string();
  char t[20];
  std::snprintf(t, sizeof t, "%016llx",
                (unsigned long long)hash_bytes(abs.data(), abs.size(), 0x7a6f66));
  return t;
}

// --offload-dir, or offload/ in the run directory.
static fs::path offload_path(const TrainOptions& opt, const fs::path& run) {
  return opt.offload_dir.empty() ? run / "offload" : fs::path(opt.offload_dir);
}

// Removes DIR's zof-blocks-PID.bin whose process is gone (or is this one: its earlier life).
static void remove_stale_stores(const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("zof-blocks-", 0) != 0 || n.size() < 16 || n.substr(n.size() - 4) != ".bin")
      continue;
    const std::string pid = n.substr(11, n.size() - 15);
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const long p = std::atol(pid.c_str());
    if (p == (long)::getpid() || (::kill((pid_t)p, 0) != 0 && errno == ESRCH))
      fs::remove(e.path(), ec);
  }
}

// The directory for the disk tier's store: there, a directory, writable, with room for the
// blocks beyond --host-mem. offload/ in the run directory is checked where it will be made.
static void check_offload_dir(const TrainOptions& opt, const fs::path& dir,
                              const DiskTierPlan& plan, uint64_t held) {
  if (plan.all_resident()) return;
  // Two slots a disk block (a kill at any moment leaves the checkpoint's whole), less what an
  // adopted store takes already.
  const uint64_t need = 2 * plan.store_bytes > held ? 2 * plan.store_bytes - held : 0;
  const std::string flag = opt.offload_dir.empty() ? "the run directory's offload/"
                                                   : "--offload-dir " + dir.string();
  fs::path on = dir;
  if (opt.offload_dir.empty()) {  // its nearest existing parent's file system
    std::error_code ec;
    while (!on.empty() && !fs::exists(on, ec)) on = on.parent_path();
    if (on.empty()) on = ".";
  } else {
    std::error_code ec;
    ZOF_CHECK(fs::exists(dir, ec),
              "--offload-dir " + dir.string() + " does not exist: create it (on a local file "
              "system with " + std::to_string(need) + " bytes free), or drop "
              "--offload-dir to use the run directory");
    ZOF_CHECK(fs::is_directory(dir, ec), "--offload-dir " + dir.string() +
                                             " is not a directory: give a directory");
    ZOF_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0,
              "--offload-dir " + dir.string() + " is not writable: give a directory this user "
              "can write");
  }
  const uint64_t free = free_space(on);
  ZOF_CHECK(free >= need,
            flag + " has " + std::to_string(free) + " bytes free, and the blocks beyond --host-mem "
            "need " + std::to_string(need) + " (" + format_bytes(need) +
            "): free space, choose another --offload-dir, or raise --host-mem");
  // The I/O engine too (made and dropped: a ZOF_IO that names none, or uring where io_uring
  // cannot run, is refused with the tier's own words before the run directory exists).
  make_io_engine(1, io_engine_from_env());
}

json finetune(TrainOptions opt, TrainSink* user_sink, const GivenOptions* given) {
  // A new run's options as given. A resumed run's are its run.json's: what its caller set may
  // restate them, not change them (and they are validated as the run's, below).
  if (opt.resume.empty())
    validate_options(opt);
  else if (given)
    check_resume_request(opt, *given);
  RunDir dir(opt);  // --resume: the run's saved options from here on (run.json, state.json)
  validate_options(opt, opt.resume.empty());
  // A new run records the objective it trains on, not "auto": a later change of the default
  // cannot change what a resumed or replayed run computes.
  if (opt.resume.empty()) opt.objective = training_objective(opt);
  // Likewise the saved dtype: auto is the master's.
  if (opt.resume.empty() && opt.save_dtype == SaveChoice::Auto)
    opt.save_dtype = opt.master == MasterChoice::Bf16 ? SaveChoice::Bf16 : SaveChoice::Fp32;
  // And the bf16 master's rounding window (auto: 8 where one applies).
  if (opt.resume.empty()) opt.round_every = round_every_of(opt);
  const uint64_t gpu_mem = device_memory_budget(opt);
  auto comm = connect_job(opt.dist_timeout);
  Job job(*comm, opt.pipeline_stages, opt.tensor_parallel);
  job.check_batch(opt);
  dir.check_out(opt);                  // --out apart from the inputs, creatable
  if (job.root) dir.lock_resumed();    // one writer, and logs that match the checkpoint
  // Everything is loaded and checked before --out is created: a refusal leaves nothing behind.
  opt.threads = setup_host_threads(opt.threads, comm->local_size());
  std::unique_ptr<Backend> backend = rank_backend(opt, *comm, gpu_mem);
  // A new run records the dtype it computes in (auto resolved on this machine: a resumed run
  // computes as it started, wherever it resumes).
  const Backend::ComputeInfo unit = backend->compute_info();
  if (opt.dtype != ComputeChoice::Auto)
    resolve_compute_dtype(opt.dtype, *backend);  // a backend without bf16 refuses here
  // A bf16 master in 2 bytes a parameter where the walk reads it so (weight_storage); a resumed
  // run's base loaded as its fingerprint was taken, then held so.
  const DType storage = weight_storage(opt);
  const DType fingerprint_as = fingerprint_storage(dir.saved_fingerprint(), storage);
  // With a disk tier the weights go straight into it, block by block, once --out exists (the
  // tier's store may live there): here the model is laid out and every tensor's name, shape and
  // dtype checked, nothing read. The fingerprint is taken as they pass. A GGUF file is read
  // whole, and the tier then moves its blocks out.
  // --host-mem, or its default where the model does not fit the free host memory.
  std::string host_mem_why;
  uint64_t host_mem = host_memory_budget(opt);
  // A checkpoint whose blocks are in the disk tier's store resumes through the tier (every
  // block in RAM where the budget holds them all).
  const bool store_ckpt = dir.checkpoint_in_store();
  if (host_mem == 0) {
    const Model layout = Model::load_layout(opt.model, storage);  // read once for both
    host_mem = default_host_memory(opt, layout, comm->size(), host_mem_why);
    if (store_ckpt && host_mem == 0)
      host_mem = DiskTier::all_bytes(layout, 1 + state_planes_of(opt));
  }
  const bool load_into_tier = host_mem > 0 && !Model::is_gguf(opt.model);
  Model model = load_into_tier ? Model::load_unread(opt.model, storage)
                               : Model::load(opt.model, fingerprint_as);
  // A model tensor parallel cannot split is refused by name before --out exists.
  if (opt.tensor_parallel > 1) tp::check(model.config(), opt.tensor_parallel);
  ComputeProbe probe;
  if (opt.dtype == ComputeChoice::Auto && opt.tensor_parallel > 1) {
    opt.dtype = ComputeChoice::Fp32;  // the tensor-parallel forward computes in fp32
  } else if (opt.dtype == ComputeChoice::Auto) {
    // The unit's answer (AMX, tensor cores), or on the CPU the faster of fp32 and bf16 products
    // measured at this model's shapes (not on a simulated device: its memory is the run's
    // budget, not the probe's). bf16 only where every rank chose it: ranks compute alike.
    const int64_t rows = (opt.batch + opt.micro_batches - 1) / opt.micro_batches * opt.seq_len;
    const bool probe_here = opt.device == DeviceChoice::Cpu && !opt.sim_device;
    double bf16 = (probe_here ? resolve_compute_dtype(ComputeChoice::Auto, *backend,
                                                      matmul_shapes(model, rows), &probe)
                              : resolve_compute_dtype(ComputeChoice::Auto, *backend)) ==
                  DType::BF16;
    comm->allreduce_sum_ordered(&bf16, 1);
    opt.dtype = bf16 == comm->size() ? ComputeChoice::Bf16 : ComputeChoice::Fp32;
  }
  json compute{{"dtype", word(opt.dtype)}, {"unit", unit.isa}};
  // How OpenMP's waiting threads wait (the CLI makes it passive unless told: zof.cpp).
  if (const char* w = std::getenv("OMP_WAIT_POLICY")) compute["omp_wait_policy"] = w;
  if (probe.measured) compute["probe"] = probe.to_json();
  // Of the base weights, before a resume (through the tier: as they are read, below).
  std::string fingerprint = load_into_tier ? "" : model.fingerprint();
  Tokenizer tok = Tokenizer::load(opt.model);
  tok.check_ids_below(model.config().vocab_size);  // before --out: an id past the embeddings
  // Before --out too: what a GGUF file cannot express (another architecture, tokenizer).
  if (opt.save_format == SaveFormat::Gguf) model.check_gguf_save(opt.model);
  const json model_id{{"config", model.config().raw}, {"num_params", model.num_params()}};
  // (Through the tier the fingerprint is taken as the weights go in, after --out exists: the
  // config is checked here, the weights there.)
  std::string model_warning = dir.check_model(model_id, fingerprint, opt.model);
  dir.check_data(data_fingerprint(opt), opt.data);  // a resumed run's data are the run's
  model.set_storage_dtype(storage);
  auto data = make_train_data(opt, tok, model.config().max_position);
  // Tensor parallel: the engine walks this rank's slice of the weights the run starts (or
  // resumes) with; rank 0 keeps the whole model to gather the slices into for evaluations,
  // checkpoints and the saved model, and the other ranks hold their slice only.
  std::optional<RunCounters> resumed;
  std::unique_ptr<TensorShare> share;
  if (opt.tensor_parallel > 1) {
    resumed = dir.load_checkpoint(model);
    share = std::make_unique<TensorShare>(*comm, job.grid, model);
  }
  ZOStepOptions zo = zo_step_options(opt);
  if (share) zo.perturb = false;  // its perturbed passes are the tensor-parallel forward's
  ZOEngine engine(share ? share->local() : model, *backend, data->max_rows(), zo);
  if (share) engine.set_tensor_slice(share->plan());
  auto estimator = share ? make_tensor_estimator(engine, *share, *backend, data->max_rows())
                         : make_estimator(opt, engine, model, *backend, data->max_rows());
  job.wire_pipeline(engine, (int)model.config().num_layers);
  // Through the tier, the checkpoint's weights go in once it exists (below).
  const bool ckpt_after_tier = load_into_tier || store_ckpt;
  RunCounters c = resumed             ? *resumed
                  : ckpt_after_tier ? dir.checkpoint_counters()  // its weights: below
                                    : dir.load_checkpoint(model);
  engine.forward().weights_changed();  // a checkpoint's weights replaced the model's
  // The saved model's dtype, from the model as loaded (--save-dtype input reads its file's
  // dtype: every rank rounds its slice alike).
  const DType saved = save_dtype(opt, model);
  std::unique_ptr<Forward> whole;  // rank 0's forward of the gathered model
  if (share) {
    if (job.root)
      whole = std::make_unique<Forward>(model, *backend, data->max_rows());
    else
      model = Model::zeros(model.config(), false);  // the slice is this rank's share
    job.set_tensor_share(share.get(), whole.get());
  }
  const int64_t start = c.step;
  // Streaming starts from the weights the run starts (or resumes) with: the model's storage,
  // which stays the master copy (current after every flush: evaluation, checkpoints, the end).
  // On a device (simulated or CUDA) the weights always stream: every block resident when they
  // fit. The JVP walk reads the same device blocks.
  if (opt.sim_device || opt.device == DeviceChoice::Cuda) {
    engine.enable_streaming(gpu_mem);
    estimator->use_streamer(engine.streamer());
  }
  // Momentum/Adam state once streaming (which keeps it in host memory) is settled.
  if (share) {  // the checkpoint's whole planes, this rank's slice of them
    std::vector<float> m, v;
    if (dir.read_optimizer_state(engine.state_planes(), model.storage_size(), opt.optimizer, m, v))
      engine.write_state(share->slice_plane(m), v.empty() ? v : share->slice_plane(v));
  } else if (!ckpt_after_tier) {
    dir.load_optimizer_state(engine, model, opt.optimizer);
  }
  // A checkpoint written inside a bf16 master's rounding window: the window's updates again.
  if (c.window_from >= 0)
    reopen_window((dir.path() / "zo_log.jsonl").string(), engine, opt, c.window_from, c.step);
  dir.check_unfinished();  // a finished run: refused once everything else has been checked
  // The disk tier's budget and directory, before --out exists.
  // Ranks would share the run's offload/ (and clear each other's stores): one process for now.
  ZOF_CHECK(host_mem == 0 || comm->size() == 1,
            "--host-mem (the disk tier) runs in one process for now, not " +
                std::to_string(comm->size()) + " ranks; drop --host-mem or run without mpirun");
  fs::path offload = offload_path(opt, dir.path());
  // The run's store (DiskStore): its checkpoints name their blocks' slots there instead of
  // copying the model. A resumed run whose checkpoint does so takes that store where it is.
  DiskStore store;
  uint64_t store_held = 0;  // bytes the adopted store already takes on its file system
  if (host_mem > 0) {
    const int planes = 1 + engine.state_planes();
    if (const auto cs = dir.checkpoint_store(model, planes)) {
      std::error_code ec;
      ZOF_CHECK(opt.offload_dir.empty() ||
                    fs::equivalent(fs::path(opt.offload_dir), cs->file.parent_path(), ec),
                "--offload-dir " + opt.offload_dir + ": the checkpoint's blocks are in " +
                    cs->file.string() + "; resume with --offload-dir " +
                    cs->file.parent_path().string() + ", or without --offload-dir");
      offload = cs->file.parent_path();
      store.file = cs->file;
      store.adopt = cs->slot;
      struct stat st {};
      if (::stat(cs->file.c_str(), &st) == 0) store_held = (uint64_t)st.st_blocks * 512;
    } else {
      store.file = offload / (opt.offload_dir.empty()
                                  ? std::string("zof-store.bin")
                                  : "zof-store-" + run_store_id(dir.path()) + ".bin");
    }
  }
  // The run's own offload/ (created and removed with the run), not a directory it was given,
  // or the one an adopted store lives in.
  const bool own_offload = offload == dir.path() / "offload";
  // A store a killed run left (zof-blocks-PID.bin of an older zof's process gone; this run's
  // store from before its first checkpoint that names it): removed before the free space is
  // counted.
  if (host_mem > 0) {
    remove_stale_stores(offload);
    std::error_code ec;
    if (store.adopt.empty()) fs::remove(store.file, ec);
  }
  if (host_mem > 0) check_offload_dir(opt, offload, engine.disk_tier_plan(host_mem), store_held);
  // From here a signal stops the run at a step boundary: never between creating --out and
  // writing run.json (which would leave a directory that is no run).
  std::optional<StopSignals> signals(std::in_place);
  dir.create(job.root);  // a new run's --out (removed again if the run fails before it starts)
  comm->barrier();  // every rank has checked the run directory before rank 0 writes into it
  if (host_mem > 0 && (!engine.disk_tier_plan(host_mem).all_resident() || store_ckpt)) {
    if (own_offload) {  // the run's own
      std::error_code ec;
      fs::create_directories(offload, ec);
      ZOF_CHECK(!ec, "cannot create " + offload.string() + ": " + ec.message() +
                         "; give --offload-dir a writable directory");
    }
    engine.enable_disk_tier(host_mem, offload.string(), 2, /*unwritten=*/load_into_tier, &store);
  }
  // A run that fails from here drops the tier with its weights: brought back whole, a model
  // larger than RAM would take the process down before its error is heard.
  // The run's own offload/ goes too (only when empty), so that a run refused here leaves an
  // --out that existed (empty) as it was.
  struct DropTier {
    ZOEngine& engine;
    fs::path own_offload;
    ~DropTier() {
      try {
        engine.disable_disk_tier(/*keep_weights=*/false);
      } catch (...) {
      }
      std::error_code ec;
      if (!own_offload.empty()) fs::remove(own_offload, ec);
    }
  } drop_tier{engine, own_offload && host_mem > 0 ? offload : fs::path()};
  if (load_into_tier) {
    // The base weights through the tier (never whole in RAM), their fingerprint as they pass.
    model.read_weights(opt.model, engine.host_blocks(), &fingerprint, fingerprint_as);
    model_warning = dir.check_model(model_id, fingerprint, opt.model);
    engine.set_sparsity_from_weights();  // of the base weights, as the engine takes them in RAM
  }
  if (ckpt_after_tier) {
    // Then a resumed run's checkpoint over them (from the store, the slots it names, checked),
    // and its optimizer state.
    dir.load_checkpoint(model, engine.host_blocks());
    engine.forward().weights_changed();
    dir.load_optimizer_state(engine, model, opt.optimizer);
  }
  if (job.root) dir.start(opt, model_id, fingerprint, compute, c);

  QuietSink quiet;
  std::unique_ptr<TrainSink> terminal = job.root && !user_sink ? make_terminal_sink() : nullptr;
  TrainSink& sink = !job.root ? quiet : user_sink ? *user_sink : *terminal;
  sink.message("zof finetune: " + std::to_string(model.num_params()) + " parameters, " +
               data->describe() + job.describe(opt.threads) + ", " + word(opt.dtype) +
               " matrix products (" + unit.isa + probe_words(probe) + ")" +
               (model.storage_dtype() == DType::BF16 ? ", bf16 master (2 bytes a parameter)"
                : opt.master == MasterChoice::Bf16    ? ", bf16 master (in fp32 storage)"
                                                      : "") +
               (opt.round_every > 1
                    ? ", rounded every " + std::to_string(opt.round_every) + " steps"
                    : "") +
               (dir.resuming() ? ", resuming at step " + std::to_string(start) : ""));
  if (engine.streamer())
    sink.message("streaming on " + backend->name() + ": " + engine.streamer()->describe());
  if (!host_mem_why.empty()) sink.message(host_mem_why);
  if (host_mem > 0)
    sink.message("disk tier: " + (engine.disk_tier() ? engine.disk_tier()->describe()
                                                     : "--host-mem " + format_bytes(host_mem) +
                                                           " holds every block in host memory"));
  if (!model_warning.empty()) sink.message(model_warning);
  if (const std::string w = data->warning(); !w.empty()) sink.message("zof: warning: " + w);

  Evaluator eval(job, engine, model, *data, job.root ? &dir.metrics() : nullptr, &sink);
  StepLoop loop(opt, job, dir, engine, model, *estimator, *data, eval, sink, c);
  const LoopEnd end = loop.run();
  signals.reset();
  sink.finish();
  Run run{opt, dir, job, *backend, model, engine, eval, loop, sink, c, saved};
  json summary = finish(run, end, start);
  if (host_mem > 0 && summary.contains("steps")) {  // what the budget is against
    json& t = summary["disk_tier"];
    if (!t.is_object()) t = json{{"blocks_on_disk", 0}};
    t["host_mem"] = host_mem;
    t["least_bytes"] = engine.disk_tier_minimum();
    t["all_bytes"] = DiskTier::all_bytes(model, 1 + engine.state_planes());
  }
  if (host_mem > 0) {
    // The model is saved: a finished run's store keeps only its final checkpoint's blocks (the
    // exact master); a store no checkpoint names goes, and the run's own offload/ when empty.
    if (DiskTier* t = engine.disk_tier(); t && summary.contains("steps") &&
                                          !summary.value("interrupted", false))
      t->release_free_slots();
    engine.disable_disk_tier(/*keep_weights=*/false);
    std::error_code ec;
    if (own_offload) fs::remove(offload, ec);  // only when empty
  }
  if (job.root) {
    // The step log as the run ended (replay checks it against these when the run's
    // checkpoints are gone).
    summary["log_bytes"] = dir.zo_log().sync();
    summary["log_hash"] = dir.zo_log().hash();
    // And run.json's seal: replay refuses an edited run.json there too.
    summary["run_seal"] = dir.run_seal();
  }
  if (job.root) write_run_report(opt, dir, summary, *backend, sink);
  return summary;
}

}  // namespace zof
