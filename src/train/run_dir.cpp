// The run directory (run_dir.h): the tokenizer's files beside a model, the JSONL logs,
// checkpoints and `latest`, and RunDir: a new run's --out, a resumed run's options, weights and
// counters, and each checkpoint. Beside it: run.json (run_json.cpp), the lock (run_lock.cpp), the
// output directory's checks (output_checks.cpp), state.json (run_state.cpp).
#include "train/run_dir.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "zof/disk_tier.h"
#include "zof/error.h"
#include "zof/model.h"
#include "hf/gguf.h"
#include "hf/gguf_llama.h"
#include "hf/safetensors.h"
#include "zof/version.h"
#include "zof/zo.h"

using json = nlohmann::json;

namespace zof::train {

void copy_tokenizer_files(const fs::path& from, const fs::path& to) {
  if (gguf::is_file_path(from.string())) {  // a GGUF model: the files its vocabulary makes
    const gguf::File f = gguf::File::open(from.string());
    const gguf::TokenizerFiles t = gguf::llama_tokenizer(f, gguf::llama_config(f));
    const auto text = [](const json& j, int indent) {
      return j.dump(indent, ' ', false, json::error_handler_t::replace) + (indent < 0 ? "" : "\n");
    };
    write_file_atomic(to / "tokenizer.json", text(t.tokenizer, -1));
    write_file_atomic(to / "tokenizer_config.json", text(t.tokenizer_config, 2));
    write_file_atomic(to / "generation_config.json", text(t.generation_config, 2));
    return;
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                           "generation_config.json"}) {
    if (!fs::exists(from / name)) continue;
    std::ifstream f(from / name, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    write_file_atomic(to / name, ss.str());
  }
}

// ---- JsonlLog ---------------------------------------------------------------------------------

void JsonlLog::open(const fs::path& p, int64_t truncate_to) {
  path_ = p;
  hash_ = ByteHash();
  if (truncate_to >= 0 && fs::exists(p)) fs::resize_file(p, (uintmax_t)truncate_to);
  if (truncate_to != 0 && fs::exists(p)) {  // the running hash continues from what is kept
    std::ifstream in(p, std::ios::binary);
    std::vector<char> buf(1 << 16);
    while (in) {
      in.read(buf.data(), (std::streamsize)buf.size());
      hash_.add(buf.data(), (size_t)in.gcount());
    }
  }
  f_ = std::fopen(p.c_str(), truncate_to == 0 ? "w" : "a");
  ZOF_CHECK(f_, "cannot write " + p.string() + ": " + std::strerror(errno));
}

JsonlLog::~JsonlLog() {
  if (f_) std::fclose(f_);
}

void JsonlLog::write(const json& j) {
  const std::string s = j.dump() + "\n";
  ZOF_CHECK(std::fwrite(s.data(), 1, s.size(), f_) == s.size(),
            "cannot write " + path_.string() + " (disk full?)");
  hash_.add(s);
  std::fflush(f_);
}

int64_t JsonlLog::sync() {
  std::fflush(f_);
  ::fsync(fileno(f_));
  return (int64_t)fs::file_size(path_);
}

// ---- RunDir -----------------------------------------------------------------------------------

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

namespace {

// A run that ended and wrote its model: model.safetensors (--save-format safetensors) or
// model.gguf (--save-format gguf) and a summary.json of a run that was not interrupted (an
// interrupted run writes a summary too, and no model). Returns what a new run gives as --model
// to start from that model (the directory, or its model.gguf); empty when the run has not
// finished.
fs::path finished_model(const fs::path& run) {
  std::error_code ec;
  fs::path model;
  if (fs::is_regular_file(run / "model.safetensors", ec) ||
      fs::is_regular_file(run / "model.safetensors.index.json", ec))  // a model saved in shards
    model = run;
  else if (fs::is_regular_file(run / "model.gguf", ec))
    model = run / "model.gguf";
  if (model.empty() || !fs::is_regular_file(run / "summary.json", ec)) return {};
  try {
    const json j = json::parse(slurp(run / "summary.json"));
    if (j.is_object() && j.contains("steps") && !j.value("interrupted", false)) return model;
  } catch (const json::exception&) {
  }
  return {};
}

// A checkpoint's weights: model.safetensors (or its shards' index, Model::save above 5 GB), or
// the disk tier's resident.safetensors beside store.json (the rest in the store).
bool holds_weights(const fs::path& ckpt) {
  std::error_code ec;
  return fs::is_regular_file(ckpt / "model.safetensors", ec) ||
         fs::is_regular_file(ckpt / "model.safetensors.index.json", ec) ||
         (fs::is_regular_file(ckpt / "store.json", ec) &&
          fs::is_regular_file(ckpt / "resident.safetensors", ec));
}

std::string hex64(uint64_t h) {
  char t[20];
  std::snprintf(t, sizeof t, "%016llx", (unsigned long long)h);
  return t;
}

}  // namespace

fs::path latest_checkpoint(const fs::path& run) {
  const fs::path latest = run / "latest";
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(latest, ec))) {
    // No `latest`: no checkpoint completed yet (a torn checkpoint-N.tmp does not count; the run
    // starts again from step 0), or the process died between renaming its first checkpoint into
    // place (complete: it is renamed only once written and synced) and writing `latest`, or the
    // file was lost. A checkpoint-N directory is then the newest complete checkpoint: resuming
    // from 0 would cut the logs back to nothing.
    fs::path best;
    int64_t best_step = -1;
    for (const auto& e : fs::directory_iterator(run, ec)) {
      const std::string n = e.path().filename().string();
      const int64_t step = checkpoint_step(n);
      if (step < 0) continue;
      ZOF_CHECK(fs::is_regular_file(e.path() / "state.json", ec) && holds_weights(e.path()),
                "the run directory " + run.string() + " holds " + n + " without state.json and "
                "model.safetensors and no 'latest' file: that checkpoint is damaged; " + kDamaged);
      if (step > best_step) best_step = step, best = e.path();
    }
    return best;
  }
  ZOF_CHECK(fs::is_regular_file(latest, ec),
            latest.string() + " is not a file; " + kDamaged);
  std::string text = slurp(latest);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  const std::string shown = text.size() > 60 ? text.substr(0, 60) + "..." : text;
  ZOF_CHECK(checkpoint_step(text) >= 0,
            latest.string() + " should name one checkpoint (checkpoint-<step>), not '" + shown +
                "'; " + kDamaged);
  const fs::path dir = run / text;
  ZOF_CHECK(fs::is_directory(dir, ec),
            latest.string() + " names " + text + ", which is not in " + run.string() + "; " +
                kDamaged);
  ZOF_CHECK(fs::is_regular_file(dir / "state.json", ec) && holds_weights(dir),
            "the run directory " + run.string() + " names checkpoint '" + text +
                "' in its 'latest' file, but that checkpoint is incomplete (it needs state.json "
                "and model.safetensors); the run cannot resume");
  return dir;
}

