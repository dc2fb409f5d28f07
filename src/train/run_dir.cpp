// The run directory (run_dir.h): atomic files, the JSONL logs, run.json, checkpoints and
// `latest`, and the options, weights and counters a resumed run continues with.
#include "train/run_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "zof/error.h"
#include "zof/model.h"
#include "zof/safetensors.h"
#include "zof/version.h"
#include "zof/zo.h"

using json = nlohmann::json;

namespace zof::train {
namespace {

void fsync_path(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void write_file_atomic(const fs::path& path, const std::string& text) {
  const std::string tmp = path.string() + ".tmp." + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ZOF_CHECK(fd >= 0, "cannot write " + tmp + ": " + std::strerror(errno));
  size_t off = 0;
  while (off < text.size()) {
    ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("cannot write " + tmp + ": " + std::strerror(e));
    }
    off += (size_t)w;
  }
  ::fsync(fd);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path.string() + ": " + std::strerror(e));
  }
  fsync_path(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  ZOF_CHECK(f.good(), "cannot read " + p.string());
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw Error(p.string() + " is not valid JSON (" + e.what() + "); the run directory is damaged");
  }
}

void copy_tokenizer_files(const fs::path& from, const fs::path& to) {
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
  if (truncate_to >= 0 && fs::exists(p)) fs::resize_file(p, (uintmax_t)truncate_to);
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
  std::fflush(f_);
}

int64_t JsonlLog::sync() {
  std::fflush(f_);
  ::fsync(fileno(f_));
  return (int64_t)fs::file_size(path_);
}

// ---- RunDir -----------------------------------------------------------------------------------

fs::path latest_checkpoint(const fs::path& run) {
  const fs::path latest = run / "latest";
  if (!fs::exists(latest)) return {};
  std::ifstream f(latest);
  std::string name;
  std::getline(f, name);
  const fs::path dir = run / name;
  ZOF_CHECK(!name.empty() && fs::exists(dir / "state.json") && fs::exists(dir / "model.safetensors"),
            "the run directory " + run.string() + " names checkpoint '" + name +
                "' in its 'latest' file, but that checkpoint is incomplete; the run cannot resume");
  return dir;
}

RunDir::RunDir(TrainOptions& opt) : resuming_(!opt.resume.empty()) {
  if (!resuming_) {
    run_ = opt.out;
    return;
  }
  run_ = opt.resume;
  ZOF_CHECK(fs::exists(run_ / "run.json"),
            "--resume " + run_.string() + ": not a zof run directory (no run.json)");
  saved_ = read_json(run_ / "run.json");
  TrainOptions s = TrainOptions::from_json(saved_.at("options"));
  ZOF_CHECK(opt.model.empty() || fs::weakly_canonical(opt.model) == fs::weakly_canonical(s.model),
            "--resume " + run_.string() + " was started from model " + s.model +
                ", not --model " + opt.model + "; resume with the same model or start a new run");
  s.threads = opt.threads;
  s.json = opt.json;
  s.no_report = opt.no_report;
  s.pipeline_stages = opt.pipeline_stages;
  s.gpu_mem = opt.gpu_mem;
  s.sim_device = opt.sim_device;
  s.device = opt.device;
  s.dist_timeout = opt.dist_timeout;
  s.resume = opt.resume;
  s.out = run_.string();
  opt = s;
  ckpt_ = latest_checkpoint(run_);
  if (!ckpt_.empty()) state_ = read_json(ckpt_ / "state.json");
}

void RunDir::prepare() const {
  if (resuming_) return;
  ZOF_CHECK(!run_.empty(), "--out is required: the run directory to write");
  ZOF_CHECK(!fs::exists(run_ / "run.json"),
            "--out " + run_.string() + " already holds a run; continue it with --resume " +
                run_.string() + " or choose another --out");
  std::error_code ec;
  fs::create_directories(run_, ec);
  ZOF_CHECK(!ec, "--out " + run_.string() + ": cannot create the directory (" + ec.message() + ")");
  ZOF_CHECK(::access(run_.c_str(), W_OK) == 0,
            "--out " + run_.string() + " is not writable; choose a directory you can write");
}

