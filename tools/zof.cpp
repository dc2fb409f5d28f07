// zof command line: generate, eval, finetune, replay, report, each with one function declaring
// its flags and one running it. Every user-caused problem, from a mistyped flag to a bad file,
// ends as one line "zof: error: ..." and exit status 1; with --json (finetune: always) the last
// line of stdout is {"error": "..."}. --help and --version print to stdout and exit 0.
#include <cerrno>
#include <cfloat>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <new>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "zof/backend.h"
#include "zof/error.h"
#include "zof/input_file.h"
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
using zof::NumberRule;

namespace {

const char* const kCommands = "generate, eval, finetune, replay, report";

// ---- numbers ----------------------------------------------------------------------------------
// Numeric flags are bound as text and read here once CLI11 has parsed: its own conversions and
// range checks answer in their words (exit 105, "Value 0 not in range 0.000000 to 1797...") and
// wrap a negative --seed round to 2^64 - 1. A text is read into the flag's type only if it fits;
// the ranges are then the validation's (validate_options, validate_generate, ...).

// The numeric flags of every command, as text until read().
class NumberFlags {
 public:
  // rule: what the value may be (for the message when its text is not one); null for --seed.
  template <class T>
  CLI::Option* add(CLI::App* app, const std::string& name, T& target, const std::string& help,
                   const NumberRule* rule, bool show_default = true) {
    Flag& f = flags_.emplace_back();
    f.app = app;
    f.name = name;
    const NumberRule r = rule ? *rule : NumberRule{};
    std::string def, type;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      std::ostringstream os;
      os << target;
      def = os.str();
      type = "FLOAT";
      f.read = [&target, name, r](const std::string& t) {
        if constexpr (std::is_same_v<T, float>)
          target = zof::read_float_text(name, t, r);
        else
          target = zof::read_real_text(name, t, r);
      };
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      def = std::to_string(target);
      type = "UINT";
      f.read = [&target, name](const std::string& t) { target = zof::read_seed_text(name, t); };
    } else if constexpr (std::is_same_v<T, int>) {
      def = std::to_string(target);
      type = "INT";
      f.read = [&target, name, r](const std::string& t) { target = zof::read_int_text(name, t, r); };
    } else {
      static_assert(std::is_same_v<T, int64_t>);
      def = std::to_string(target);
      type = "INT";
      f.read = [&target, name, r](const std::string& t) { target = zof::read_whole_text(name, t, r); };
    }
    f.opt = app->add_option(name, f.text, help)->type_name(type);
    if (show_default) f.opt->default_str(def);
    return f.opt;
  }
  // Reads the flags given to app, in the order they were declared.
  void read(const CLI::App* app) const {
    for (const Flag& f : flags_)
      if (f.app == app && f.opt->count() > 0) f.read(f.text);
  }
  // The text given for a flag (empty: not given).
  std::string text(const CLI::Option* opt) const {
    for (const Flag& f : flags_)
      if (f.opt == opt) return f.text;
    return "";
  }

 private:
  struct Flag {
    const CLI::App* app = nullptr;
    CLI::Option* opt = nullptr;
    std::string name, text;
    std::function<void(const std::string&)> read;
  };
  std::deque<Flag> flags_;  // stable addresses: CLI11 holds references to the texts
};

const NumberRule& train_rule(const char* flag) { return *zof::train_flag_rule(flag); }

// ---- generate, eval ---------------------------------------------------------------------------

const NumberRule& text_rule(const char* flag) { return *zof::text_flag_rule(flag); }
const NumberRule& kMaxNewTokens = text_rule("--max-new-tokens");
const NumberRule& kTemperature = text_rule("--temperature");
const NumberRule& kTopP = text_rule("--top-p");
const NumberRule& kEvalSeqLen = text_rule("--seq-len");
const NumberRule& kEvalBatch = text_rule("--batch");
const NumberRule& kMaxWindows = text_rule("--max-windows");

const char* const kDtypeHelp =
    "Matrix products in bf16 (weights rounded to bf16, fp32 accumulation) or fp32; auto: bf16 "
    "where it is faster (AMX CPUs, GPU tensor cores), else fp32";

// Where generate and eval run: --device cpu (the model's storage), or a device (--device cuda,
// --sim-device) that the weights stream through within --gpu-mem.
struct DeviceArgs {
  std::string device = "cpu", gpu_mem;
  bool sim_device = false, tf32 = false;
  std::string dtype = "auto";
};