RunDir::RunDir(TrainOptions& opt) : resuming_(!opt.resume.empty()) {
  if (!resuming_) {
    run_ = opt.out;
    return;
  }
  run_ = opt.resume;
  std::error_code ec;
  ZOF_CHECK(fs::is_directory(run_, ec),
            "--resume " + run_.string() + ": no such run directory; give the --out of a run");
  // A run stopped before it wrote run.json leaves only zof's leftovers: nothing to resume.
  ZOF_CHECK(fs::is_regular_file(run_ / "run.json", ec) || !foreign_entries(run_).empty() ||
                fs::is_empty(run_, ec),
            "--resume " + run_.string() + ": the run never started (it was stopped before it "
            "wrote run.json; the directory holds only zof's lock or temporary files): start it "
            "again with zof finetune --out " + run_.string() + " and the run's flags");
  ZOF_CHECK(fs::is_regular_file(run_ / "run.json", ec),
            "--resume " + run_.string() + ": not a zof run directory (no run.json)");
  const std::string run_json = (run_ / "run.json").string();
  saved_ = read_json(run_ / "run.json");
  TrainOptions s = parse_run_options(saved_, run_json);
  ZOF_CHECK(saved_.contains("model_id") && saved_["model_id"].is_object(),
            run_json + ": \"model_id\" is missing or not an object; " + kDamaged);
  ZOF_CHECK(!saved_.contains("base_fingerprint") || saved_["base_fingerprint"].is_string(),
            run_json + ": \"base_fingerprint\" is not a string; " + kDamaged);
  ZOF_CHECK(!saved_.contains("data_fingerprint") || saved_["data_fingerprint"].is_string(),
            run_json + ": \"data_fingerprint\" is not a string; " + kDamaged);
  // The options the run continues with are the ones it started with: a run.json edited since
  // (a new --lr for the steps from the checkpoint on) is refused, never half applied.
  check_run_seal(saved_, run_json);
  run_seal_ = run_json_seal(saved_);  // also of an older run.json: its checkpoints record it
  ZOF_CHECK(opt.model.empty() || fs::weakly_canonical(opt.model) == fs::weakly_canonical(s.model),
            "--resume " + run_.string() + " was started from model " + s.model +
                ", not --model " + opt.model + "; resume with the same model or start a new run");
  s.threads = opt.threads;
  s.json = opt.json;
  s.no_report = opt.no_report;
  s.pipeline_stages = opt.pipeline_stages;
  s.tensor_parallel = opt.tensor_parallel;
  s.gpu_mem = opt.gpu_mem;
  s.sim_device = opt.sim_device;
  s.host_mem = opt.host_mem;
  s.offload_dir = opt.offload_dir;
  s.write_back_every = opt.write_back_every;
  s.device = opt.device;
  s.dist_timeout = opt.dist_timeout;
  s.resume = opt.resume;
  s.out = run_.string();
  opt = s;
  ckpt_ = latest_checkpoint(run_);
  if (ckpt_.empty()) return;
  const fs::path sf = ckpt_ / "state.json";
  const json sj = read_json(sf);
  check_recorded_seal(sj, sf.string(), saved_, run_json);  // before --steps bounds its step
  state_ = parse_state(sj, sf.string(), opt.steps);
  const int64_t named = checkpoint_step(ckpt_.filename().string());
  ZOF_CHECK(state_.step == named, sf.string() + ": \"step\" is " + std::to_string(state_.step) +
                                      " but the checkpoint is " + ckpt_.filename().string() +
                                      "; " + kDamaged);
  // The final checkpoint is written before the model and summary.json: a run stopped between
  // them resumes to write them; one with its summary has finished.
  if (state_.step == opt.steps) finished_model_ = finished_model(run_);
  finished_ = !finished_model_.empty();
  steps_ = opt.steps;
}

