// The commands (commands.h): generate and eval (text from a model, its perplexity on a file, on
// the CPU or streamed through a device), finetune, replay and report: their flags and their runs.
#include "commands.h"

#include <cstdio>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "zof/backend.h"
#include "zof/disk_tier.h"
#include "zof/dist.h"
#include "zof/error.h"
#include "zof/input_file.h"
#include "zof/model.h"
#include "zof/report.h"
#include "zof/runtime.h"
#include "zof/streaming.h"
#include "zof/tensor_parallel.h"
#include "zof/text.h"
#include "zof/tokenizer.h"
#include "zof/trainer.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace zof::cli {

namespace {

const NumberRule& train_rule(const char* flag) { return *zof::train_flag_rule(flag); }

// ---- generate, eval ---------------------------------------------------------------------------

const NumberRule& text_rule(const char* flag) { return *zof::text_flag_rule(flag); }
const NumberRule& kMaxNewTokens = text_rule("--max-new-tokens");
const NumberRule& kTemperature = text_rule("--temperature");
const NumberRule& kTopP = text_rule("--top-p");
const NumberRule& kEvalSeqLen = text_rule("--seq-len");
const NumberRule& kEvalBatch = text_rule("--batch");
const NumberRule& kMaxWindows = text_rule("--max-windows");
const NumberRule& kTensorParallel = text_rule("--tensor-parallel");
// A rank of a tensor-parallel eval that waits on its peers longer than this stops the job.
constexpr double kEvalTimeoutS = 300;

const char* const kDtypeHelp =
    "Matrix products in bf16 (weights rounded to bf16, fp32 accumulation) or fp32; auto: bf16 "
    "where it is faster (AMX CPUs, GPU tensor cores), else fp32";

void validate_generate(const GenerateArgs& a) {
  zof::check_whole("--max-new-tokens", a.max_new_tokens, kMaxNewTokens);
  zof::check_real("--temperature", a.temperature, kTemperature);
  zof::check_real("--top-p", a.top_p, kTopP);
  zof::check_whole("--threads", a.threads, train_rule("--threads"));
}

// The backend for generate and eval (--threads cores on the host) and where it reads the
// weights.
std::unique_ptr<zof::Backend> text_backend(const DeviceArgs& d, int threads,
                                           zof::WeightPlacement& place) {
  const zof::DeviceChoice where =
      zof::read_choice_text<zof::DeviceChoice>("--device", d.device, {"cpu", "cuda"});
  const bool cuda = where == zof::DeviceChoice::Cuda;
  ZOF_CHECK(!cuda || !d.sim_device,
            "--sim-device simulates a GPU on the CPU: drop it with --device cuda");
  const bool device = d.sim_device || cuda;
  ZOF_CHECK(device || d.gpu_mem.empty(),
            "--gpu-mem budgets device memory, and --device cpu has none; add --device cuda, or "
            "--sim-device to run the streaming schedule on the simulated device");
  place.stream = device;
  place.budget = d.gpu_mem.empty() ? 0 : zof::parse_memory_size(d.gpu_mem, "--gpu-mem");
  zof::BackendOptions b;
  b.device = where;
  b.threads = threads;
  b.sim_device = d.sim_device;
  b.sim_budget = place.budget;
  b.tf32 = d.tf32;
  const auto dtype = zof::read_choice_text<zof::ComputeChoice>("--dtype", d.dtype);
  auto be = zof::make_backend(b);
  place.compute = zof::resolve_compute_dtype(dtype, *be);
  return be;
}

void add_device_flags(CLI::App* app, DeviceArgs& d) {
  app->add_option("--device", d.device, "cpu, or cuda: the weights streamed from host memory "
                  "through the GPU within --gpu-mem (all resident if they fit)")
      ->capture_default_str();
  app->add_option("--gpu-mem", d.gpu_mem, "Device memory budget, e.g. 16GiB or 512MiB (default: "
                  "what the device has free)");
  app->add_flag("--sim-device", d.sim_device, "Run on the simulated device (host memory with the "
                "--gpu-mem budget): the streaming schedule without a GPU");
  app->add_option("--dtype", d.dtype, kDtypeHelp)->capture_default_str();
  app->add_flag("--tf32", d.tf32, "With --device cuda: the fp32 products on TF32 tensor cores");
  app->add_option("--host-mem", d.host_mem,
                  "Host memory budget for the weights, e.g. 8GiB or bytes: blocks that fit stay "
                  "in RAM, the rest are loaded into a file in --offload-dir and read back as each "
                  "pass reaches them (a model larger than RAM; default: all in RAM)");
  app->add_option("--offload-dir", d.offload_dir,
                  "With --host-mem: the directory (on a local file system) for the blocks beyond "
                  "it (default: the current directory); the file is removed at the end");
}

void validate_eval(const EvalArgs& a) {
  if (a.seq_len_given) zof::check_whole("--seq-len", a.seq_len, kEvalSeqLen);
  zof::check_whole("--batch", a.batch, kEvalBatch);
  zof::check_whole("--max-windows", a.max_windows, kMaxWindows);
  zof::check_whole("--tensor-parallel", a.tensor_parallel, kTensorParallel);
  zof::check_whole("--threads", a.threads, train_rule("--threads"));
}

// What generate and eval run on: the model directory checked, the backend and where it reads
// the weights, the model, and its tokenizer (no id beyond the embeddings).
struct TextModel {
  std::unique_ptr<zof::Backend> backend;
  std::unique_ptr<zof::TextWeights> weights;  // its model must not move: the tier points at it
  zof::Tokenizer tok;
};

// --host-mem for generate and eval: the budget, or 0 (no flag: every block in RAM). Refused
// with a device (the streamer reads the host masters whole), and --offload-dir without it.
uint64_t text_host_mem(const DeviceArgs& d) {
  ZOF_CHECK(d.offload_dir.empty() || !d.host_mem.empty(),
            "--offload-dir holds the blocks that do not fit --host-mem: add --host-mem SIZE, or "
            "drop --offload-dir");
  if (d.host_mem.empty()) return 0;
  const uint64_t bytes = zof::parse_memory_size(d.host_mem, "--host-mem");
  ZOF_CHECK(!d.sim_device && d.device == "cpu",
            "--host-mem (the disk tier) reads the weights on the host for generate and eval, "
            "not through --device cuda or --sim-device: drop one of them");
  return bytes;
}

// The model as a pass reads it: loaded whole, or with --host-mem laid out only (its weights
// read by tier_weights), and its tokenizer (no id beyond the embeddings) before the weights.
TextModel load_text_model(const std::string& dir, const DeviceArgs& where, int threads,
                          zof::WeightPlacement& place) {
  zof::check_model_dir("--model", dir);
  const uint64_t host_mem = text_host_mem(where);
  auto backend = text_backend(where, threads, place);
  auto weights = zof::lay_out_text_weights(dir, host_mem, "--host-mem");
  zof::Tokenizer tok = zof::Tokenizer::load(dir);
  tok.check_ids_below(weights->model.config().vocab_size);
  return {std::move(backend), std::move(weights), std::move(tok)};
}

// With --host-mem: the blocks beyond it go into a disk tier as the weights are read, the rest
// stay in RAM; the passes read through it.
void tier_weights(TextModel& tm, const std::string& dir, const DeviceArgs& where,
                  zof::WeightPlacement& place) {
  zof::read_text_weights(*tm.weights, dir, text_host_mem(where), where.offload_dir,
                         "--offload-dir", place);
}

}  // namespace