struct GenerateArgs {
  DeviceArgs where;
  std::string model, prompt;
  int64_t max_new_tokens = 128;
  bool max_new_given = false;
  float temperature = 0.f, top_p = 1.f;
  uint64_t seed = 0;
  int threads = 0;
  bool json = false;
};

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
  b.tf32 = d.tf32;
  ZOF_CHECK(d.dtype == "auto" || d.dtype == "bf16" || d.dtype == "fp32",
            "--dtype must be auto, bf16 or fp32, not '" + d.dtype + "'");
  auto be = zof::make_backend(b);
  place.compute = zof::resolve_compute_dtype(d.dtype, *be);
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
}

int run_generate(const GenerateArgs& a) {
  validate_generate(a);
  zof::WeightPlacement place;
  zof::check_model_dir("--model", a.model);
  auto backend = text_backend(a.where, a.threads, place);
  zof::Model model = zof::Model::load(a.model);
  zof::Tokenizer tok = zof::Tokenizer::load(a.model);
  tok.check_ids_below(model.config().vocab_size);
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

struct EvalArgs {
  DeviceArgs where;
  std::string model, text;
  int64_t seq_len = 0, batch = 8, max_windows = 0;  // seq_len 0: the model's context, at most 512
  bool seq_len_given = false;
  int threads = 0;
  bool json = false;
};

void validate_eval(const EvalArgs& a) {
  if (a.seq_len_given) zof::check_whole("--seq-len", a.seq_len, kEvalSeqLen);
  zof::check_whole("--batch", a.batch, kEvalBatch);
  zof::check_whole("--max-windows", a.max_windows, kMaxWindows);
  zof::check_whole("--threads", a.threads, train_rule("--threads"));
}

int run_eval(const EvalArgs& a) {
  validate_eval(a);
  zof::check_input_file("--text", a.text, "--text takes one plain-text file");  // before loading
  zof::WeightPlacement place;
  zof::check_model_dir("--model", a.model);
  auto backend = text_backend(a.where, a.threads, place);
  zof::Model model = zof::Model::load(a.model);
  zof::Tokenizer tok = zof::Tokenizer::load(a.model);
  tok.check_ids_below(model.config().vocab_size);
  const std::string text = zof::read_eval_text(a.text);
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

// ---- --config ---------------------------------------------------------------------------------

struct ExpandedArgs {
  std::vector<std::string> args;
  // Flags set by the --config file (and not again on the command line): "--config F line N".
  std::map<std::string, std::string> from_config;
};

// `zof finetune --config FILE ...`: the file's `key = value` lines become `--key=value` flags
// placed before the command line's, so that flags given on the command line win (options take
// the last value). Boolean flags take true or false (`one_sided = true`).
ExpandedArgs expand_config(int argc, char** argv) {
  ExpandedArgs x;
  std::vector<std::string> in(argv, argv + argc), &out = x.args;
  size_t sub = 1;
  while (sub < in.size() && !in[sub].empty() && in[sub][0] == '-') ++sub;
  if (sub == in.size() || in[sub] != "finetune") {
    out = in;
    return x;
  }
  std::string path;
  bool given = false;
  for (size_t i = sub + 1; i < in.size(); ++i) {
    if (in[i] == "--config" && i + 1 < in.size()) path = in[i + 1], given = true;
    if (in[i].rfind("--config=", 0) == 0) path = in[i].substr(9), given = true;
  }
  out.assign(in.begin(), in.begin() + sub + 1);
  if (given) {
    zof::check_input_file("--config", path, "--config takes a file of `key = value` lines");
    std::ifstream f(path);
    ZOF_CHECK(f.good(), "--config " + path + ": cannot read the file (check its permissions)");
    std::string line;
    int lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      const std::string at = "--config " + path + " line " + std::to_string(lineno);
      // A NUL would end the message (and the flag's value) where it stands.
      ZOF_CHECK(line.find('\0') == std::string::npos,
                at + ": the line holds a NUL byte; --config takes a text file of `key = value` "
                     "lines (is it a binary file?)");
      auto trim = [](std::string x) {
        const size_t a = x.find_first_not_of(" \t\r"), b = x.find_last_not_of(" \t\r");
        return a == std::string::npos ? std::string() : x.substr(a, b - a + 1);
      };
      // '#' starts a comment outside quotes only: `out = "runs/a#1"` keeps its '#'.
      if (const size_t hash = line.find('#'); hash != std::string::npos && hash < line.find('='))
        line = line.substr(0, hash);  // a comment before any '=' (npos: none at all)
      line = trim(line);
      if (line.empty() || line[0] == '[') continue;  // blank, comment, or a TOML section header
      const size_t eq = line.find('=');
      ZOF_CHECK(eq != std::string::npos, at + ": expected `key = value`, found `" + line + "`");
      std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
      for (auto& c : key) c = c == '_' ? '-' : c;
      if (!value.empty() && (value[0] == '"' || value[0] == '\'')) {
        // A quoted value runs to its closing quote; only a comment may follow it.
        const char q = value[0];
        const size_t close = value.find(q, 1);
        ZOF_CHECK(close != std::string::npos,
                  at + ": the value of `" + key + "` opens a quote (" + q + ") that the line "
                  "never closes; close it, or drop the quote");
        const std::string rest = trim(value.substr(close + 1));
        ZOF_CHECK(rest.empty() || rest[0] == '#',
                  at + ": `" + key + "` has text after its closing quote (`" + rest + "`); "
                  "put the whole value inside the quotes");
        value = value.substr(1, close - 1);
      } else if (const size_t c = value.find('#'); c != std::string::npos) {
        value = trim(value.substr(0, c));  // an unquoted value ends at a comment
      }
      ZOF_CHECK(!key.empty() && key != "config" && key[0] != '-',
                at + ": bad key `" + key + "` (keys are flag names without dashes)");
      ZOF_CHECK(!value.empty(), at + ": `" + key + "` has no value (write `" + key +
                                    " = VALUE`, or drop the line for the default)");
      out.push_back("--" + key + "=" + value);
      x.from_config["--" + key] = at;
    }
  }
  for (size_t i = sub + 1; i < in.size(); ++i) {
    out.push_back(in[i]);
    x.from_config.erase(in[i].substr(0, in[i].find('=')));
  }
  return x;
}

// ---- finetune, replay, report -----------------------------------------------------------------

struct FinetuneArgs {
  zof::TrainOptions t;
  std::string config_file;  // applied by expand_config() before parsing
};

struct ReplayArgs {
  std::string model, log, out;
  int64_t steps = 0;  // not given: the whole run
  bool steps_given = false;
  int threads = 0;
  bool json = false;
};

struct ReportArgs {
  std::vector<std::string> runs;
  std::string out;
};

CLI::App* add_generate(CLI::App& app, GenerateArgs& g, NumberFlags& n) {
  auto* gen = app.add_subcommand("generate", "Generate text from a prompt");
  gen->add_option("--model", g.model, "Hugging Face model directory")->required();
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
      "each from BOS; '<|endoftext|>' separates documents, and windows never cross one");
  ev->add_option("--model", e.model, "Hugging Face model directory")->required();
  ev->add_option("--text", e.text, "Plain-text file")->required();
  n.add(ev, "--seq-len", e.seq_len, "Window length in tokens (default: context, at most 512)",
        &kEvalSeqLen, false);
  n.add(ev, "--batch", e.batch, "Windows per forward pass", &kEvalBatch);
  n.add(ev, "--max-windows", e.max_windows, "Evaluate at most this many windows (0: all)",
        &kMaxWindows);
  n.add(ev, "--threads", e.threads, "CPU threads (0: all cores)", &train_rule("--threads"));
  ev->add_flag("--json", e.json, "Print one JSON object as the last line");
  add_device_flags(ev, e.where);
  return ev;
}