RunDir::~RunDir() {
  if (created_.empty() || started_) return;
  std::error_code ec;
  fs::remove_all(created_, ec);
}

void RunDir::check_unfinished() const {
  ZOF_CHECK(!finished_,
            "--resume " + run_.string() + ": the run finished at step " + std::to_string(steps_) +
                " of its --steps " + std::to_string(steps_) + " and wrote its model: there is "
                "nothing to resume; to train further, start a new run from its model with "
                "zof finetune --model " + finished_model_.string() + " --out NEW_DIR");
}

void RunDir::check_out(const TrainOptions& opt) const {
  if (resuming_) {
    check_apart(run_, "--resume", opt.model, "the run's model");
    check_apart(run_, "--resume", opt.data, "the run's data");
    return;
  }
  ZOF_CHECK(!run_.empty(), "--out is required: the run directory to write");
  std::error_code ec;
  const fs::path done = fs::exists(run_ / "run.json", ec) ? finished_model(run_) : fs::path();
  ZOF_CHECK(done.empty(),
            "--out " + run_.string() + " already holds a run, which has finished (nothing to "
            "--resume); choose another --out, or start a new run from its model with --model " +
                done.string());
  ZOF_CHECK(!fs::exists(run_ / "run.json", ec),
            "--out " + run_.string() + " already holds a run; continue it with --resume " +
                run_.string() + " or choose another --out");
  check_apart(run_, "--out", opt.model, "--model");
  check_apart(run_, "--out", opt.data, "--data");
  // Anything else there (another model, files of the user's) would be overwritten or mixed
  // with the run's files; zof's own leftovers of a run stopped before it started are not.
  check_empty_out(run_, "--out", "a new run writes into a new or empty directory");
  // The nearest part of --out that exists must be a directory this process can write into.
  fs::path p = fs::absolute(run_, ec);
  while (!p.empty() && !fs::exists(fs::symlink_status(p, ec)) && p.has_parent_path() &&
         p.parent_path() != p)
    p = p.parent_path();
  ZOF_CHECK(fs::is_directory(p, ec),
            "--out " + run_.string() + ": cannot create the directory (" + p.string() +
                " is not a directory); choose another --out");
  ZOF_CHECK(::access(p.c_str(), W_OK | X_OK) == 0,
            "--out " + run_.string() + ": cannot create the directory (" + p.string() +
                " is not writable); choose a directory you can write");
}

void RunDir::check_log(const fs::path& file, int64_t recorded, const char* field, int64_t lines,
                       const std::string& hash) const {
  const std::string state = (ckpt_ / "state.json").string();
  const std::string fix = "zof does not append to a damaged log: restore " +
                          file.filename().string() + " from a copy, or start a new run";
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    ZOF_CHECK(recorded == 0, file.string() + " is missing, but " + state + " records " +
                                 std::to_string(recorded) + " bytes of it (" + field + "); " + fix);
    return;
  }
  ZOF_CHECK(fs::is_regular_file(file, ec), file.string() + " is not a file; " + fix);
  const int64_t size = (int64_t)fs::file_size(file, ec);
  if (size < recorded) {
    const std::string fewer = file.string() + " holds " + std::to_string(size) +
                              " bytes, fewer than the " + std::to_string(recorded) + " that " +
                              state + " records (" + field + ")";
    // A step log that still holds every step record the checkpoint saw was not cut: a record
    // was made shorter, or (its records hashing as recorded) the recorded size was changed.
    if (lines > 0) {
      const std::string text = slurp(file);
      int64_t n = 0;
      size_t end = 0;
      for (size_t at = 0; n < lines && (at = text.find('\n', end)) != std::string::npos; ++n)
        end = at + 1;
      if (n == lines) {
        ByteHash h;
        h.add(text.data(), end);
        ZOF_CHECK(hash.empty() || h.text() != hash,
                  fewer + ", yet its first " + std::to_string(n) + " records hash to the " +
                      hash + " that it records (log_hash): " + state + "'s " + field +
                      " was changed; " + kDamaged);
        throw Error(fewer + ", yet all " + std::to_string(n) + " step records: a record was "
                    "changed; " + fix);
      }
    }
    throw Error(fewer + ": the log was truncated; " + fix);
  }
  if (recorded == 0) return;
  std::ifstream f(file, std::ios::binary);
  std::string prefix((size_t)recorded, '\0');
  f.read(prefix.data(), recorded);
  ZOF_CHECK(f.gcount() == recorded, "cannot read " + file.string());
  ZOF_CHECK(prefix.back() == '\n',
            file.string() + ": the " + std::to_string(recorded) + " bytes that " + state +
                " records (" + field + ") do not end at a line boundary: the log was changed; " +
                fix);
  int64_t n = 0;
  for (size_t at = 0; at < prefix.size();) {
    const size_t end = prefix.find('\n', at);
    json j;
    try {
      j = json::parse(prefix.begin() + at, prefix.begin() + end);
    } catch (const json::exception&) {
    }
    ++n;
    const bool step_ok = lines < 0 || (j.is_object() && j.contains("step") &&
                                       j["step"].is_number_integer() && j["step"] == n - 1);
    ZOF_CHECK(j.is_object() && step_ok,
              file.string() + " line " + std::to_string(n) + " is " +
                  (j.is_object() ? "not the record of step " + std::to_string(n - 1)
                                 : std::string("not a JSON object")) +
                  ": the log was changed; " + fix);
    at = end + 1;
  }
  ZOF_CHECK(lines < 0 || n == lines,
            file.string() + " holds " + std::to_string(n) + " step records where " + state +
                " records " + std::to_string(lines) + " steps: the log was changed; " + fix);
  // A record edited in place (a g or lr of the same length) keeps the sizes and the steps.
  ByteHash h;
  h.add(prefix);
  ZOF_CHECK(hash.empty() || h.text() == hash,
            file.string() + ": its first " + std::to_string(n) + " records (steps 0 to " +
                std::to_string(n - 1) + ") hash to " + h.text() + ", not the " + hash + " that " +
                state + " records (log_hash): a record was changed; " + fix);
}

