// Forward-mode AD of the transformer forward (see jvp.h): the fp32 walk of jvp_walk.h through
// the Backend.
#include "zof/jvp.h"

#include "zo/jvp_walk.h"

namespace zof {

std::vector<double> JVPSums::gradients() const {
  ZOF_CHECK(count > 0, "the batch has no scored tokens (every target is masked)");
  std::vector<double> g(sum_dir.size());
  for (size_t j = 0; j < g.size(); ++j) g[j] = sum_dir[j] / count;
  return g;
}

JVPEstimator::JVPEstimator(const Model& model, Backend& backend, int64_t max_rows, int directions)
    : walk_(std::make_unique<JVPWalk<graph::JvpBackendKernels>>(
          model, backend, max_rows, directions, graph::JvpBackendKernels{{backend}})) {}

JVPEstimator::~JVPEstimator() = default;

JVPSums JVPEstimator::directional_derivatives(const std::vector<ZKey>& keys,
                                              const std::vector<LossBatch>& micro) {
  return walk_->directional_derivatives(keys, micro);
}

JVPSums JVPEstimator::loss_along(const ZKey& key, double shift,
                                 const std::vector<LossBatch>& micro) {
  return walk_->loss_along(key, shift, micro);
}

void JVPEstimator::set_weights(BlockStreamer* s) { walk_->set_weights(s); }

}  // namespace zof