// Every flag of `zof finetune` from the library's table of options (zof/options.h), in its
// order, with its help: numbers as text read by NumberFlags, then checked by validate_options
// (a zof::Error naming the flag), none by CLI11.
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

// ---- errors -----------------------------------------------------------------------------------

// The rank of this process under mpirun (0 alone): only rank 0 prints the JSON result.
int launched_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

// One line for a flag the parser refused, in zof's words: the flag, what is wrong, the fix.
std::string parse_error_message(const CLI::ParseError& e, const std::string& cmd,
                                const std::map<std::string, std::string>& from_config) {
  std::string what = e.what();
  for (auto& c : what) c = c == '\n' ? ' ' : c;
  const std::string help = cmd.empty() ? "zof --help" : "zof " + cmd + " --help";
  if (what == "A subcommand is required")
    return std::string("no command given; zof takes one of ") + kCommands + " (see zof --help)";
  const std::string required = " is required";
  if (what.size() > required.size() && what.compare(what.size() - required.size(),
                                                    required.size(), required) == 0) {
    const std::string flag = what.substr(0, what.size() - required.size());
    if (flag.rfind("--", 0) != 0)  // a positional: report's run directories
      return "zof " + cmd + " needs a run directory: zof report RUN_DIR [RUN_DIR ...]";
    return "zof " + cmd + " needs " + flag + " (see " + help + ")";
  }
  // "--model: 1 required TEXT missing": a flag at the end of the line without its value.
  const size_t colon = what.find(": ");
  if (colon != std::string::npos && what.rfind("--", 0) == 0 &&
      what.find("missing", colon) != std::string::npos)
    return what.substr(0, colon) + " needs a value (see " + help + ")";
  // "Could not convert: --one-sided = maybe": only the switches are typed (numbers are text).
  const std::string convert = "Could not convert: ";
  if (what.rfind(convert, 0) == 0 && what.find(" = ") != std::string::npos) {
    const size_t eq = what.find(" = ");
    const std::string flag = what.substr(convert.size(), eq - convert.size());
    std::string where;
    if (auto it = from_config.find(flag); it != from_config.end()) where = " (" + it->second + ")";
    return flag + where + " is a switch: give it alone (or =true, =false), not with '" +
           what.substr(eq + 3) + "'";
  }
  return what + " (see " + help + ")";
}

