// The commands of zof: generate, eval, finetune, replay, report, each with its arguments, one
// function declaring its flags (add_*) and one running it (run_*). tools/zof.cpp wires them.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "flags.h"
#include "zof/trainer.h"

namespace zof::cli {

// Where generate and eval run: --device cpu (the model's storage), or a device (--device cuda,
// --sim-device) that the weights stream through within --gpu-mem.
struct DeviceArgs {
  std::string device = "cpu", gpu_mem, host_mem, offload_dir;
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

struct EvalArgs {
  DeviceArgs where;
  std::string model, text;
  int64_t seq_len = 0, batch = 8, max_windows = 0;  // seq_len 0: the model's context, at most 512
  bool seq_len_given = false, batch_given = false;
  int64_t tensor_parallel = 1;  // > 1: under mpirun, the model split over that many ranks
  int threads = 0;
  bool json = false;
  // --task instead of --text: the task's held-out metric, read as finetune reads it.
  std::optional<zof::Task> task;
  std::string data;
  int64_t eval_examples = zof::TrainOptions{}.eval_examples;
  uint64_t seed = 0;
};

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

CLI::App* add_generate(CLI::App& app, GenerateArgs& g, NumberFlags& n);
CLI::App* add_eval(CLI::App& app, EvalArgs& e, NumberFlags& n);
// Every flag of `zof finetune` from the library's table of options (zof/options.h), in its
// order, with its help: numbers as text read by NumberFlags, then checked by validate_options
// (a zof::Error naming the flag), none by CLI11.
CLI::App* add_finetune(CLI::App& app, FinetuneArgs& f, NumberFlags& n);
CLI::App* add_replay(CLI::App& app, ReplayArgs& r, NumberFlags& n);
CLI::App* add_report(CLI::App& app, ReportArgs& r);

int run_generate(const GenerateArgs& a);
int run_eval(const EvalArgs& a);
// from_config: the flags the --config file set (ExpandedArgs::from_config), for the messages.
int run_finetune(const CLI::App* ft, const FinetuneArgs& f,
                 const std::map<std::string, std::string>& from_config);
int run_replay(const ReplayArgs& r);
int run_report(const ReportArgs& r);

}  // namespace zof::cli