void RunDir::lock_resumed() {
  if (!resuming_) return;
  ZOF_CHECK(::access(run_.c_str(), W_OK | X_OK) == 0,
            "--resume " + run_.string() + ": the run directory is not writable (" +
                std::strerror(errno) + "); a resumed run writes its logs and checkpoints there: "
                "make it writable or copy the run");
  lock_.acquire(run_, "--resume");
  remove_stale_tmp(run_);  // temporary files of a process killed mid-write (latest.tmp.PID)
  if (ckpt_.empty()) return;  // no checkpoint yet: the logs start again from nothing
  check_log(run_ / "zo_log.jsonl", state_.log_bytes, "log_bytes", state_.step, state_.log_hash);
  check_log(run_ / "metrics.jsonl", state_.metrics_bytes, "metrics_bytes", -1);
}

void RunDir::create(bool root) {
  // Rank 0 alone creates (and may remove) --out: the other ranks write nothing there, and a
  // rank that created it first would make rank 0 think it existed before the run.
  if (resuming_ || !root) return;
  std::error_code ec;
  fs::path top = fs::absolute(run_, ec);  // the topmost directory that does not exist yet
  for (fs::path p = top; !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
    top = p;
    if (!p.has_parent_path() || p.parent_path() == p) break;
  }
  const bool existed = fs::exists(run_, ec);
  fs::create_directories(run_, ec);
  ZOF_CHECK(!ec, "--out " + run_.string() + ": cannot create the directory (" + ec.message() + ")");
  ZOF_CHECK(::access(run_.c_str(), W_OK) == 0,
            "--out " + run_.string() + " is not writable; choose a directory you can write");
  const bool had_lock = fs::exists(run_ / ".lock", ec);
  lock_.acquire(run_, "--out");
  // Ours to remove if the run never starts: what this process created, once it holds the lock.
  if (!existed) created_ = top;
  else if (!had_lock) created_ = run_ / ".lock";
  // Another process may have started a run here since check_out.
  ZOF_CHECK(!fs::exists(run_ / "run.json", ec),
            "--out " + run_.string() + " already holds a run; continue it with --resume " +
                run_.string() + " or choose another --out");
  check_empty_out(run_, "--out", "a new run writes into a new or empty directory");
  remove_stale_tmp(run_);  // run.json.tmp.PID of a run killed before it started
  // Fault injection for the signal tests: SIGTERM between creating --out and writing run.json.
  if (std::getenv("ZOF_FAULT_TERM_IN_CREATE")) ::raise(SIGTERM);
}

std::string RunDir::check_model(const json& model_id, const std::string& fingerprint,
                                const std::string& model_dir) const {
  if (!resuming_) return "";
  ZOF_CHECK(saved_.at("model_id") == model_id,
            "--resume " + run_.string() + ": the model in " + model_dir +
                " is not the one this run started from (config or size differ)");
  if (fingerprint.empty()) return "";  // the weights' turn comes once they are read
  if (!saved_.contains("base_fingerprint"))
    return "warning: " + (run_ / "run.json").string() +
           " records no fingerprint of the base model's weights (a run from an older zof); "
           "resuming without checking them";
  const std::string want = saved_["base_fingerprint"];
  ZOF_CHECK(want == fingerprint,
            "--resume " + run_.string() + ": the weights in " + model_dir + " (fingerprint " +
                fingerprint + ") are not the ones this run started from (" + want +
                ", run.json base_fingerprint); resume with the run's base model");
  return "";
}

void RunDir::check_data(const std::string& fingerprint, const std::string& data) {
  data_fingerprint_ = fingerprint;
  if (!resuming_ || fingerprint.empty() || !saved_.contains("data_fingerprint")) return;
  const json& want = saved_["data_fingerprint"];
  const std::string run_json = (run_ / "run.json").string();
  ZOF_CHECK(want.is_string(), run_json + ": \"data_fingerprint\" is not a string; " + kDamaged);
  ZOF_CHECK(want.get<std::string>() == fingerprint,
            "--resume " + run_.string() + ": the data in " + data + " (fingerprint " +
                fingerprint + ") are not the data this run started from (" +
                want.get<std::string>() + ", " + run_json + " data_fingerprint); restore " +
                data + " as it was, or start a new run on the new data");
}

