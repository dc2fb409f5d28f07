// `zof replay`: rebuilds a run's fine-tuned weights from its base model and its step log
// (zo_log.jsonl): every update is (seed, step, lr, g), so the weights are regenerated, not stored.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

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

// What the run directory records of its step log: from the latest checkpoint (state.json), else
// summary.json (a run whose checkpoints were removed), else run.json's --steps alone.
struct Recorded {
  int64_t steps = 0;   // the step records the log holds
  int64_t bytes = -1;  // its size then (-1: not recorded)
  std::string hash;    // ByteHash of those bytes ("": not recorded, an older zof)
  std::string where;   // the file that records them, and the field
  bool ended = true;   // the run ended there: no record may follow
};

Recorded recorded_log(const path& run, const TrainOptions& o) {
  Recorded r;
  const path ckpt = train::latest_checkpoint(run);
  if (!ckpt.empty()) {
    const path sf = ckpt / "state.json";
    const train::RunCounters c = train::parse_state(train::read_json(sf), sf.string(), o.steps);
    ZOF_CHECK(c.step == train::checkpoint_step(ckpt.filename().string()),
              sf.string() + ": \"step\" is " + std::to_string(c.step) + " but the checkpoint is " +
                  ckpt.filename().string() + "; " + train::kDamaged);
    r.steps = c.step;
    r.bytes = c.log_bytes;
    r.hash = c.log_hash;
    r.where = sf.string();
    r.ended = c.step == o.steps;
    return r;
  }
  std::error_code ec;
  const path sj = run / "summary.json";
  if (train::fs::is_regular_file(sj, ec)) {
    const json s = train::read_json(sj);
    if (s.is_object() && s.contains("log_bytes")) {  // absent from an older zof's summary
      auto whole = [&](const char* key, int64_t hi) {
        const json& v = s.contains(key) ? s[key] : json();
        ZOF_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= hi,
                  sj.string() + ": \"" + key + "\" is " + v.dump() + "; it must be an integer "
                  "from 0 to " + std::to_string(hi) + "; " + train::kDamaged);
        return v.get<int64_t>();
      };
      r.steps = whole("steps", o.steps);
      r.bytes = whole("log_bytes", std::numeric_limits<int64_t>::max());
      // A hash of another form is checked as parse_state checks a checkpoint's.
      json as_state{{"step", 0}, {"metrics_bytes", 0}, {"log_bytes", 0}};
      if (s.contains("log_hash")) as_state["log_hash"] = s["log_hash"];
      r.hash = train::parse_state(as_state, sj.string(), 0).log_hash;
      r.where = sj.string();
      r.ended = !s.value("interrupted", false);
      return r;
    }
  }
  r.steps = o.steps;
  r.where = (run / "run.json").string();
  return r;
}