// Arguments no flag took: an unknown flag, or a word where none is expected.
std::string extras_message(const std::vector<std::string>& extras, const std::string& cmd,
                           const std::map<std::string, std::string>& from_config) {
  if (cmd.empty() && extras[0].rfind('-', 0) != 0)
    return "unknown command '" + extras[0] + "'; zof takes one of " + kCommands +
           " (see zof --help)";
  for (const auto& x : extras) {
    if (x.size() < 2 || x[0] != '-') continue;
    const std::string flag = x.substr(0, x.find('='));
    std::string where;
    if (auto it = from_config.find(flag); it != from_config.end()) where = " (" + it->second + ")";
    if (cmd.empty())
      return flag + where + " is not a flag of zof; flags follow the command (see zof --help)";
    return flag + where + " is not a flag of zof " + cmd + " (see zof " + cmd + " --help)";
  }
  return "unexpected argument '" + extras[0] + "': zof " + cmd +
         " takes flags only; a value with spaces needs quotes (see zof " + cmd + " --help)";
}

// The command (the first word that is not a flag), and whether a failure ends with a JSON line
// too: finetune always ends with one, generate, eval and replay with --json; under mpirun only
// rank 0 prints it.
bool json_error_line(int argc, char** argv, std::string& cmd) {
  bool json_flag = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (cmd.empty() && !a.empty() && a[0] != '-') cmd = a;
    if (a == "--json" || (a.rfind("--json=", 0) == 0 && a != "--json=false")) json_flag = true;
  }
  if (launched_rank() != 0) return false;
  if (cmd == "finetune") return true;
  return json_flag && (cmd == "generate" || cmd == "eval" || cmd == "replay");
}

// One line whatever a message quotes (a file's contents, a path, a config string): line breaks
// and other control characters are shown escaped.
std::string one_line(const std::string& raw) {
  std::string what;
  for (const char c : raw) {
    if (c == '\n') what += "\\n";
    else if (c == '\r') what += "\\r";
    else if (c == '\t') what += "\\t";
    else if ((unsigned char)c < 0x20 || c == 0x7f) what += '?';
    else what += c;
  }
  return what;
}

