// Evaluation during a run (evaluation.h).
#include "train/evaluation.h"

#include <cstdio>

#include "train/clock.h"
#include "train/job.h"
#include "train/run_dir.h"

using json = nlohmann::json;

namespace zof::train {
json Evaluator::evaluate(int64_t step, const char* when) {
  job_.gather_weights(engine_, model_);
  if (!job_.root) return json{{"metric", ""}, {"value", 0.0}};
  const double t0 = now_s();
  auto m = data_.evaluate(engine_.forward());
  json j{{"type", "eval"}, {"step", step}, {"metric", m.name}, {"value", m.value},
         {"when", when}, {"eval_s", now_s() - t0}};
  metrics_->write(j);
  char b[160];
  std::snprintf(b, sizeof b, "eval @ step %lld: %s %.4f", (long long)step, m.name.c_str(), m.value);
  sink_->message(b);
  return j;
}

}  // namespace zof::train
