// `zof replay`: rebuilds a run's fine-tuned weights from its base model and its step log
// (zo_log.jsonl): every update is (seed, step, lr, g), so the weights are regenerated, not stored.
#include <cstdio>
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
    int64_t step = 0;
    bool skipped = false;
    float lr = 0;
    std::vector<double> g;
    try {
      step = j.at("step");
      skipped = j.at("skipped").get<bool>();
      if (!skipped) {
        zo.seed = j.at("seed");
        zo.weight_decay = j.at("wd");
        lr = j.at("lr");
        g = j.at("g").get<std::vector<double>>();
      }
    } catch (const json::exception& e) {
      throw Error(log.string() + " line " + std::to_string(lineno) +
                  " is not a step record (" + e.what() + "); the log is damaged");
    }
    ZOF_CHECK(step == expect_step, log.string() + " line " + std::to_string(lineno) +
                                       ": expected step " + std::to_string(expect_step) +
                                       ", found " + std::to_string(step));
    ++expect_step;
    if (skipped) continue;
    ZOF_CHECK((int64_t)g.size() == zo.queries,
              log.string() + " line " + std::to_string(lineno) + ": " +
                  std::to_string(g.size()) + " projected gradients where the run takes " +
                  std::to_string(zo.queries) + " (--queries); the log is damaged");
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
  std::error_code ec;
  ZOF_CHECK(train::fs::is_directory(run, ec),
            "--log " + run_dir + ": no such run directory; give the --out of a zof finetune run");
  ZOF_CHECK(train::fs::is_regular_file(run / "run.json", ec) &&
                train::fs::is_regular_file(run / "zo_log.jsonl", ec),
            "--log " + run_dir + ": not a zof run directory (needs run.json and zo_log.jsonl)");
  // The rebuilt model goes apart from everything it is built from.
  train::check_apart(out_dir, "--out", base_model, "--model");
  train::check_apart(out_dir, "--out", run_dir, "--log");
  const json saved = train::read_json(run / "run.json");
  const std::string run_json = (run / "run.json").string();
  const TrainOptions o = train::parse_run_options(saved, run_json);
  ZOF_CHECK(saved.contains("model_id") && saved["model_id"].is_object(),
            run_json + ": \"model_id\" is missing or not an object; the run directory is damaged");
  ZOF_CHECK(!saved.contains("base_fingerprint") || saved["base_fingerprint"].is_string(),
            run_json + ": \"base_fingerprint\" is not a string; the run directory is damaged");
  validate_options(o);
  setup_host_threads(threads, 1);
  BackendOptions b;
  b.threads = threads;
  auto backend = make_backend(b);
  Model model = Model::load(base_model);
  const json model_id{{"config", model.config().raw}, {"num_params", model.num_params()}};
  ZOF_CHECK(saved.at("model_id") == model_id,
            "--model " + base_model + " is not the base model of the run in " + run_dir +
                " (config or size differ)");
  const std::string fingerprint = model.fingerprint();
  if (!saved.contains("base_fingerprint")) {
    std::fprintf(stderr, "zof: warning: %s records no fingerprint of the base model's weights "
                         "(a run from an older zof); replaying without checking them\n",
                 run_json.c_str());
  } else {
    const std::string want = saved["base_fingerprint"];
    ZOF_CHECK(want == fingerprint,
              "--model " + base_model + " is not the base model of the run in " + run_dir +
                  ": its weights' fingerprint is " + fingerprint + ", the run recorded " + want +
                  " (run.json base_fingerprint); give the model the run started from (" +
                  o.model + ")");
  }
  const ZOStepOptions zo = zo_step_options(o);
  // The engine holds what an update needs besides (step, g): Sparse MeZO's thresholds (from the
  // base weights, as in the run) and momentum/Adam state (rebuilt from zero, as in the run).
  ZOEngine engine(model, *backend, 1, zo);
  const auto [steps, updates] = apply_log(run / "zo_log.jsonl", engine, zo);
  // A log whose updates drove the weights non-finite rebuilds no model.
  if (const Model::NonFinite bad = model.find_non_finite(); bad.param >= 0)
    throw Error("--log " + run_dir + ": the replayed weights are not finite (" +
                model.params()[bad.param].name + " element " + std::to_string(bad.index) +
                "); the run diverged, so there is no model to rebuild: rerun it with a lower --lr");
  // The run's saved dtype: rounded here as save() would, so that a weight beyond f16's range
  // is refused (the run refused to write it too) rather than written as inf.
  const DType out_t = save_dtype(o, model);
  model.round_to(out_t);
  if (const Model::NonFinite bad = model.find_non_finite(); bad.param >= 0)
    throw Error("--log " + run_dir + ": replayed weight " + std::to_string(bad.index) + " of " +
                model.params()[bad.param].name + " is beyond " + dtype_torch_name(out_t) +
                "'s range (the run's --save-dtype " + o.save_dtype + "), so the run wrote no "
                "model and neither does its replay");
  const bool existed = train::fs::exists(out_dir, ec);
  train::fs::create_directories(out_dir, ec);
  ZOF_CHECK(!ec, "--out " + out_dir + ": cannot create the directory (" + ec.message() + ")");
  try {
    model.save(out_dir, out_t);  // as the run saved it
    train::copy_tokenizer_files(base_model, out_dir);
  } catch (...) {
    if (!existed) train::fs::remove_all(out_dir, ec);
    throw;
  }
  return json{{"steps", steps}, {"updates", updates}, {"out", out_dir}};
}

}  // namespace zof