std::string RunDir::saved_fingerprint() const {
  if (!resuming_ || !saved_.contains("base_fingerprint") || !saved_["base_fingerprint"].is_string())
    return "";
  return saved_["base_fingerprint"].get<std::string>();
}

bool RunDir::checkpoint_in_store() const {
  std::error_code ec;
  return !ckpt_.empty() && fs::exists(ckpt_ / "store.json", ec);
}

std::optional<RunDir::CheckpointStore> RunDir::checkpoint_store(const Model& model,
                                                                 int planes) const {
  std::error_code ec;
  if (ckpt_.empty() || !fs::exists(ckpt_ / "store.json", ec)) return std::nullopt;
  const fs::path f = ckpt_ / "store.json";
  const std::string file = f.string();
  const json j = read_json(f);
  const auto field = [&](const char* k) -> const json& {
    ZOF_CHECK(j.is_object() && j.contains(k), file + " has no \"" + k + "\"; " + kDamaged);
    return j[k];
  };
  const int nblocks = (int)model.blocks().size();
  ZOF_CHECK(field("format").is_number_integer() && field("format").get<int64_t>() == 1,
            file + ": \"format\" should be 1 (a store this zof writes); " + kDamaged);
  ZOF_CHECK(field("store").is_string() && !field("store").get<std::string>().empty(),
            file + ": \"store\" should name the store's file; " + kDamaged);
  ZOF_CHECK(field("planes").is_number_integer() && field("planes").get<int64_t>() == planes,
            file + ": \"planes\" should be " + std::to_string(planes) +
                " (the weights and the optimizer's state planes); " + kDamaged);
  const uint64_t bytes = DiskTier::store_file_bytes(model, planes);
  ZOF_CHECK(field("file_bytes").is_number_unsigned() && field("file_bytes").get<uint64_t>() == bytes,
            file + ": \"file_bytes\" should be " + std::to_string(bytes) +
                " (the store's size for this model's layout); " + kDamaged);
  const json& blocks = field("blocks");
  ZOF_CHECK(blocks.is_array(), file + ": \"blocks\" should be a list; " + kDamaged);
  CheckpointStore cs;
  const fs::path named = field("store").get<std::string>();
  cs.file = named.is_absolute() ? named : run_ / named;
  cs.slot.assign(nblocks, -1);
  cs.hash.assign(nblocks, 0);
  for (const json& e : blocks) {
    ZOF_CHECK(e.is_array() && e.size() == 3 && e[0].is_number_integer() &&
                  e[1].is_number_integer() && e[2].is_string(),
              file + ": each entry of \"blocks\" should be [block, slot, hash]; " + kDamaged);
    const int64_t b = e[0].get<int64_t>(), sl = e[1].get<int64_t>();
    const std::string h = e[2].get<std::string>();
    ZOF_CHECK(b >= 0 && b < nblocks && cs.slot[b] < 0,
              file + ": block " + std::to_string(b) + " is not one of the model's " +
                  std::to_string(nblocks) + " blocks, or is listed twice; " + kDamaged);
    ZOF_CHECK(sl == 0 || sl == 1, file + ": block " + std::to_string(b) + "'s slot is " +
                                      std::to_string(sl) + ", not 0 or 1; " + kDamaged);
    ZOF_CHECK(h.size() == 16 && h.find_first_not_of("0123456789abcdef") == std::string::npos,
              file + ": block " + std::to_string(b) + "'s hash should be 16 hex digits; " +
                  kDamaged);
    cs.slot[b] = (int)sl;
    cs.hash[b] = std::stoull(h, nullptr, 16);
  }
  return cs;
}

RunCounters RunDir::load_checkpoint(Model& model, BlockAccess* tier) const {
  if (ckpt_.empty()) return RunCounters{};
  if (fs::exists(ckpt_ / "store.json")) {
    auto* disk = dynamic_cast<DiskTier*>(tier);
    ZOF_CHECK(disk && disk->persistent(),
              "checkpoint " + ckpt_.string() + " keeps its blocks in the disk tier's store: "
              "resume it with the disk tier (--host-mem), in one process");
    load_from_store(model, *disk);
    return state_;
  }
  // Its layout first, then its weights straight into the model (a second model in memory would
  // double a big run's footprint), held as the run holds them (a bf16 master's: exact).
  const Model saved = Model::load_layout(ckpt_.string());
  ZOF_CHECK(saved.storage_size() == model.storage_size() &&
                saved.num_params() == model.num_params() &&
                saved.params().size() == model.params().size(),
            "checkpoint " + ckpt_.string() + " does not match the model's layout (" +
                std::to_string(saved.num_params()) + " parameters, the model has " +
                std::to_string(model.num_params()) + "); " + kDamaged);
  for (size_t i = 0; i < saved.params().size(); ++i)
    ZOF_CHECK(saved.params()[i].name == model.params()[i].name &&
                  saved.params()[i].shape == model.params()[i].shape,
              "checkpoint " + ckpt_.string() + " holds tensor " + saved.params()[i].name +
                  " where the model has " + model.params()[i].name + "; " + kDamaged);
  model.read_weights(ckpt_.string(), tier);
  return state_;
}

