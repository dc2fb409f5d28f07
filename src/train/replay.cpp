// `zof replay`: rebuilds a run's fine-tuned weights from its base model and its step log
// (zo_log.jsonl): every update is (seed, step, lr, g), so the weights are regenerated, not stored.
#include <fstream>

#include "train/run_dir.h"
#include "zof/error.h"
#include "zof/model.h"
#include "zof/runtime.h"
#include "zof/trainer.h"
#include "zof/zo.h"

using json = nlohmann::json;

namespace zof {
namespace {

using train::fs::path;

// Applies every logged update to the engine's model in order; returns (steps, updates).
std::pair<int64_t, int64_t> apply_log(const path& log, ZOEngine& engine, ZOStepOptions zo) {
  std::ifstream f(log);
  std::string line;
  int64_t n = 0, lineno = 0, expect_step = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      throw Error(log.string() + " line " + std::to_string(lineno) +
                  " is not valid JSON; the log is damaged");
    }
    const int64_t step = j.at("step");
    ZOF_CHECK(step == expect_step, log.string() + " line " + std::to_string(lineno) +
                                       ": expected step " + std::to_string(expect_step) +
                                       ", found " + std::to_string(step));
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
  return {expect_step, n};
}

}  // namespace

json replay(const std::string& base_model, const std::string& run_dir, const std::string& out_dir,
            int threads) {
  const path run = run_dir;
  ZOF_CHECK(train::fs::exists(run / "run.json") && train::fs::exists(run / "zo_log.jsonl"),
            "--log " + run_dir + ": not a zof run directory (needs run.json and zo_log.jsonl)");
  const json saved = train::read_json(run / "run.json");
  setup_host_threads(threads, 1);
  BackendOptions b;
  b.threads = threads;
  auto backend = make_backend(b);
  Model model = Model::load(base_model);
  const json model_id{{"config", model.config().raw}, {"num_params", model.num_params()}};
  ZOF_CHECK(saved.at("model_id") == model_id,
            "--model " + base_model + " is not the base model of the run in " + run_dir);
  const TrainOptions o = TrainOptions::from_json(saved.at("options"));
  validate_options(o);
  const ZOStepOptions zo = zo_step_options(o);
  // The engine holds what an update needs besides (step, g): Sparse MeZO's thresholds (from the
  // base weights, as in the run) and momentum/Adam state (rebuilt from zero, as in the run).
  ZOEngine engine(model, *backend, 1, zo);
  const auto [steps, updates] = apply_log(run / "zo_log.jsonl", engine, zo);
  std::error_code ec;
  train::fs::create_directories(out_dir, ec);
  ZOF_CHECK(!ec, "--out " + out_dir + ": cannot create the directory (" + ec.message() + ")");
  model.save(out_dir, model.stored_dtype());
  train::copy_tokenizer_files(base_model, out_dir);
  return json{{"steps", steps}, {"updates", updates}, {"out", out_dir}};
}

}  // namespace zof
