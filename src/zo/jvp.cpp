// Forward-mode AD of the transformer forward (see jvp.h): the float walk of jvp_walk.h through
// the Backend, its matrix products fp32 or bf16.
#include "zo/jvp.h"

#include "zof/error.h"

#include "zo/jvp_walk.h"

namespace zof {

std::vector<double> JVPSums::gradients() const {
  ZOF_CHECK(count > 0, "the batch has no scored tokens (every target is masked)");
  std::vector<double> g(sum_dir.size());
  for (size_t j = 0; j < g.size(); ++j) g[j] = sum_dir[j] / count;
  return g;
}

namespace {
// The tangent walk reads fp32 weights (the trainer holds a bf16 master in fp32 storage for it).
const Model& fp32_held(const Model& m) {
  ZOF_CHECK(m.storage_dtype() == DType::F32,
            "the JVP estimator reads weights held in fp32: hold a bf16 master in fp32 storage "
            "for it (Model::set_storage_dtype), as zof finetune does");
  return m;
}

graph::JvpBackendKernels kernels(Backend& backend, DType products) {
  ZOF_CHECK(products == DType::F32 || products == DType::BF16,
            std::string("the JVP estimator's matrix products are fp32 or bf16, not ") +
                dtype_name(products));
  return graph::JvpBackendKernels(backend, products);
}
}  // namespace

JVPEstimator::JVPEstimator(const Model& model, Backend& backend, int64_t max_rows, int directions,
                           DType products)
    : walk_(std::make_unique<JVPWalk<graph::JvpBackendKernels>>(
          fp32_held(model), backend, max_rows, directions, kernels(backend, products))) {}

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