void RunDir::load_optimizer_state(ZOEngine& engine, const Model& model,
                                  OptimizerChoice optimizer) const {
  const int planes = engine.state_planes();
  if (!ckpt_.empty() && planes > 0 && fs::exists(ckpt_ / "store.json")) {
    // The blocks the checkpoint holds itself, a block at a time; the store's slots brought the
    // others' state in with their weights (load_from_store).
    const fs::path f = ckpt_ / "optimizer.safetensors";
    ZOF_CHECK(fs::exists(f), "checkpoint " + ckpt_.string() + " has no optimizer.safetensors: it "
              "was not written by a --optimizer " + word(optimizer) + " run");
    auto st = safetensors::Archive::open_file(f.string());
    const auto names = st.names();
    // Written before the store held the state too: the whole planes (read as below).
    const bool whole = std::find(names.begin(), names.end(), "m") != names.end();
    if (!whole) {
      const CheckpointStore cs = *checkpoint_store(model, 1 + planes);
      std::vector<int> resident;
      for (int b = 0; b < (int)cs.slot.size(); ++b)
        if (cs.slot[b] < 0) resident.push_back(b);
      ZOF_CHECK(names.size() == resident.size() * (size_t)planes,
                f.string() + " holds " + std::to_string(names.size()) + " tensors, not the " +
                    std::to_string(resident.size() * (size_t)planes) + " (m" +
                    (planes == 2 ? " and v" : "") + " of each block its store.json leaves out); " +
                    kDamaged);
      // Every tensor found (name, shape) before the walk: none is missing halfway.
      for (int b : resident)
        for (int k = 0; k < planes; ++k)
          (void)st.require((k == 0 ? "m." : "v.") + std::to_string(b), {model.blocks()[b].span});
      engine.write_state_blocks(resident, [&](int b, float* bm, float* bv) {
        const int64_t span = model.blocks()[b].span;
        safetensors::to_f32(st.require("m." + std::to_string(b), {span}), bm);
        if (bv) safetensors::to_f32(st.require("v." + std::to_string(b), {span}), bv);
      });
      return;
    }
  }
  std::vector<float> m, v;
  if (read_optimizer_state(engine.state_planes(), model.storage_size(), optimizer, m, v))
    engine.write_state(m, v);
}

bool RunDir::read_optimizer_state(int planes, int64_t n, OptimizerChoice optimizer,
                                  std::vector<float>& m, std::vector<float>& v) const {
  if (ckpt_.empty() || planes == 0) return false;
  const fs::path f = ckpt_ / "optimizer.safetensors";
  ZOF_CHECK(fs::exists(f), "checkpoint " + ckpt_.string() + " has no optimizer.safetensors: it "
            "was not written by a --optimizer " + word(optimizer) + " run");
  auto st = safetensors::Archive::open_file(f.string());
  m.assign((size_t)n, 0.f);
  v.assign(planes == 2 ? (size_t)n : 0, 0.f);
  safetensors::to_f32(st.require("m", {n}), m.data());
  if (!v.empty()) safetensors::to_f32(st.require("v", {n}), v.data());
  return true;
}

void RunDir::start(const TrainOptions& opt, const json& model_id, const std::string& fingerprint,
                   const json& compute, const RunCounters& c) {
  lr_ = opt.lr;
  weight_decay_ = opt.weight_decay;
  steps_ = opt.steps;
  lock_.write_pid();
  if (!resuming_) {
    json run{{"options", opt.to_json()},         {"model_id", model_id},
             {"base_fingerprint", fingerprint},  {"data_fingerprint", data_fingerprint_},
             {"compute", compute},               {"zof_version", version()},
             {"format", run_json_format(opt)}};
    // Sealed: a resume or replay refuses a run.json edited since (check_run_seal).
    run_seal_ = run_json_seal(run);
    run["seal"] = run_seal_;
    write_file_atomic(run_ / "run.json", run.dump(1));
  }
  started_ = true;
  metrics_.open(run_ / "metrics.jsonl", resuming_ ? c.metrics_bytes : 0);
  zlog_.open(run_ / "zo_log.jsonl", resuming_ ? c.log_bytes : 0);
}