// The step log against what the run recorded of it (recorded_log); prefix > 0: only its first
// `prefix` steps are rebuilt (replay --steps). zof::Error naming zo_log.jsonl, what differs and
// the fix. Returns a warning to print once the replay is known to succeed ("": none).
std::string check_log(const path& log, const Recorded& r, int64_t prefix,
                      const std::string& run_dir) {
  std::ifstream f(log, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const int64_t size = (int64_t)text.size();
  const int64_t lines = (int64_t)std::count(text.begin(), text.end(), '\n');
  const std::string name = "--log " + run_dir + ": zo_log.jsonl";
  const std::string restore = "the log was changed: restore zo_log.jsonl from a copy";
  ZOF_CHECK(prefix <= lines, "--steps " + std::to_string(prefix) + ": " + name + " holds only " +
                                 std::to_string(lines) + " step records; give --steps " +
                                 std::to_string(lines) + " or less");
  if (r.bytes < 0) {  // the run's --steps alone
    const int64_t fit = std::min(lines, r.steps);
    ZOF_CHECK(prefix > 0 || lines == r.steps,
              name + " holds " + std::to_string(lines) + " step records, but the run took " +
                  std::to_string(r.steps) + " steps (--steps in " + r.where + ", and no "
                  "checkpoint or summary.json records its log); restore the whole log, or "
                  "rebuild only its first steps with --steps " + std::to_string(fit));
    return "";
  }
  if (size < r.bytes) {
    ZOF_CHECK(prefix > 0,
              name + " holds " + std::to_string(size) + " bytes (" + std::to_string(lines) +
                  " step records), fewer than the " + std::to_string(r.bytes) + " bytes of " +
                  std::to_string(r.steps) + " steps that " + r.where + " records (log_bytes): "
                  "the log was cut; restore it from a copy, or rebuild only its first steps "
                  "with --steps " + std::to_string(lines));
    return name + " is shorter than " + r.where + " records, so its first " +
           std::to_string(prefix) + " steps are rebuilt unchecked against log_hash";
  }
  const std::string head = text.substr(0, (size_t)r.bytes);
  const int64_t n = (int64_t)std::count(head.begin(), head.end(), '\n');
  ZOF_CHECK(head.empty() || head.back() == '\n',
            name + ": the " + std::to_string(r.bytes) + " bytes that " + r.where +
                " records (log_bytes) do not end at a line boundary; " + restore);
  ZOF_CHECK(n == r.steps, name + " holds " + std::to_string(n) + " step records in the " +
                              std::to_string(r.bytes) + " bytes that " + r.where + " records "
                              "(log_bytes), not " + std::to_string(r.steps) + "; " + restore);
  train::ByteHash h;
  h.add(head);
  ZOF_CHECK(r.hash.empty() || h.text() == r.hash,
            name + ": its first " + std::to_string(n) + " records (steps 0 to " +
                std::to_string(n - 1) + ") hash to " + h.text() + ", not the " + r.hash +
                " that " + r.where + " records (log_hash): a record was changed; restore "
                "zo_log.jsonl from a copy");
  std::string warning;
  if (size > r.bytes && !r.ended && (prefix <= 0 || prefix > r.steps))
    warning = name + " holds " + std::to_string(lines - r.steps) + " step records after step " +
              std::to_string(r.steps) + ", the last that " + r.where +
              " records: they are rebuilt unchecked against log_hash";
  ZOF_CHECK(size == r.bytes || !r.ended || (prefix > 0 && prefix <= r.steps),
            name + " holds " + std::to_string(size) + " bytes, more than the " +
                std::to_string(r.bytes) + " of the run's " + std::to_string(r.steps) +
                " steps that " + r.where + " records (log_bytes): records were added after "
                "the run ended; restore zo_log.jsonl from a copy, or rebuild the run's steps "
                "with --steps " + std::to_string(r.steps));
  return warning;
}

// Applies the logged updates (the first `limit` steps; limit <= 0: all) to the engine's model in
// order; returns (steps, updates). engine null: only reads them (each record checked). from > 0:
// the records before step `from` are read and checked but not applied; reopen: the updates are
// only added to the engine's pending window, never flushed (a checkpoint's open window).
std::pair<int64_t, int64_t> apply_log(const path& log, ZOEngine* engine, const TrainOptions& o,
                                      int64_t limit, int64_t from = 0, bool reopen = false) {
  ZOStepOptions zo = zo_step_options(o);
  std::ifstream f(log);
  std::string line;
  int64_t n = 0, lineno = 0, expect_step = 0;
  while ((limit <= 0 || expect_step < limit) && std::getline(f, line)) {
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
    // A bf16 master's rounding window closes where the run's did (its walk of the next step,
    // or its flush, rounded it): skipped or not.
    const bool closes = !reopen && window_closes_after(o, step);
    if (skipped || step < from) {
      if (engine && closes && step >= from) engine->flush();
      continue;
    }
    ZOF_CHECK((int64_t)g.size() == zo.queries,
              log.string() + " line " + std::to_string(lineno) + ": " +
                  std::to_string(g.size()) + " projected gradients where the run takes " +
                  std::to_string(zo.queries) + " (--queries); the log is damaged");
    if (engine) {
      engine->add_update(ZOEngine::make_update(zo, (uint32_t)step, lr, g));
      if (closes) engine->flush();
    }
    ++n;
  }
  if (engine && !reopen) engine->flush();  // the run's end closes a window part way
  return {expect_step, n};
}

}  // namespace

namespace train {

void reopen_window(const std::string& log, ZOEngine& engine, const TrainOptions& o,
                   int64_t from, int64_t to) {
  const auto [steps, updates] = apply_log(log, &engine, o, to, from, /*reopen=*/true);
  ZOF_CHECK(steps == to, log + " holds " + std::to_string(steps) + " step records, not the " +
                             std::to_string(to) + " of the checkpoint it resumes from; " +
                             kDamaged);
  (void)updates;
}

}  // namespace train

