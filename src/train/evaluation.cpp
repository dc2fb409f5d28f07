// Evaluation during a run (evaluation.h).
#include "train/evaluation.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "train/clock.h"
#include "train/job.h"
#include "train/run_dir.h"
#include "zof/dist.h"

using json = nlohmann::json;

namespace zof::train {
namespace {

// Test hook for the watchdog tests: ZOF_FAULT_SLOW_ROOT_S = seconds rank 0 sleeps in each
// evaluation and checkpoint (its lone work), as a large model's would take.
void inject_slow_root_work() {
  if (const char* s = std::getenv("ZOF_FAULT_SLOW_ROOT_S"))
    std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(s)));
}

}  // namespace

json Evaluator::evaluate(int64_t step, const char* when) {
  job_.gather_weights(engine_, model_);
  json j{{"metric", ""}, {"value", 0.0}};  // what the other ranks get
  // Rank 0 alone, while the others wait for it under the watchdog (Communicator::run_on_root).
  job_.comm.run_on_root("evaluation", [&] {
    inject_slow_root_work();
    const double t0 = now_s();
    auto m = data_.evaluate(job_.eval_forward(engine_));
    j = json{{"type", "eval"}, {"step", step}, {"metric", m.name}, {"value", m.value},
             {"when", when}, {"eval_s", now_s() - t0}};
    metrics_->write(j);
    char b[160];
    std::snprintf(b, sizeof b, "eval @ step %lld: %s %.4f", (long long)step, m.name.c_str(),
                  m.value);
    sink_->message(b);
  });
  return j;
}

void run_checkpoint_on_root(Job& job, const std::function<void()>& save) {
  job.comm.run_on_root("checkpoint", [&] {
    inject_slow_root_work();
    save();
  });
}

}  // namespace zof::train