void RunDir::load_from_store(Model& model, DiskTier& disk) const {
  const CheckpointStore cs = *checkpoint_store(model, disk.planes());
  // The blocks the checkpoint holds itself (resident when it was written), by name and shape,
  // as held (the storage's type: exact), through the tier where they are on disk now.
  const fs::path rf = ckpt_ / "resident.safetensors";
  auto st = safetensors::Archive::open_file(rf.string());
  const DType held = model.storage_dtype();
  size_t expected = 0;
  disk.begin_walk({});
  for (int b = 0; b < (int)model.blocks().size(); ++b) {
    if (cs.slot[b] >= 0) continue;
    disk.acquire(b, /*overwrite=*/true);
    for (int pi : model.blocks()[b].params) {
      const Param& p = model.params()[pi];
      const auto& t = st.require(p.name, p.shape);
      ZOF_CHECK(t.dtype == held, rf.string() + ": tensor " + p.name + " is " +
                                     dtype_torch_name(t.dtype) + ", not the run's master (" +
                                     dtype_torch_name(held) + "); " + kDamaged);
      std::memcpy(model.param_ptr(pi), t.data, (size_t)p.numel * dtype_size(held));
      ++expected;
    }
    disk.release(b, /*changed=*/true);
  }
  ZOF_CHECK(st.names().size() == expected,
            rf.string() + " holds " + std::to_string(st.names().size()) + " tensors, not the " +
                std::to_string(expected) + " of the blocks its store.json leaves out; " +
                kDamaged);
  // The store's blocks as the checkpoint named them, each checked against its hash.
  disk.restore_committed();
  std::vector<int> order;
  for (int b = 0; b < (int)cs.slot.size(); ++b)
    if (cs.slot[b] >= 0) order.push_back(b);
  disk.begin_walk(order);
  for (int b : order) {
    disk.acquire(b);
    const uint64_t h = disk.block_hash(b);
    disk.release(b, false);
    ZOF_CHECK(h == cs.hash[b],
              "block " + std::to_string(b) + " in the disk tier's store " + cs.file.string() +
                  " (slot " + std::to_string(cs.slot[b]) + ") does not match the hash " +
                  ckpt_.filename().string() + "/store.json records: the store was changed or "
                  "damaged since the checkpoint; the run cannot resume from it");
  }
}

bool RunDir::writes_store(BlockAccess* tier) {
  const DiskTier* disk = dynamic_cast<DiskTier*>(tier);
  return disk && disk->persistent() && !disk->plan().all_resident();
}