int run_generate(const GenerateArgs& a) {
  validate_generate(a);
  zof::WeightPlacement place;
  TextModel tm = load_text_model(a.model, a.where, a.threads, place);
  tier_weights(tm, a.model, a.where, place);
  auto& [backend, weights, tok] = tm;
  zof::Model& model = weights->model;
  zof::SampleOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
  opt.max_new_is_default = !a.max_new_given;
  opt.temperature = a.temperature;
  opt.top_p = a.top_p;
  opt.seed = a.seed;
  size_t shown = 0;  // bytes of the text already printed
  json j = zof::generate_text(model, tok, *backend, a.prompt, opt, [&](const std::string& text) {
    if (a.json) return;
    std::cout << text.substr(shown) << std::flush;
    shown = text.size();
  }, place);
  if (a.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "\n";
    const size_t n = j["new_tokens"];
    const double tps = j["tokens_per_s"];
    std::fprintf(stderr, "zof: %zu tokens in %.2f s (%.1f tokens/s)\n", n, n / std::max(tps, 1e-9),
                 tps);
  }
  return 0;
}

// eval --task: the task's held-out metric, with finetune's defaults for what is not given.
int run_eval_task(const EvalArgs& a) {
  ZOF_CHECK(a.text.empty(), "eval takes --text FILE (perplexity) or --task WORD --data PATH "
                            "(a task's held-out metric), not both");
  ZOF_CHECK(a.max_windows == 0, "--max-windows counts --text's windows; with --task, "
                                "--eval-examples says how many examples are scored");
  ZOF_CHECK(!a.data.empty(), "zof eval --task " + std::string(zof::word(*a.task)) +
                                 " needs --data PATH, the task's data file or directory");
  ZOF_CHECK(a.tensor_parallel == 1, "--tensor-parallel splits eval --text's model for now; "
                                    "eval --task runs in one process: drop --tensor-parallel");
  zof::TrainOptions t;
  t.model = a.model;
  t.task = *a.task;
  t.data = a.data;
  t.eval_examples = a.eval_examples;
  t.seed = a.seed;
  t.threads = a.threads;
  if (a.seq_len_given) t.seq_len = a.seq_len;
  if (a.batch_given) t.batch = a.batch;
  zof::validate_options(t);
  zof::check_task_data(t.task, t.data);  // before loading
  zof::WeightPlacement place;
  TextModel tm = load_text_model(a.model, a.where, a.threads, place);
  tier_weights(tm, a.model, a.where, place);
  auto& [backend, weights, tok] = tm;
  zof::Model& model = weights->model;
  json j = zof::evaluate_task(model, tok, *backend, t, place);
  if (a.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: %s %.4f (%.2f s)\n", j["data"].get<std::string>().c_str(),
                j["metric"].get<std::string>().c_str(), j["value"].get<double>(),
                j["eval_s"].get<double>());
  }
  return 0;
}

