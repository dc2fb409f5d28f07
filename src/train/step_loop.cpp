// The step loop (step_loop.h). A step is a pure function of (seed, step) and the weights, so
// a resumed run, any thread count and any number of ranks take the same steps bit for bit.
#include "train/step_loop.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <csignal>
#include <cstdlib>
#include <filesystem>

#include "train/clock.h"
#include "train/estimator.h"
#include "train/evaluation.h"
#include "train/job.h"
#include "zof/error.h"
#include "zof/model.h"

using json = nlohmann::json;

namespace zof::train {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// Test hooks for the failure tests: ZOF_FAULT_KILL_AT_STEP / ZOF_FAULT_TERM_AT_STEP /
// ZOF_FAULT_HANG_AT_STEP = step make rank ZOF_FAULT_RANK (every rank when unset) die by SIGKILL,
// receive SIGTERM, or stop answering at the start of that step.
void inject_step_fault(int rank, int64_t step) {
  const char* r = std::getenv("ZOF_FAULT_RANK");
  if (r && std::atoi(r) != rank) return;
  if (const char* k = std::getenv("ZOF_FAULT_KILL_AT_STEP"); k && std::atoll(k) == step)
    ::raise(SIGKILL);
  if (const char* t = std::getenv("ZOF_FAULT_TERM_AT_STEP"); t && std::atoll(t) == step)
    ::raise(SIGTERM);
  if (const char* h = std::getenv("ZOF_FAULT_HANG_AT_STEP"); h && std::atoll(h) == step)
    for (;;) ::pause();
}

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

// One step's numbers, reduced over the job.
struct StepLoop::Outcome {
  float lr = 0;
  QueryLosses ql;
  double tokens = 0;       // real (unpadded) tokens of the step, every replica's
  double lp = 0, lm = 0;   // mean over directions of the + and - slots
  double loss = 0;
  std::vector<double> g;   // empty when skipped
  bool finite = false, stop = false;
  double dt = 0;
};

StepLoop::StepLoop(const TrainOptions& opt, Job& job, RunDir& dir, ZOEngine& engine,
                   Model& model, Estimator& estimator, TrainData& data, Evaluator& eval,
                   TrainSink& sink, RunCounters& c)
    : opt_(opt), job_(job), dir_(dir), engine_(engine), model_(model), est_(estimator),
      data_(data), eval_(eval), sink_(sink), c_(c), start_(c.step) {}

double StepLoop::recent_loss() const {
  double avg = 0;
  for (double x : recent_) avg += x;
  return recent_.empty() ? NAN : avg / recent_.size();
}

void StepLoop::save_checkpoint(int64_t step) {
  // Inside a bf16 master's rounding window (a stop between its ends): the window stays open.
  // The checkpoint holds the master from before the window and names the window's first step;
  // a resumed run takes the window's updates from the step log and rounds where an
  // uninterrupted run does.
  int64_t from = step;
  while (from > 0 && !window_closes_after(opt_, from - 1)) --from;
  const bool open = from < step;
  if (open)
    engine_.sync_to_host();  // the master as the last window's end left it
  else
    job_.gather_weights(engine_, model_);
  // Momentum/Adam state beside the weights (gathered from the slices under tensor parallel),
  // or, where the checkpoint keeps its disk blocks in the store, read a block at a time.
  std::vector<float> m, v;
  CheckpointState state{engine_.state_planes(), opt_.optimizer, &m, &v, nullptr};
  if (state.planes > 0 && RunDir::writes_store(engine_.host_blocks()))
    state.block = [this](int b, const std::function<void(int, float*, float*)>& fn) {
      engine_.read_state_blocks({b}, fn);
    };
  else if (state.planes > 0)
    job_.gather_state(engine_, m, v);
  run_checkpoint_on_root(job_, [&] {
    RunCounters at = c_;
    at.step = step;
    at.window_from = open ? from : -1;
    try {
      dir_.save_checkpoint(at, model_, state, engine_.host_blocks());
    } catch (const std::filesystem::filesystem_error& e) {
      // Directory operations (create, rename, remove) in the run's words, on one line.
      const std::string run = dir_.path().string();
      throw Error("cannot write checkpoint-" + std::to_string(step) + " in " + run + ": " +
                  e.code().message() + " (" + e.path1().string() + "); the run stopped at step " +
                  std::to_string(step) + " and its earlier checkpoints are kept: make " + run +
                  " writable (or free space) and continue with --resume " + run);
    }
  });
}

LoopEnd StepLoop::run() {
  if (c_.eval_before.is_null()) c_.eval_before = eval_.evaluate(start_, "before");
  last_eval_ = c_.eval_before;
  t_step0_ = now_s();
  LoopEnd end;
  int64_t step = start_;
  for (; step < opt_.steps; ++step) {
    inject_step_fault(job_.rank, step);
    const Outcome s = estimate(step);
    const json rec = record(step, s);
    check_bad_run(step);
    const bool evaluated =
        opt_.eval_every > 0 && (step + 1) % opt_.eval_every == 0 && step + 1 < opt_.steps;
    if (evaluated) {
      last_eval_ = eval_.evaluate(step + 1, "during");
      hint_if_stalled();
    }
    if (job_.root) report(step, rec, evaluated);
    if (s.stop) {
      end.interrupted = true;
      ++step;
      break;
    }
    if (opt_.save_every > 0 && (step + 1) % opt_.save_every == 0 && step + 1 < opt_.steps)
      save_checkpoint(step + 1);
  }
  end.step = step;
  end.signal = g_stop_signal;
  end.sink_stop = sink_stop_;
  end.step_bytes = step_bytes_;
  end.tensor_bytes = tensor_bytes_;
  return end;
}

StepLoop::Outcome StepLoop::estimate(int64_t step) {
  Outcome s;
  const double t0 = now_s();
  const uint64_t bytes0 = job_.comm.bytes_sent(), tensor0 = est_.exchanged_bytes();
  s.lr = learning_rate(opt_, step);
  std::vector<LossBatch> micro = data_.batch((uint64_t)step, job_.replica, job_.layout.replicas);
  for (auto& mb : micro)
    for (auto l : mb.batch.lengths) s.tokens += l;
  s.ql = est_.sums((uint32_t)step, micro);
  s.stop = job_.reduce_step(opt_.queries, s.ql, s.tokens, g_stop_signal || sink_stop_);
  step_bytes_ += job_.comm.bytes_sent() - bytes0;
  tensor_bytes_ += est_.exchanged_bytes() - tensor0;
  s.finite = s.ql.count > 0;
  for (int j = 0; j < opt_.queries; ++j) {
    s.lp += s.ql.sum_plus[j] / s.ql.count / opt_.queries;
    s.lm += s.ql.sum_minus[j] / s.ql.count / opt_.queries;
    s.finite = s.finite && std::isfinite(s.ql.sum_plus[j]) && std::isfinite(s.ql.sum_minus[j]);
  }
  if (s.finite) {
    s.g = est_.gradients(s.ql);
    engine_.schedule_update((uint32_t)step, s.lr, s.g);
    c_.bad_run = 0;
  } else {
    ++c_.bad_run;
    if (job_.root)
      sink_.message("step " + std::to_string(step) + ": " + est_.not_finite(s.lp, s.lm) +
                    "); update skipped");
  }
  s.dt = now_s() - t0;
  s.loss = est_.loss(s.ql, s.lp, s.lm);
  return s;
}

// The step log (what replay needs), the metrics record, and the recent losses.
json StepLoop::record(int64_t step, const Outcome& s) {
  c_.tokens += s.tokens;
  c_.train_s += s.dt;
  if (job_.root)
    dir_.zo_log().write(json{{"step", step}, {"seed", opt_.seed}, {"lr", s.lr}, {"g", s.g},
                             {"wd", opt_.weight_decay}, {"skipped", !s.finite}});
  json rec{{"type", "step"}, {"step", step}, {"loss", s.finite ? json(s.loss) : json()},
           {"loss_plus", s.finite ? json(s.lp) : json()},
           {"loss_minus", s.finite ? json(s.lm) : json()}, {"g", s.g}, {"lr", s.lr},
           {"tokens", s.tokens}, {"step_s", s.dt},
           {"tokens_per_s", s.tokens / std::max(s.dt, 1e-9)}};
  if (!est_.perturbed()) {  // no perturbed losses: "loss" is the loss at theta
    rec.erase("loss_plus");
    rec.erase("loss_minus");
  }
  if (job_.root) dir_.metrics().write(rec);
  if (s.finite) {
    recent_.push_back(s.loss);
    if (recent_.size() > 50) recent_.erase(recent_.begin());
  }
  return rec;
}

// No checkpoint after too many non-finite steps: the weights that gave these losses are the
// problem. The latest checkpoint (if any) still holds weights from before it, and --resume
// starts there.
void StepLoop::check_bad_run(int64_t step) {
  if (c_.bad_run < opt_.max_bad_steps) return;
  job_.comm.barrier();
  const fs::path last = latest_checkpoint(dir_.path());
  throw Error("the loss was not finite for " + std::to_string(c_.bad_run) +
              " steps in a row (step " + std::to_string(step) + "); lower --lr or --eps." +
              (last.empty() ? std::string(" No checkpoint was saved before it.")
                            : " The latest checkpoint before it is " + last.string()));
}

// An evaluation record's value; NaN for a non-finite one read back from a checkpoint (JSON
// writes it as null).
static double metric_value(const json& e) {
  const json& v = e["value"];
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// After the second evaluation during the steps, once: a held-out metric that has not moved
// (within 0.1%) from the one before the first step, with a learning rate below 1e-4, is most
// often MeZO's 1e-6/1e-7 (chosen for 13B-class models) given to a small model.
void StepLoop::hint_if_stalled() {
  if (!job_.root || ++evals_during_ != 2 || opt_.lr >= 1e-4f) return;
  const double before = metric_value(c_.eval_before), now = metric_value(last_eval_);
  if (!std::isfinite(before) || !std::isfinite(now) ||
      std::fabs(now - before) > 1e-3 * std::max(std::fabs(before), 1e-12))
    return;
  char b[400];
  std::snprintf(b, sizeof b,
                "hint: the held-out %s has not moved in two evaluations (%.4g before the first "
                "step, %.4g now): --lr %g may be too small for this model. MeZO's 1e-6 and 1e-7 "
                "are for 13B-class models; small ones need larger steps (stories260K: 1e-4)",
                last_eval_["metric"].get<std::string>().c_str(), before, now, (double)opt_.lr);
  sink_.message(b);
}

void StepLoop::report(int64_t step, const json& rec, bool evaluated) {
  StepReport r;
  r.step = step + 1;
  r.steps = opt_.steps;
  r.first_step = start_;
  r.evaluated = evaluated;
  r.recent_loss = recent_loss();
  r.metric = last_eval_["metric"].get<std::string>();
  r.metric_value = metric_value(last_eval_);
  r.tokens_per_s = c_.tokens / std::max(c_.train_s, 1e-9);
  r.elapsed_s = now_s() - t_step0_;
  r.record = &rec;
  if (sink_.on_step(r)) sink_stop_ = true;
}

}  // namespace zof::train