void RunDir::check_model(const json& model_id, const std::string& model_dir) const {
  if (!resuming_) return;
  ZOF_CHECK(saved_.at("model_id") == model_id,
            "--resume " + run_.string() + ": the model in " + model_dir +
                " is not the one this run started from (config or size differ)");
}

RunCounters RunDir::load_checkpoint(Model& model) const {
  RunCounters c;
  if (ckpt_.empty()) return c;
  Model saved = Model::load(ckpt_.string());
  ZOF_CHECK(saved.storage_size() == model.storage_size(),
            "checkpoint " + ckpt_.string() + " does not match the model's layout");
  std::copy(saved.storage(), saved.storage() + saved.storage_size(), model.storage());
  c.step = state_.at("step");
  c.bad_run = state_.value("bad_run", 0);
  c.eval_before = state_.value("eval_before", json());
  c.tokens = state_.value("tokens", 0.0);
  c.train_s = state_.value("train_s", 0.0);
  c.metrics_bytes = state_.at("metrics_bytes");
  c.log_bytes = state_.at("log_bytes");
  return c;
}

void RunDir::load_optimizer_state(ZOEngine& engine, const Model& model,
                                  const std::string& optimizer) const {
  if (ckpt_.empty() || engine.state_planes() == 0) return;
  const fs::path f = ckpt_ / "optimizer.safetensors";
  ZOF_CHECK(fs::exists(f), "checkpoint " + ckpt_.string() + " has no optimizer.safetensors: it "
            "was not written by a --optimizer " + optimizer + " run");
  auto st = safetensors::Archive::open_file(f.string());
  const int64_t n = model.storage_size();
  std::vector<float> m(n), v(engine.state_planes() == 2 ? n : 0);
  safetensors::to_f32(st.require("m", {n}), m.data());
  if (!v.empty()) safetensors::to_f32(st.require("v", {n}), v.data());
  engine.write_state(m, v);
}

void RunDir::start(const TrainOptions& opt, const json& model_id, const RunCounters& c) {
  if (!resuming_)
    write_file_atomic(run_ / "run.json",
                      json{{"options", opt.to_json()},
                           {"model_id", model_id},
                           {"zof_version", version()}}
                          .dump(1));
  metrics_.open(run_ / "metrics.jsonl", resuming_ ? c.metrics_bytes : 0);
  zlog_.open(run_ / "zo_log.jsonl", resuming_ ? c.log_bytes : 0);
}

void RunDir::save_checkpoint(const RunCounters& c, const Model& model, ZOEngine& engine,
                             const std::string& optimizer) {
  const std::string name = "checkpoint-" + std::to_string(c.step);
  const fs::path tmp = run_ / (name + ".tmp");
  const fs::path dst = run_ / name;
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  model.save(tmp.string(), DType::F32);  // fp32 master weights: exact resume
  // Momentum/Adam state beside the weights (storage layout), for an exact resume.
  if (engine.state_planes() > 0) {
    const int64_t n = model.storage_size();
    std::vector<float> m, v;
    engine.read_state(m, v);
    std::vector<safetensors::TensorOut> t{{"m", DType::F32, {n}, m.data()}};
    if (!v.empty()) t.push_back({"v", DType::F32, {n}, v.data()});
    safetensors::write((tmp / "optimizer.safetensors").string(), t, {{"optimizer", optimizer}});
  }
  // Fault injection for the crash tests: die mid-write, before the checkpoint is complete.
  if (const char* f = std::getenv("ZOF_FAULT_KILL_IN_CHECKPOINT"); f && std::atoll(f) == c.step)
    ::raise(SIGKILL);
  json st{{"step", c.step},         {"bad_run", c.bad_run},          {"eval_before", c.eval_before},
          {"tokens", c.tokens},     {"train_s", c.train_s},
          {"metrics_bytes", metrics_.sync()}, {"log_bytes", zlog_.sync()}};
  write_file_atomic(tmp / "state.json", st.dump(1));
  fsync_path(tmp);
  fs::remove_all(dst);
  fs::rename(tmp, dst);
  fsync_path(run_);
  write_file_atomic(run_ / "latest", name + "\n");
  // Older checkpoints are now redundant.
  for (auto& e : fs::directory_iterator(run_)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("checkpoint-", 0) == 0 && n != name) fs::remove_all(e.path());
  }
}

}  // namespace zof::train