int run_eval(const EvalArgs& a) {
  validate_eval(a);
  if (a.task) return run_eval_task(a);
  ZOF_CHECK(!a.text.empty(), "zof eval needs --text FILE (perplexity) or --task WORD and "
                             "--data PATH (a task's held-out metric)");
  ZOF_CHECK(a.data.empty(), "--data goes with --task; --text names eval's text file");
  zof::check_input_file("--text", a.text, "--text takes one plain-text file");  // before loading
  // A model tensor parallel cannot split is refused from its config, before the weights load.
  ZOF_CHECK(a.tensor_parallel == 1 || a.where.host_mem.empty(),
            "--tensor-parallel splits the model in RAM: drop --host-mem");
  if (a.tensor_parallel > 1 && std::filesystem::is_directory(a.model)) {
    zof::check_model_dir("--model", a.model);
    zof::tp::check(zof::ModelConfig::load((std::filesystem::path(a.model) / "config.json").string()),
                   (int)a.tensor_parallel);
  }
  zof::WeightPlacement place;
  TextModel tm = load_text_model(a.model, a.where, a.threads, place);
  tier_weights(tm, a.model, a.where, place);
  auto& [backend, weights, tok] = tm;
  zof::Model& model = weights->model;
  const std::string text = zof::read_eval_text(a.text);
  json j;
  std::unique_ptr<zof::dist::Communicator> world;
  if (a.tensor_parallel > 1) {
    const int T = (int)a.tensor_parallel;
    // The tensor-parallel forward computes in fp32: --dtype auto means fp32 here (an AMX CPU's
    // unit would choose bf16), and only a bf16 asked for is refused.
    ZOF_CHECK(!place.stream && a.where.dtype != "bf16",
              "--tensor-parallel runs fp32 on the CPU for now: drop --device cuda, --sim-device "
              "and --dtype bf16");
    place.compute = zof::DType::F32;
    zof::tp::check(model.config(), T);  // the model's refusal before the ranks' count
    int ranks = 1;
    zof::dist::launched_by_mpi(&ranks);
    ZOF_CHECK(ranks == T, "--tensor-parallel " + std::to_string(T) + " splits the model over " +
                              std::to_string(T) + " ranks, and this job has " +
                              std::to_string(ranks) + "; start it with mpirun -np " +
                              std::to_string(T));
    world = zof::dist::connect_world(kEvalTimeoutS);
    j = zof::evaluate_text_tensor_parallel(model, tok, *backend, text, "--text " + a.text,
                                           a.seq_len, a.batch, a.max_windows, *world, T);
    if (world->rank() != 0) return 0;  // rank 0 prints
  } else {
    j = zof::evaluate_text(model, tok, *backend, text, "--text " + a.text, a.seq_len, a.batch,
                           a.max_windows, place);
  }
  if (a.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: nll %.4f  perplexity %.3f  over %lld tokens in %lld windows of %lld (%.2f s)\n",
                a.text.c_str(), j["nll"].get<double>(), j["ppl"].get<double>(),
                (long long)j["tokens"].get<int64_t>(), (long long)j["windows"].get<int64_t>(),
                (long long)j["seq_len"].get<int64_t>(), j["eval_s"].get<double>());
  }
  return 0;
}