// A filesystem error that reached the CLI, in zof's words: the path with the flag that named it
// (when a flag's value is the path or a directory above it), the operation and the reason.
std::string filesystem_message(const fs::filesystem_error& e, const std::vector<std::string>& args) {
  const std::string path = e.path1().string();
  std::string op = e.what();  // "filesystem error: OP: REASON [PATH]"
  const std::string head = "filesystem error: ";
  if (op.rfind(head, 0) == 0) op = op.substr(head.size());
  if (const size_t at = op.find(": "); at != std::string::npos) op = op.substr(0, at);
  std::string named = path;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    const std::string value = eq != std::string::npos ? a.substr(eq + 1)
                              : i + 1 < args.size()   ? args[i + 1]
                                                      : "";
    if (value.empty() || path.empty()) continue;
    if (path == value) {
      named = flag + " " + path;
      break;
    }
    const std::string dir = value.back() == '/' ? value : value + "/";
    if (path.rfind(dir, 0) == 0) {
      named = path + " (in " + flag + " " + value + ")";
      break;
    }
  }
  if (named.empty()) named = "a path";
  // "status" and its kin look a path up: the path cannot be reached.
  const std::string did = op.find("status") != std::string::npos ? " cannot be reached"
                          : op.rfind("cannot ", 0) == 0           ? ": " + op
                                                                  : ": " + op + " failed";
  return named + did + " (" + e.code().message() + "); check the path and its permissions";
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
  NumberFlags numbers;
  CLI::App* gen = add_generate(app, g, numbers);
  CLI::App* ev = add_eval(app, e, numbers);
  CLI::App* ft = add_finetune(app, f, numbers);
  CLI::App* rp = add_replay(app, r, numbers);
  CLI::App* rpt = add_report(app, rep);
  // Unknown arguments are zof's to report (extras_message), before a missing --model.
  app.allow_extras();
  for (CLI::App* sub : {gen, ev, ft, rp, rpt}) sub->allow_extras();
  // A flag given twice takes its last value everywhere, as finetune's --config needs.
  for (CLI::App* sub : {gen, ev, rp})
    for (CLI::Option* o : sub->get_options()) o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  std::string cmd;
  const bool json_out = json_error_line(argc, argv, cmd);
  auto fail = [&](const std::string& raw) {
    const std::string what = one_line(raw);
    std::fprintf(stderr, "zof: error: %s\n", what.c_str());
    if (json_out) {
      std::cout << json{{"error", what}}.dump(-1, ' ', false, json::error_handler_t::replace)
                << std::endl;
    }
    return 1;
  };

  ExpandedArgs x;
  try {
    x = expand_config(argc, argv);
  } catch (const zof::Error& err) {
    return fail(err.what());
  }
  CLI::App* parsed = nullptr;
  auto extras = [&]() -> std::string {
    if (!app.remaining(false).empty()) return extras_message(app.remaining(false), "", {});
    for (CLI::App* sub : {gen, ev, ft, rp, rpt})
      if (!sub->remaining(false).empty())
        return extras_message(sub->remaining(false), sub->get_name(), x.from_config);
    return "";
  };
  try {
    std::vector<std::string> rev(x.args.rbegin(), x.args.rend() - 1);  // CLI11 wants them reversed
    app.parse(rev);
  } catch (const CLI::Success& ok) {
    return app.exit(ok);  // --help, --version: stdout, exit 0
  } catch (const CLI::ParseError& err) {
    const std::string unknown = extras();
    return fail(unknown.empty() ? parse_error_message(err, cmd, x.from_config) : unknown);
  }
  if (const std::string unknown = extras(); !unknown.empty()) return fail(unknown);
  try {
    for (CLI::App* sub : {gen, ev, ft, rp, rpt}) {
      if (!sub->parsed()) continue;
      parsed = sub;
      numbers.read(sub);
    }
    e.seq_len_given = ev->count("--seq-len") > 0;
    r.steps_given = rp->count("--steps") > 0;
    g.max_new_given = gen->count("--max-new-tokens") > 0;
    if (parsed == gen) return run_generate(g);
    if (parsed == ev) return run_eval(e);
    if (parsed == ft) return run_finetune(ft, f, x.from_config);
    if (parsed == rp) return run_replay(r);
    if (parsed == rpt) return run_report(rep);
  } catch (const zof::Error& err) {
    // A refused flag whose value came from the --config file: its line too.
    std::string what = err.what();
    if (what.rfind("--", 0) == 0) {
      const size_t end = what.find_first_of(" ,;:=");
      const auto it = x.from_config.find(what.substr(0, end));
      if (it != x.from_config.end() && end != std::string::npos)
        what = what.substr(0, end) + " (" + it->second + ")" + what.substr(end);
    }
    return fail(what);
  } catch (const fs::filesystem_error& err) {
    return fail(filesystem_message(err, x.args));
  } catch (const std::bad_alloc&) {
    return fail("out of memory (try a smaller --batch or --seq-len)");
  } catch (const std::exception& err) {
    return fail(err.what());
  }
  return 0;
}
