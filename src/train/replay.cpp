// `zof replay`: rebuilds a run's fine-tuned weights from its base model and its step log
// (zo_log.jsonl): every update is (seed, step, lr, g), so the weights are regenerated, not stored.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <set>
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

// saved: run.json (file), which the checkpoint's state.json may record the seal of.
Recorded recorded_log(const path& run, const TrainOptions& o, const json& saved,
                      const std::string& file) {
  Recorded r;
  const path ckpt = train::latest_checkpoint(run);
  if (!ckpt.empty()) {
    const path sf = ckpt / "state.json";
    const json state = train::read_json(sf);
    train::check_recorded_seal(state, sf.string(), saved, file);  // before --steps bounds it
    const train::RunCounters c = train::parse_state(state, sf.string(), o.steps);
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
    train::check_recorded_seal(s, sj.string(), saved, file);  // where summary.json records it
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
    // A log that still holds every step record the run recorded was not cut: a record was made
    // shorter, or (its records hashing as recorded) the recorded size was changed.
    if (r.steps > 0 && lines >= r.steps) {
      size_t end = 0;
      for (int64_t i = 0; i < r.steps; ++i) end = text.find('\n', end) + 1;
      const std::string fewer = name + " holds " + std::to_string(size) + " bytes, fewer than the " +
                                std::to_string(r.bytes) + " bytes of " + std::to_string(r.steps) +
                                " steps that " + r.where + " records (log_bytes)";
      train::ByteHash h;
      h.add(text.data(), end);
      ZOF_CHECK(r.hash.empty() || h.text() != r.hash,
                fewer + ", yet its first " + std::to_string(r.steps) + " records hash to the " +
                    r.hash + " that it records (log_hash): " + r.where + "'s log_bytes was "
                    "changed; " + train::kDamaged);
      throw Error(fewer + ", yet all " + std::to_string(r.steps) + " step records: a record was "
                  "changed; restore zo_log.jsonl from a copy");
    }
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

// ---- the output, built beside --out and renamed into place ------------------------------------

// `.NAME.zof-replay-PID`: where a replay into --out NAME builds the model, beside it (the same
// directory, so the same file system, for rename(2)).
const char* const kTmpTag = ".zof-replay-";

void fsync_fd_path(const path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Every file of dir, then dir itself, on disk: what the rename publishes is complete.
void fsync_tree(const path& dir) {
  std::error_code ec;
  for (const auto& e : train::fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) fsync_fd_path(e.path());
  fsync_fd_path(dir);
}

// The temporaries this process is writing (replays in threads: Python's zof.replay).
std::mutex g_live_mu;
std::set<path> g_live_tmp;

// tmp as this process's own for the life of the object: a second replay into the same --out in
// this process is refused, and a directory of that name is an earlier process's (its pid reused).
class LiveTmp {
 public:
  LiveTmp(const path& tmp, const std::string& out_dir) : tmp_(tmp) {
    std::lock_guard<std::mutex> g(g_live_mu);
    ZOF_CHECK(g_live_tmp.insert(tmp).second,
              "--out " + out_dir + " is being written by another replay in this process (into " +
                  tmp.string() + "); wait for it to return, or choose another --out");
  }
  ~LiveTmp() {
    std::lock_guard<std::mutex> g(g_live_mu);
    g_live_tmp.erase(tmp_);
  }
  LiveTmp(const LiveTmp&) = delete;
  LiveTmp& operator=(const LiveTmp&) = delete;

 private:
  path tmp_;
};

// The temporaries of replays into NAME (in dir) whose process is gone: a SIGKILL's leftovers.
// (This process's own name is LiveTmp's to judge.)
void remove_stale_replay_tmp(const path& dir, const std::string& name) {
  const std::string pre = "." + name + kTmpTag;
  std::error_code ec;
  std::vector<path> stale;
  for (const auto& e : train::fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() <= pre.size() || n.size() > pre.size() + 10 || n.compare(0, pre.size(), pre) != 0)
      continue;
    const std::string digits = n.substr(pre.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const long pid = std::atol(digits.c_str());
    if (pid <= 0 || !train::fs::is_directory(e.symlink_status(ec))) continue;
    if (pid != (long)::getpid() && ::kill((pid_t)pid, 0) != 0 && errno == ESRCH)
      stale.push_back(e.path());
  }
  for (const path& p : stale) train::fs::remove_all(p, ec);
}

// --out as the rename must name it: its real path (a symlink to an empty directory replaces
// that directory), without a trailing separator.
path real_out(const std::string& out_dir) {
  std::error_code ec;
  path p = train::fs::weakly_canonical(train::fs::absolute(out_dir, ec), ec);
  if (ec) p = train::fs::absolute(out_dir).lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
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
  // --out is a new or empty directory: anything there (a model, a run) is never overwritten,
  // and a live run there (its lock held) is refused naming its pid. A lock file left there is
  // held from here on, so that a run started there meanwhile is refused.
  const char* const kNewDir = "replay writes the rebuilt model into a new or empty directory";
  train::RunLock lock;
  if (train::fs::exists(path(out_dir) / ".lock", ec)) lock.acquire(out_dir, "--out");
  train::check_empty_out(out_dir, "--out", kNewDir);
  // Where the rebuilt model is renamed to, once written beside it (below).
  const path dst = real_out(out_dir);
  const path parent = dst.parent_path();
  const std::string name = dst.filename().string();
  ZOF_CHECK(!name.empty() && parent != dst,
            "--out " + out_dir + " is the root directory; " + kNewDir + ": choose another --out");
  // An empty --out that is a mount point (a container's volume) cannot be replaced by rename(2).
  struct stat so {}, sp {};
  ZOF_CHECK(::stat(dst.c_str(), &so) != 0 || ::stat(parent.c_str(), &sp) != 0 ||
                so.st_dev == sp.st_dev,
            "--out " + out_dir + " is a mount point: replay writes the rebuilt model beside --out "
            "and renames it into place, which cannot replace a mount point; give a new directory "
            "inside it, --out " + (path(out_dir) / "model").string());
  // The rename would swap the directory a process stands in (this one's, a shell's) for a new
  // one, leaving them in an empty, deleted directory: refuse the working directory.
  struct stat sc {};
  ZOF_CHECK(::stat(dst.c_str(), &so) != 0 || ::stat(".", &sc) != 0 || so.st_dev != sc.st_dev ||
                so.st_ino != sc.st_ino,
            "--out " + out_dir + " is the current directory, which replay would replace with the "
            "rebuilt model's (this shell would be left in a deleted directory); give a new "
            "directory, e.g. --out " + (path(out_dir) / "model").string());
  const json saved = train::read_json(run / "run.json");
  const std::string run_json = (run / "run.json").string();
  const TrainOptions o = train::parse_run_options(saved, run_json);
  ZOF_CHECK(saved.contains("model_id") && saved["model_id"].is_object(),
            run_json + ": \"model_id\" is missing or not an object; the run directory is damaged");
  ZOF_CHECK(!saved.contains("base_fingerprint") || saved["base_fingerprint"].is_string(),
            run_json + ": \"base_fingerprint\" is not a string; the run directory is damaged");
  validate_options(o, /*new_run=*/false);
  // The options are the ones the run trained with: a run.json edited since is refused (its
  // seal, and the one its checkpoint recorded, read by recorded_log).
  train::check_run_seal(saved, run_json);
  const Recorded recorded = recorded_log(run, o, saved, run_json);
  // The log is the run's, whole (or the prefix asked for), before anything is built from it:
  // each record read, then the log against what the run recorded of it.
  // Warnings wait until the replay is known to succeed: a refused one prints its error alone.
  std::vector<std::string> warnings;
  const int64_t read_steps =
      apply_log(run / "zo_log.jsonl", nullptr, o, steps_wanted).first;
  if (std::string w = check_log(run / "zo_log.jsonl", recorded, steps_wanted, run_dir);
      !w.empty())
    warnings.push_back(std::move(w));
  setup_host_threads(threads, 1);
  BackendOptions b;
  b.threads = threads;
  auto backend = make_backend(b);
  // Loaded as the run's fingerprint was taken; a bf16 master is then held in 2 bytes (replay
  // applies the updates on the host, unstreamed).
  const DType storage = o.master == MasterChoice::Bf16 ? DType::BF16 : DType::F32;
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
  // What the run checked before it trained (a base that GGUF can describe: its architecture,
  // its tokenizer.json): refused here, before the steps are replayed and --out is touched.
  if (o.save_format == SaveFormat::Gguf) model.check_gguf_save(base_model);
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
                "'s range (the run's --save-dtype " + word(o.save_dtype) + "), so the run wrote no "
                "model and neither does its replay");
  // The model is built beside --out under a temporary name, synced, and renamed into place (as
  // a checkpoint is): a replay stopped part way (a SIGKILL, a full disk) leaves no --out that
  // looks like a model, only its temporary, which the next replay into --out removes. The
  // rename is the arbiter between replays (and runs) into one --out: it replaces only a missing
  // or empty directory, so the one that comes second is refused, and nothing is mixed.
  path top;  // the topmost directory above --out that this process creates
  for (path p = parent; !train::fs::exists(train::fs::symlink_status(p, ec)); p = p.parent_path()) {
    top = p;
    if (!p.has_parent_path() || p.parent_path() == p) break;
  }
  train::fs::create_directories(parent, ec);
  ZOF_CHECK(!ec, "--out " + out_dir + ": cannot create the directory (" + ec.message() + ")");
  const path tmp = parent / ("." + name + kTmpTag + std::to_string(::getpid()));
  const LiveTmp live(tmp, out_dir);
  try {
    lock.write_pid();  // (when held) for whoever is refused next: nothing refused this one
    remove_stale_replay_tmp(parent, name);
    train::fs::remove_all(tmp, ec);  // not this process's: an earlier one's with this pid
    ZOF_CHECK(::mkdir(tmp.c_str(), 0777) == 0,
              "--out " + out_dir + ": cannot create " + tmp.string() + " (" +
                  std::strerror(errno) + "); replay builds the model there, beside --out, and "
                  "renames it into place: choose an --out in a directory you can write");
    // Fault injection for the crash tests: ZOF_FAULT_KILL_IN_REPLAY=weights dies mid-write with
    // the weights written and the tokenizer not; =files with every file written, not renamed.
    const char* kill = std::getenv("ZOF_FAULT_KILL_IN_REPLAY");
    // As the run saved it: its --save-format, its --save-dtype.
    const bool gguf = o.save_format == SaveFormat::Gguf;
    if (gguf) model.save_gguf((tmp / "model.gguf").string(), out_t, base_model);
    else model.save(tmp.string(), out_t);
    if (kill && std::string(kill) == "weights") ::raise(SIGKILL);
    if (!gguf) train::copy_tokenizer_files(base_model, tmp);
    if (kill && std::string(kill) == "files") ::raise(SIGKILL);
    fsync_tree(tmp);
    // --out again, as it is now: a run may have started there (its lock held), or anything
    // been put there, since it was checked.
    if (!lock.held() && train::fs::exists(dst / ".lock", ec)) {
      lock.acquire(out_dir, "--out");
      lock.write_pid();
    }
    train::check_empty_out(out_dir, "--out", kNewDir);
    // zof's leftovers there (a dead process's NAME.tmp.PID, the lock file, which this process
    // holds): rename(2) replaces an empty directory only.
    if (train::fs::is_directory(dst, ec)) {
      train::remove_stale_tmp(dst);
      if (lock.held()) train::fs::remove(dst / ".lock", ec);
    }
    if (::rename(tmp.c_str(), dst.c_str()) != 0) {
      const int e = errno;
      // Filled by another process since: refused as any --out that holds something, naming
      // what it holds (or the live process whose lock is all it holds yet).
      if (e == ENOTEMPTY || e == EEXIST) {
        train::check_empty_out(out_dir, "--out", kNewDir);
        train::RunLock probe;
        if (train::fs::exists(dst / ".lock", ec)) probe.acquire(out_dir, "--out");
      }
      throw Error("--out " + out_dir + ": cannot rename " + tmp.string() + " to " +
                  dst.string() + " (" + std::strerror(e) + "); " + kNewDir +
                  ": try again, or choose another --out");
    }
  } catch (...) {
    train::fs::remove_all(tmp, ec);
    // The directories above --out that this process created, as far as they are empty.
    if (!top.empty())
      for (path p = parent; train::fs::remove(p, ec) && p != top; p = p.parent_path()) {
      }
    throw;
  }
  fsync_fd_path(parent);
  for (const std::string& w : warnings) std::fprintf(stderr, "zof: warning: %s\n", w.c_str());
  return json{{"steps", steps}, {"updates", updates}, {"out", out_dir}};
}

}  // namespace zof
