// zof command line: generate, eval, finetune, replay, report, each with one function declaring
// its flags and one running it. Every user-caused problem ends as one line "zof: error: ..." and a
// non-zero exit; --json makes the last line one JSON object.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "zof/backend.h"
#include "zof/error.h"
#include "zof/model.h"
#include "zof/report.h"
#include "zof/runtime.h"
#include "zof/streaming.h"
#include "zof/text.h"
#include "zof/tokenizer.h"
#include "zof/trainer.h"
#include "zof/version.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_text_file(const std::string& path, const std::string& flag) {
  ZOF_CHECK(fs::is_regular_file(path), flag + " " + path + ": no such file");
  std::ifstream f(path, std::ios::binary);
  ZOF_CHECK(f.good(), flag + " " + path + ": cannot be read (check its permissions)");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Where generate and eval run: --device cpu (the model's storage), or a device (--device cuda,
// --sim-device) that the weights stream through within --gpu-mem.
struct DeviceArgs {
  std::string device = "cpu", gpu_mem;
  bool sim_device = false;
};

struct GenerateArgs {
  DeviceArgs where;
  std::string model, prompt;
  int64_t max_new_tokens = 128;
  float temperature = 0.f, top_p = 1.f;
  uint64_t seed = 0;
  int threads = 0;
  bool json = false;
};

// The backend for generate and eval (--threads cores on the host) and where it reads the
// weights.
std::unique_ptr<zof::Backend> text_backend(const DeviceArgs& d, int threads,
                                           zof::WeightPlacement& place) {
  ZOF_CHECK(d.device == "cpu" || d.device == "cuda",
            "--device must be cpu or cuda, not '" + d.device + "'");
  ZOF_CHECK(d.device == "cpu" || !d.sim_device,
            "--sim-device simulates a GPU on the CPU: drop it with --device cuda");
  const bool device = d.sim_device || d.device == "cuda";
  ZOF_CHECK(device || d.gpu_mem.empty(),
            "--gpu-mem budgets device memory, and --device cpu has none; add --device cuda, or "
            "--sim-device to run the streaming schedule on the simulated device");
  place.stream = device;
  place.budget = d.gpu_mem.empty() ? 0 : zof::parse_memory_size(d.gpu_mem, "--gpu-mem");
  zof::BackendOptions b;
  b.device = d.device;
  b.threads = threads;
  b.sim_device = d.sim_device;
  b.sim_budget = place.budget;
  return zof::make_backend(b);
}

void add_device_flags(CLI::App* app, DeviceArgs& d) {
  app->add_option("--device", d.device, "cpu, or cuda: the weights streamed from host memory "
                  "through the GPU within --gpu-mem (all resident if they fit)")
      ->capture_default_str();
  app->add_option("--gpu-mem", d.gpu_mem, "Device memory budget, e.g. 16GiB or 512MiB (default: "
                  "what the device has free)");
  app->add_flag("--sim-device", d.sim_device, "Run on the simulated device (host memory with the "
                "--gpu-mem budget): the streaming schedule without a GPU");
}

int run_generate(const GenerateArgs& a) {
  zof::WeightPlacement place;
  auto backend = text_backend(a.where, a.threads, place);
  zof::Model model = zof::Model::load(a.model);
  zof::Tokenizer tok = zof::Tokenizer::load(a.model);
  zof::SampleOptions opt;
  opt.max_new_tokens = a.max_new_tokens;
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

struct EvalArgs {
  DeviceArgs where;
  std::string model, text;
  int64_t seq_len = 0, batch = 8, max_windows = 0;
  int threads = 0;
  bool json = false;
};

int run_eval(const EvalArgs& a) {
  zof::WeightPlacement place;
  auto backend = text_backend(a.where, a.threads, place);
  zof::Model model = zof::Model::load(a.model);
  zof::Tokenizer tok = zof::Tokenizer::load(a.model);
  const std::string text = read_text_file(a.text, "--text");
  json j = zof::evaluate_text(model, tok, *backend, text, "--text " + a.text, a.seq_len, a.batch,
                              a.max_windows, place);
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

// `zof finetune --config FILE ...`: the file's `key = value` lines become flags placed before
// the command line's, so that flags given on the command line win (options take the last value).
std::vector<std::string> expand_config(int argc, char** argv) {
  std::vector<std::string> in(argv, argv + argc), out;
  size_t sub = 0;
  while (sub < in.size() && in[sub] != "finetune") ++sub;
  if (sub == in.size()) return in;
  std::string path;
  for (size_t i = sub + 1; i < in.size(); ++i) {
    if (in[i] == "--config" && i + 1 < in.size()) path = in[i + 1];
    if (in[i].rfind("--config=", 0) == 0) path = in[i].substr(9);
  }
  out.assign(in.begin(), in.begin() + sub + 1);
  if (!path.empty()) {
    std::ifstream f(path);
    ZOF_CHECK(f.good(), "--config " + path + ": cannot read the file");
    std::string line;
    int lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      auto trim = [](std::string x) {
        const size_t a = x.find_first_not_of(" \t\r"), b = x.find_last_not_of(" \t\r");
        return a == std::string::npos ? std::string() : x.substr(a, b - a + 1);
      };
      const size_t hash = line.find('#');
      line = trim(hash == std::string::npos ? line : line.substr(0, hash));
      if (line.empty() || line[0] == '[') continue;  // blank, comment, or a TOML section header
      const size_t eq = line.find('=');
      ZOF_CHECK(eq != std::string::npos, "--config " + path + " line " + std::to_string(lineno) +
                                             ": expected `key = value`, found `" + line + "`");
      std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
      for (auto& c : key) c = c == '_' ? '-' : c;
      if (value.size() >= 2 && (value[0] == '"' || value[0] == '\'') && value.back() == value[0])
        value = value.substr(1, value.size() - 2);
      ZOF_CHECK(!key.empty() && key != "config", "--config " + path + " line " +
                                                     std::to_string(lineno) + ": bad key `" + key + "`");
      if (key == "json") {
        if (value == "true") out.push_back("--json");
        continue;
      }
      out.push_back("--" + key);
      out.push_back(value);
    }
  }
  out.insert(out.end(), in.begin() + sub + 1, in.end());
  return out;
}

struct FinetuneArgs {
  zof::TrainOptions t;
  std::string config_file;  // applied by expand_config() before parsing
};

struct ReplayArgs {
  std::string model, log, out;
  int threads = 0;
  bool json = false;
};

struct ReportArgs {
  std::vector<std::string> runs;
  std::string out;
};

CLI::App* add_generate(CLI::App& app, GenerateArgs& g) {
  auto* gen = app.add_subcommand("generate", "Generate text from a prompt");
  gen->add_option("--model", g.model, "Hugging Face model directory")->required();
  gen->add_option("--prompt", g.prompt, "Prompt text (default: empty, start from BOS)");
  gen->add_option("--max-new-tokens", g.max_new_tokens, "Tokens to generate")
      ->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  gen->add_option("--temperature", g.temperature, "Sampling temperature; 0 is greedy")
      ->capture_default_str()->check(CLI::Range(0.f, 100.f));
  gen->add_option("--top-p", g.top_p, "Nucleus sampling probability mass")
      ->capture_default_str()->check(CLI::Range(1e-6f, 1.f));
  gen->add_option("--seed", g.seed, "Sampling seed")->capture_default_str();
  gen->add_option("--threads", g.threads, "CPU threads (0: all cores)")->capture_default_str()
      ->check(CLI::Range(0, 4096));
  gen->add_flag("--json", g.json, "Print one JSON object as the last line");
  add_device_flags(gen, g.where);
  return gen;
}

CLI::App* add_eval(CLI::App& app, EvalArgs& e) {
  auto* ev = app.add_subcommand("eval", "Perplexity of a model on a text file: mean next-token NLL over windows of --seq-len tokens, "
      "each from BOS; '<|endoftext|>' separates documents, and windows never cross one");
  ev->add_option("--model", e.model, "Hugging Face model directory")->required();
  ev->add_option("--text", e.text, "Plain-text file")->required();
  ev->add_option("--seq-len", e.seq_len, "Window length in tokens (default: context, at most 512)")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 20));
  ev->add_option("--batch", e.batch, "Windows per forward pass")->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  ev->add_option("--max-windows", e.max_windows, "Evaluate at most this many windows (0: all)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  ev->add_option("--threads", e.threads, "CPU threads (0: all cores)")->capture_default_str()
      ->check(CLI::Range(0, 4096));
  ev->add_flag("--json", e.json, "Print one JSON object as the last line");
  add_device_flags(ev, e.where);
  return ev;
}

// What a run computes: the flags saved in run.json.
CLI::App* add_finetune(CLI::App& app, FinetuneArgs& f) {
  zof::TrainOptions& t = f.t;
  auto* ft = app.add_subcommand("finetune", "Fine-tune every parameter with forward passes only (MeZO)");
  ft->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  ft->add_option("--config", f.config_file, "Read options from a file of `key = value` lines (flag "
                 "names without dashes, # comments); command-line flags override it");
  ft->add_option("--model", t.model, "Hugging Face model directory");
  ft->add_option("--task", t.task, "text | sst2 | rte | cb | copa | jsonl")->capture_default_str();
  ft->add_option("--data", t.data, "Data file or directory of the task");
  ft->add_option("--objective", t.objective, "What sst2/rte/cb/copa train on: lm (the correct "
                 "answer's tokens) | classification (MeZO's cross-entropy over the candidates' "
                 "mean log-likelihoods) | auto (MeZO's choice: classification for sst2, rte and "
                 "cb, lm for copa; lm for text and jsonl)")->capture_default_str();
  ft->add_option("--out", t.out, "Run directory: metrics, checkpoints and the fine-tuned model");
  ft->add_option("--resume", t.resume, "Continue the run in this directory");
  ft->add_option("--steps", t.steps, "ZO steps")->capture_default_str()->check(CLI::PositiveNumber);
  ft->add_option("--lr", t.lr, "Learning rate")->capture_default_str()->check(CLI::NonNegativeNumber);
  ft->add_option("--eps", t.eps, "Perturbation scale epsilon")->capture_default_str()->check(CLI::PositiveNumber);
  ft->add_option("--weight-decay", t.weight_decay, "Weight decay (not on norms and biases)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  ft->add_option("--batch", t.batch, "Examples (or text windows) per step")->capture_default_str()
      ->check(CLI::PositiveNumber);
  ft->add_option("--micro-batches", t.micro_batches, "Split each batch into this many forward passes "
                 "(gradient accumulation)")->capture_default_str()->check(CLI::PositiveNumber);
  ft->add_option("--queries", t.queries, "Random directions averaged per step")->capture_default_str()
      ->check(CLI::Range(1, 1024));
  ft->add_option("--seed", t.seed, "Seed of perturbations and data sampling")->capture_default_str();
  ft->add_option("--schedule", t.schedule, "constant | linear | cosine")->capture_default_str()
      ->check(CLI::IsMember({"constant", "linear", "cosine"}));
  // Checked by finetune() (a zof::Error naming the flag), not by CLI11.
  ft->add_option("--estimator", t.estimator, "spsa (two-point MeZO) | jvp (forward gradient: "
                 "exact directional derivatives by forward-mode AD, no --eps)")->capture_default_str();
  ft->add_option("--z", t.z, "Perturbation directions: gaussian (MeZO) | rademacher (+-1)")
      ->capture_default_str();
  ft->add_flag("--one-sided", t.one_sided, "One-sided differences (L(theta+eps z) - L(theta)) / eps: "
               "q + 1 forwards per step instead of 2q");
  ft->add_option("--sparsity", t.sparsity, "Sparse MeZO: fraction of each weight matrix (largest "
                 "|theta|) left unperturbed and unchanged; 0: dense")->capture_default_str();
  ft->add_option("--optimizer", t.optimizer, "sgd (MeZO) | momentum (ZO-SGD with momentum) | adam "
                 "(ZO-Adam; state in memory, saved with checkpoints)")->capture_default_str();
  ft->add_option("--beta1", t.beta1, "Momentum / Adam first-moment decay")->capture_default_str();
  ft->add_option("--beta2", t.beta2, "Adam second-moment decay")->capture_default_str();
  ft->add_option("--adam-eps", t.adam_eps, "Adam's denominator epsilon")->capture_default_str();
  ft->add_option("--warmup", t.warmup, "Linear warm-up steps")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  ft->add_option("--eval-every", t.eval_every, "Evaluate every N steps (0: before and after only)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  ft->add_option("--save-every", t.save_every, "Checkpoint every N steps (0: at the end only)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  ft->add_option("--train-examples", t.train_examples, "Training examples sampled (MeZO: 1000)")
      ->capture_default_str()->check(CLI::PositiveNumber);
  ft->add_option("--eval-examples", t.eval_examples, "Evaluation examples sampled")
      ->capture_default_str()->check(CLI::PositiveNumber);
  ft->add_option("--seq-len", t.seq_len, "Text window length; longest task sequence")
      ->capture_default_str()->check(CLI::Range(int64_t(2), int64_t(1) << 20));
  ft->add_option("--max-bad-steps", t.max_bad_steps, "Stop after this many non-finite steps in a row")
      ->capture_default_str()->check(CLI::PositiveNumber);
  return ft;
}

// Where and how a run runs (threads, ranks, device): not saved, they may change on --resume.
void add_finetune_layout(CLI::App* ft, zof::TrainOptions& t) {
  ft->add_option("--threads", t.threads, "CPU threads (0: all cores)")->capture_default_str()
      ->check(CLI::Range(0, 4096));
  ft->add_flag("--json", t.json, "Print one JSON object as the last line");
  ft->add_flag("--no-report", t.no_report, "Do not write report.html (zof report) into the run "
               "directory at the end");
  ft->add_option("--pipeline-stages", t.pipeline_stages, "Under mpirun: split the blocks into this many "
                 "pipeline stages on consecutive ranks (ranks = stages x data-parallel replicas)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  ft->add_option("--dist-timeout", t.dist_timeout, "Under mpirun: seconds a rank may wait on the others "
                 "before the whole job stops with an error (0: wait for ever)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  // Checked by finetune() (a zof::Error naming the flag), not by CLI11.
  ft->add_option("--gpu-mem", t.gpu_mem, "Device memory budget for parameter streaming, e.g. 16GiB, "
                 "512MiB or bytes (default: what the device has free): blocks that fit stay on the "
                 "device, the rest stream through it each step (with their momentum/Adam state)");
  ft->add_option("--device", t.device, "cpu, or cuda: the steps on the GPU, the weights streamed "
                 "from host memory within --gpu-mem (all resident if they fit)")
      ->capture_default_str();
  ft->add_flag("--sim-device", t.sim_device, "Run on the simulated device (host memory with the "
               "--gpu-mem budget, threads as copy streams): the streaming schedule without a GPU");
}

CLI::App* add_replay(CLI::App& app, ReplayArgs& r) {
  auto* rp = app.add_subcommand("replay", "Rebuild fine-tuned weights from a base model and a run's step log");
  rp->add_option("--model", r.model, "The base model the run started from")->required();
  rp->add_option("--log", r.log, "The run directory (its zo_log.jsonl)")->required();
  rp->add_option("--out", r.out, "Directory for the rebuilt model")->required();
  rp->add_option("--threads", r.threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 4096));
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
  zof::write_report(r.runs, out);
  std::fprintf(stderr, "zof: wrote %s\n", out.c_str());
  return 0;
}

int run_finetune(const zof::TrainOptions& t) {
  if (t.resume.empty()) {
    ZOF_CHECK(!t.model.empty(), "finetune needs --model DIR (or --resume RUN_DIR)");
    ZOF_CHECK(!t.out.empty(), "finetune needs --out DIR, the run directory to write");
    ZOF_CHECK(!t.data.empty(), "finetune needs --data PATH, the task's data file or directory");
  }
  auto summary = zof::finetune(t);
  // The run's result: always one JSON line, from rank 0 alone under mpirun.
  if (!summary.contains("rank")) std::cout << summary.dump() << "\n";
  return summary.value("interrupted", false) ? 130 : 0;
}

int run_replay(const ReplayArgs& r) {
  auto summary = zof::replay(r.model, r.log, r.out, r.threads);
  std::cout << (r.json ? summary.dump() : summary.dump(1)) << "\n";
  return 0;
}

// Every user-caused problem ends here: one line on stderr and exit status 1.
int error_exit(const char* what) {
  std::fprintf(stderr, "zof: error: %s\n", what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zof: fine-tune Hugging Face causal LMs with forward passes only"};
  app.set_version_flag("--version", std::string("zof ") + zof::version());
  app.require_subcommand(1);
  GenerateArgs g;
  EvalArgs e;
  FinetuneArgs f;
  ReplayArgs r;
  ReportArgs rep;
  CLI::App* gen = add_generate(app, g);
  CLI::App* ev = add_eval(app, e);
  CLI::App* ft = add_finetune(app, f);
  add_finetune_layout(ft, f.t);
  CLI::App* rp = add_replay(app, r);
  CLI::App* rpt = add_report(app, rep);

  std::vector<std::string> args;
  try {
    args = expand_config(argc, argv);
  } catch (const zof::Error& err) {
    return error_exit(err.what());
  }
  try {
    std::vector<std::string> rev(args.rbegin(), args.rend() - 1);  // CLI11 wants them reversed
    app.parse(rev);
  } catch (const CLI::ParseError& err) {
    return app.exit(err);
  }
  try {
    if (gen->parsed()) return run_generate(g);
    if (ev->parsed()) return run_eval(e);
    if (ft->parsed()) return run_finetune(f.t);
    if (rp->parsed()) return run_replay(r);
    if (rpt->parsed()) return run_report(rep);
  } catch (const zof::Error& err) {
    return error_exit(err.what());
  } catch (const std::bad_alloc&) {
    return error_exit("out of memory (try a smaller --batch or --seq-len)");
  } catch (const std::exception& err) {
    return error_exit(err.what());
  }
  return 0;
}