// ---- finetune, replay, report -----------------------------------------------------------------

CLI::App* add_generate(CLI::App& app, GenerateArgs& g, NumberFlags& n) {
  auto* gen = app.add_subcommand("generate", "Generate text from a prompt");
  gen->add_option("--model", g.model, "Hugging Face model directory, or a GGUF file")->required();
  gen->add_option("--prompt", g.prompt, "Prompt text (default: empty, start from BOS)");
  n.add(gen, "--max-new-tokens", g.max_new_tokens, "Tokens to generate", &kMaxNewTokens);
  n.add(gen, "--temperature", g.temperature, "Sampling temperature; 0 is greedy", &kTemperature);
  n.add(gen, "--top-p", g.top_p, "Nucleus sampling probability mass", &kTopP);
  n.add(gen, "--seed", g.seed, "Sampling seed (0 to 2^64 - 1)", nullptr);
  n.add(gen, "--threads", g.threads, "CPU threads (0: all cores)", &train_rule("--threads"));
  gen->add_flag("--json", g.json, "Print one JSON object as the last line");
  add_device_flags(gen, g.where);
  return gen;
}

CLI::App* add_eval(CLI::App& app, EvalArgs& e, NumberFlags& n) {
  auto* ev = app.add_subcommand("eval", "Perplexity of a model on a text file: mean next-token NLL over windows of --seq-len tokens, "
      "each from BOS; '<|endoftext|>' separates documents, and windows never cross one. Or, with "
      "--task, a task's held-out metric exactly as finetune evaluates it");
  ev->add_option("--model", e.model, "Hugging Face model directory, or a GGUF file")->required();
  ev->add_option("--text", e.text, "Plain-text file");
  n.add_words(
      ev, "--task",
      [&e](const std::string& t) { e.task = zof::read_choice_text<zof::Task>("--task", t); },
      "Instead of --text: " + zof::choice_list(std::vector<const char*>(
                                  zof::choice_words(zof::Task{}).begin(),
                                  zof::choice_words(zof::Task{}).end())) +
          "; the held-out examples finetune samples with the same --data, --eval-examples, "
          "--seed and --seq-len (accuracy, or perplexity for jsonl and text)",
      "");
  ev->add_option("--data", e.data, "With --task: the task's data file or directory");
  n.add(ev, "--eval-examples", e.eval_examples, "With --task: evaluation examples sampled",
        &train_rule("--eval-examples"));
  n.add(ev, "--seed", e.seed, "With --task: the seed that samples them (0 to 2^64 - 1)", nullptr);
  n.add(ev, "--seq-len", e.seq_len,
        "Window length in tokens (default: context, at most 512); with --task, the longest "
        "sequence (default 128)",
        &kEvalSeqLen, false);
  n.add(ev, "--batch", e.batch, "Windows per forward pass (with --task: finetune's --batch, 16)",
        &kEvalBatch);
  n.add(ev, "--max-windows", e.max_windows, "Evaluate at most this many windows (0: all)",
        &kMaxWindows);
  n.add(ev, "--threads", e.threads, "CPU threads (0: all cores)", &train_rule("--threads"));
  n.add(ev, "--tensor-parallel", e.tensor_parallel,
        "Under mpirun -np T: split the model over T ranks (heads, FFN width, vocabulary; "
        "LLaMA family, fp32 CPU)", &kTensorParallel);
  ev->add_flag("--json", e.json, "Print one JSON object as the last line");
  add_device_flags(ev, e.where);
  return ev;
}

CLI::App* add_finetune(CLI::App& app, FinetuneArgs& f, NumberFlags& n) {
  zof::TrainOptions& t = f.t;
  auto* ft =
      app.add_subcommand("finetune", "Fine-tune every parameter with forward passes only (MeZO)");
  ft->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  ft->add_option("--config", f.config_file,
                 "Read options from a file of `key = value` lines (flag names without dashes, # "
                 "comments); command-line flags override it");
  for (const zof::OptionSpec& spec : zof::train_options()) {
    const std::string name = spec.flag();
    std::visit(
        [&](auto field) {
          auto& target = t.*field;
          using T = std::remove_reference_t<decltype(target)>;
          if constexpr (std::is_same_v<T, bool>) {
            ft->add_flag(name, target, spec.help);
          } else if constexpr (std::is_same_v<T, std::string>) {
            CLI::Option* o = ft->add_option(name, target, spec.help);
            if (!target.empty()) o->capture_default_str();
          } else if constexpr (std::is_enum_v<T>) {
            n.add_words(
                ft, name, [&t, &spec](const std::string& text) { spec.set(t, text); }, spec.help,
                zof::word(target));
          } else {
            n.add(ft, name, target, spec.help, spec.rule());
          }
        },
        spec.field);
  }
  return ft;
}

