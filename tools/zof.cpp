// zof command line: generate, eval, finetune, replay, report, each with one function declaring
// its flags and one running it. Every user-caused problem, from a mistyped flag to a bad file,
// ends as one line "zof: error: ..." and exit status 1; with --json (finetune: always) the last
// line of stdout is {"error": "..."}. --help and --version print to stdout and exit 0.
// This file: the subcommands wired (commands.h), the command line parsed (flags.h: numbers and
// --config) and dispatched, and every failure reported (cli_errors.h).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <new>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli_errors.h"
#include "commands.h"
#include "flags.h"
#include "zof/error.h"
#include "zof/version.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace zof::cli;

namespace {

// libgomp's waiting threads spin (OMP_WAIT_POLICY unset: ~300000 spins before they sleep), which
// on a machine whose cores other work shares makes every fork and join wait for a preempted
// spinner: measured on 2 cores with two other busy processes, a SmolLM2 bf16 step took 8.3 s
// spinning and 3.9-4.3 s passive; alone it costs 2-3% (1.74 against 1.69 s; bench/RESULTS.md).
// libgomp reads the policy once, as it loads, so the CLI sets it and runs itself again, unless
// the user set OMP_WAIT_POLICY or GOMP_SPINCOUNT (theirs wins). Where exec fails, it runs on.
void passive_openmp(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  if (::setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  ::unsetenv("OMP_WAIT_POLICY");  // exec refused: this process's libgomp spins, say it so
}

}  // namespace

int main(int argc, char** argv) {
  passive_openmp(argv);
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
    e.batch_given = ev->count("--batch") > 0;
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