void RunDir::save_checkpoint(const RunCounters& c, const Model& model,
                             const CheckpointState& state, BlockAccess* tier) {
  const std::string name = "checkpoint-" + std::to_string(c.step);
  // A disk tier with a run's store and blocks on disk: those stay where they are (their slots
  // and hashes named, the hashes taken in the pass that checks the weights).
  DiskTier* disk = dynamic_cast<DiskTier*>(tier);
  const bool in_store = writes_store(tier);
  ZOF_ASSERT(state.planes == 0 || (in_store ? (bool)state.block : state.m != nullptr));
  std::vector<uint64_t> hashes(model.blocks().size(), 0);
  const Model::NonFinite bad = model.find_non_finite(
      tier, in_store ? std::function<void(int)>([&](int b) {
        if (disk->on_disk(b)) hashes[b] = disk->block_hash(b);
      })
                     : nullptr);
  // Weights that are not finite, or that gave a non-finite loss at the last step (bad_run > 0:
  // that step's update was skipped), are not written. Mid-run such a checkpoint is skipped (a
  // transient the run may recover from; the last good checkpoint stays); at the end of the run,
  // and whenever the weights themselves are not finite, the run stops here with no output model.
  if (bad.param < 0 && c.bad_run > 0 && c.step < steps_) return;
  if (bad.param >= 0 || c.bad_run > 0) {
    // The first step whose loss was not finite (its update was skipped): the weights went
    // wrong at the update before it.
    int64_t first_bad = -1;
    zlog_.sync();
    std::ifstream f(run_ / "zo_log.jsonl");
    for (std::string line; first_bad < 0 && std::getline(f, line);) {
      try {
        const json j = json::parse(line);
        if (j.value("skipped", false)) first_bad = j.value("step", (int64_t)-1);
      } catch (const json::exception&) {
      }
    }
    const fs::path last = latest_checkpoint(run_);
    char lr[64];
    std::snprintf(lr, sizeof lr, "%g", (double)lr_);
    const std::string what =
        bad.param >= 0 ? "the weights are not finite after step " + std::to_string(c.step) + " (" +
                             model.params()[bad.param].name + " element " +
                             std::to_string(bad.index) + " is " +
                             (std::isnan(bad.value) ? "NaN" : "infinite") + ")"
                       : "the weights after step " + std::to_string(c.step) +
                             " give a non-finite loss (the last " + std::to_string(c.bad_run) +
                             " steps were skipped)";
    throw Error(what +
                (first_bad >= 0 ? "; the loss was first not finite at step " +
                                      std::to_string(first_bad)
                                : std::string()) +
                ": no checkpoint or model was written, " +
                (last.empty() ? std::string("and there is no earlier checkpoint")
                              : last.string() + " keeps the last finite weights") +
                ", the logs are in " + run_.string() + "; lower --lr (" + lr + ")" +
                (weight_decay_ != 0 ? std::string(" or --weight-decay") : std::string()) +
                " and start a new run");
  }
  const fs::path tmp = run_ / (name + ".tmp");
  const fs::path dst = run_ / name;
  fs::remove_all(tmp);
  // Fault injection for the failure tests: a directory that cannot be written (as root, whom
  // permissions do not stop, a test has no other portable way to get one).
  if (const char* f = std::getenv("ZOF_FAULT_EACCES_IN_CHECKPOINT"); f && std::atoll(f) == c.step)
    throw fs::filesystem_error("cannot create directories", tmp,
                               std::make_error_code(std::errc::permission_denied));
  fs::create_directories(tmp);
  std::vector<int> slots;
  if (in_store) {
    slots = disk->commit();  // every disk block in its slot, durable
    // The resident blocks' tensors as held (exact), by name.
    std::vector<safetensors::TensorOut> t;
    for (int b = 0; b < (int)model.blocks().size(); ++b) {
      if (slots[b] >= 0) continue;
      for (int pi : model.blocks()[b].params) {
        const Param& p = model.params()[pi];
        safetensors::TensorOut o{p.name, model.storage_dtype(), p.shape, nullptr};
        if (model.storage_dtype() == DType::BF16)
          o.bf16 = static_cast<const uint16_t*>(model.param_ptr(pi));
        else
          o.data = static_cast<const float*>(model.param_ptr(pi));
        t.push_back(std::move(o));
      }
    }
    safetensors::write((tmp / "resident.safetensors").string(), t, {{"format", "zof"}});
    const fs::path store = disk->store_path();
    const fs::path rel = store.lexically_relative(run_);
    json blocks = json::array();
    for (int b = 0; b < (int)slots.size(); ++b)
      if (slots[b] >= 0) blocks.push_back(json::array({b, slots[b], hex64(hashes[b])}));
    const bool inside = !rel.empty() && *rel.begin() != "..";
    json sj{{"format", 1},
            {"store", inside ? rel.string() : fs::absolute(store).string()},
            {"file_bytes", DiskTier::store_file_bytes(model, disk->planes())},
            {"planes", disk->planes()},
            {"blocks", blocks}};
    write_file_atomic(tmp / "store.json", sj.dump(1));
  } else {
    model.save(tmp.string(), model.storage_dtype(), tier);  // the master as held: exact resume
  }
  // Momentum/Adam state beside the weights, for an exact resume.
  if (state.planes > 0 && in_store) {
    // The resident blocks' state, a block at a time as the file reaches it (the store's slots
    // hold the disk blocks' state with their weights).
    std::vector<safetensors::TensorOut> t;
    std::vector<int> block_of;
    for (int b = 0; b < (int)model.blocks().size(); ++b) {
      if (slots[b] >= 0) continue;
      const int64_t span = model.blocks()[b].span;
      for (int k = 0; k < state.planes; ++k) {
        t.push_back({(k == 0 ? "m." : "v.") + std::to_string(b), DType::F32, {span}, nullptr});
        block_of.push_back(b);
      }
    }
    std::vector<float> buf[2];
    int held = -1;  // the block whose state buf holds
    safetensors::write(
        (tmp / "optimizer.safetensors").string(), t,
        {{"optimizer", word(state.optimizer)}, {"blocks", "resident"}},
        [&](size_t i, safetensors::TensorOut& o) {
          const int b = block_of[i];
          if (b != held) {
            state.block(b, [&](int, float* bm, float* bv) {
              const size_t span = (size_t)model.blocks()[b].span;
              buf[0].assign(bm, bm + span);
              if (bv) buf[1].assign(bv, bv + span);
            });
            held = b;
          }
          o.data = buf[o.name[0] == 'm' ? 0 : 1].data();
        });
  } else if (state.planes > 0) {
    const std::vector<float>& m = *state.m;
    const std::vector<float>& v = *state.v;
    const int64_t n = model.storage_size();
    ZOF_ASSERT((int64_t)m.size() == n && (int64_t)v.size() == (state.planes == 2 ? n : 0));
    std::vector<safetensors::TensorOut> t{{"m", DType::F32, {n}, m.data()}};
    if (!v.empty()) t.push_back({"v", DType::F32, {n}, v.data()});
    safetensors::write((tmp / "optimizer.safetensors").string(), t,
                       {{"optimizer", word(state.optimizer)}});
  }
  // Fault injection for the crash tests: die mid-write, before the checkpoint is complete.
  if (const char* f = std::getenv("ZOF_FAULT_KILL_IN_CHECKPOINT"); f && std::atoll(f) == c.step)
    ::raise(SIGKILL);
  json st{{"step", c.step},         {"bad_run", c.bad_run},          {"eval_before", c.eval_before},
          {"tokens", c.tokens},     {"train_s", c.train_s},
          {"metrics_bytes", metrics_.sync()}, {"log_bytes", zlog_.sync()},
          {"log_hash", zlog_.hash()}};
  if (c.window_from >= 0) st["window_from"] = c.window_from;
  // What run.json held: its seal deleted along with an edit is found where a checkpoint is.
  if (!run_seal_.empty()) st["run_seal"] = run_seal_;
  write_file_atomic(tmp / "state.json", st.dump(1));
  fsync_path(tmp);
  fs::remove_all(dst);
  fs::rename(tmp, dst);
  fsync_path(run_);
  write_file_atomic(run_ / "latest", name + "\n");
  // The tier keeps the slots this checkpoint names (writes go around them from here), or knows
  // that no checkpoint needs its store.
  if (in_store)
    disk->committed(slots);
  else if (disk && disk->persistent())
    disk->uncommitted();
  // Older checkpoints are now redundant.
  for (auto& e : fs::directory_iterator(run_)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("checkpoint-", 0) == 0 && n != name) fs::remove_all(e.path());
  }
}

}  // namespace zof::train