CLI::App* add_replay(CLI::App& app, ReplayArgs& r, NumberFlags& n) {
  auto* rp = app.add_subcommand("replay", "Rebuild fine-tuned weights from a base model and a run's step log");
  rp->add_option("--model", r.model, "The base model the run started from")->required();
  rp->add_option("--log", r.log, "The run directory (its zo_log.jsonl)")->required();
  rp->add_option("--out", r.out, "Directory for the rebuilt model")->required();
  n.add(rp, "--steps", r.steps, "Rebuild only the log's first N steps (default: the whole run, "
        "which the log must hold)", &train_rule("--steps"), false);
  n.add(rp, "--threads", r.threads, "CPU threads (0: all cores)", &train_rule("--threads"));
  rp->add_flag("--json", r.json, "Print one JSON object as the last line");
  return rp;
}

CLI::App* add_report(CLI::App& app, ReportArgs& r) {
  auto* rp = app.add_subcommand("report", "Write one self-contained HTML page of a run's curves "
      "(loss, held-out metric, throughput, memory), options and summary; several runs are overlaid");
  rp->add_option("runs", r.runs, "Run directories (written by zof finetune; a run in progress too)")
      ->required();
  rp->add_option("--out", r.out, "The HTML file (default: RUN_DIR/report.html; required for "
                 "several runs)");
  return rp;
}

int run_report(const ReportArgs& r) {
  ZOF_CHECK(r.runs.size() == 1 || !r.out.empty(),
            "report of " + std::to_string(r.runs.size()) + " runs needs --out FILE.html (where "
            "the comparison goes)");
  const std::string out =
      r.out.empty() ? (fs::path(r.runs[0]) / "report.html").string() : r.out;
  // Before anything is read: a report never replaces anything but an earlier report.
  zof::check_report_out(r.runs, out, r.out.empty() ? "" : "--out");
  zof::write_report(r.runs, out);
  std::fprintf(stderr, "zof: wrote %s\n", out.c_str());
  return 0;
}

int run_finetune(const CLI::App* ft, const FinetuneArgs& f,
                 const std::map<std::string, std::string>& from_config) {
  const zof::TrainOptions& t = f.t;
  // Every flag error before anything is loaded or created. A resumed run's flags are checked
  // by finetune() against the run's own (--resume's rule), with the --config line of each.
  if (t.resume.empty()) {
    ZOF_CHECK(!t.model.empty(), "finetune needs --model DIR (or --resume RUN_DIR)");
    ZOF_CHECK(!t.out.empty(), "finetune needs --out DIR, the run directory to write");
    ZOF_CHECK(!t.data.empty(), "finetune needs --data PATH, the task's data file or directory");
    zof::validate_options(t);
    zof::check_model_dir("--model", t.model);
    zof::check_task_data(t.task, t.data);
  }
  zof::GivenOptions given;
  for (const CLI::Option* o : ft->get_options()) {
    if (o->count() == 0 || o->get_name().rfind("--", 0) != 0) continue;
    std::string key = o->get_name().substr(2);
    for (auto& c : key) c = c == '-' ? '_' : c;
    const auto it = from_config.find(o->get_name());
    given[key] = it == from_config.end() ? "" : it->second;
  }
  auto summary = zof::finetune(t, nullptr, &given);
  // The run's result: always one JSON line, from rank 0 alone under mpirun.
  if (!summary.contains("rank")) std::cout << summary.dump() << "\n";
  // Stopped by a signal: 128 + its number, as a shell reports a process it ended (SIGINT 130,
  // SIGTERM 143); by a signal to another rank or a stop request: SIGINT's.
  if (!summary.value("interrupted", false)) return 0;
  return 128 + summary.value("signal", 2);
}

int run_replay(const ReplayArgs& r) {
  zof::check_whole("--threads", r.threads, train_rule("--threads"));
  if (r.steps_given) zof::check_whole("--steps", r.steps, train_rule("--steps"));
  zof::check_model_dir("--model", r.model);
  auto summary = zof::replay(r.model, r.log, r.out, r.threads, r.steps);
  std::cout << (r.json ? summary.dump() : summary.dump(1)) << "\n";
  return 0;
}

}  // namespace zof::cli