json replay(const std::string& base_model, const std::string& run_dir, const std::string& out_dir,
            int threads, int64_t steps_wanted) {
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
  // --out is a new or empty directory, locked while it is written (as a run's): a live run
  // there is refused naming its pid, anything else there (a model, a run) is never overwritten.
  const char* const kNewDir = "replay writes the rebuilt model into a new or empty directory";
  train::RunLock lock;
  if (train::fs::exists(path(out_dir) / ".lock", ec)) lock.acquire(out_dir, "--out");
  train::check_empty_out(out_dir, "--out", kNewDir);
  const json saved = train::read_json(run / "run.json");
  const std::string run_json = (run / "run.json").string();
  const TrainOptions o = train::parse_run_options(saved, run_json);
  ZOF_CHECK(saved.contains("model_id") && saved["model_id"].is_object(),
            run_json + ": \"model_id\" is missing or not an object; the run directory is damaged");
  ZOF_CHECK(!saved.contains("base_fingerprint") || saved["base_fingerprint"].is_string(),
            run_json + ": \"base_fingerprint\" is not a string; the run directory is damaged");
  validate_options(o, /*new_run=*/false);
  // The log is the run's, whole (or the prefix asked for), before anything is built from it:
  // each record read, then the log against what the run recorded of it.
  // Warnings wait until the replay is known to succeed: a refused one prints its error alone.
  std::vector<std::string> warnings;
  const int64_t read_steps =
      apply_log(run / "zo_log.jsonl", nullptr, o, steps_wanted).first;
  if (std::string w = check_log(run / "zo_log.jsonl", recorded_log(run, o), steps_wanted, run_dir);
      !w.empty())
    warnings.push_back(std::move(w));
  setup_host_threads(threads, 1);
  BackendOptions b;
  b.threads = threads;
  auto backend = make_backend(b);
  // Loaded as the run's fingerprint was taken; a bf16 master is then held in 2 bytes (replay
  // applies the updates on the host, unstreamed).
  const DType storage = o.master == "bf16" ? DType::BF16 : DType::F32;
  Model model = Model::load(
      base_model, fingerprint_storage(saved.contains("base_fingerprint")
                                          ? saved["base_fingerprint"].get<std::string>()
                                          : std::string(),
                                      storage));
  const json model_id{{"config", model.config().raw}, {"num_params", model.num_params()}};
  ZOF_CHECK(saved.at("model_id") == model_id,
            "--model " + base_model + " is not the base model of the run in " + run_dir +
                " (config or size differ)");
  const std::string fingerprint = model.fingerprint();
  if (!saved.contains("base_fingerprint")) {
    warnings.push_back(run_json + " records no fingerprint of the base model's weights (a run "
                       "from an older zof); replaying without checking them");
  } else {
    const std::string want = saved["base_fingerprint"];
    ZOF_CHECK(want == fingerprint,
              "--model " + base_model + " is not the base model of the run in " + run_dir +
                  ": its weights' fingerprint is " + fingerprint + ", the run recorded " + want +
                  " (run.json base_fingerprint); give the model the run started from (" +
                  o.model + ")");
  }
  model.set_storage_dtype(storage);
  const ZOStepOptions zo = zo_step_options(o);
  // The engine holds what an update needs besides (step, g): Sparse MeZO's thresholds (from the
  // base weights, as in the run) and momentum/Adam state (rebuilt from zero, as in the run).
  ZOEngine engine(model, *backend, 1, zo);
  // The records read and checked above, no more (a live run may have added some since).
  const auto [steps, updates] =
      read_steps > 0 ? apply_log(run / "zo_log.jsonl", &engine, o, read_steps)
                     : std::pair<int64_t, int64_t>{0, 0};
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
  for (const std::string& w : warnings) std::fprintf(stderr, "zof: warning: %s\n", w.c_str());
  const bool existed = train::fs::exists(out_dir, ec);
  train::fs::create_directories(out_dir, ec);
  ZOF_CHECK(!ec, "--out " + out_dir + ": cannot create the directory (" + ec.message() + ")");
  const path lock_file = path(out_dir) / ".lock";
  bool ours = false;  // locked and still empty: what is in it from here on is this process's
  try {
    if (!lock.held()) lock.acquire(out_dir, "--out");
    lock.write_pid();
    train::check_empty_out(out_dir, "--out", kNewDir);  // again, now that it is locked
    ours = true;
    train::remove_stale_tmp(out_dir);
    model.save(out_dir, out_t);  // as the run saved it
    train::copy_tokenizer_files(base_model, out_dir);
  } catch (...) {
    if (ours && !existed) {
      train::fs::remove_all(out_dir, ec);
    } else if (ours) {  // an empty directory before: empty again
      for (const auto& e : train::fs::directory_iterator(out_dir, ec))
        train::fs::remove_all(e.path(), ec);
    } else if (lock.held()) {
      train::fs::remove(lock_file, ec);
      if (!existed) train::fs::remove(out_dir, ec);  // only if empty
    }
    throw;
  }
  train::fs::remove(lock_file, ec);  // the model directory keeps only the model's files
  return json{{"steps", steps}, {"updates", updates}, {"out", out_dir}};
}

}  // namespace zof
