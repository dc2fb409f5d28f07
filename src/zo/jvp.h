// The forward-gradient estimator (Baydin et al. 2022, "Gradients without backpropagation"): one
// forward pass in forward-mode AD carries beside every activation its tangent along a direction
// z, and ends with the exact directional derivative dL/dtheta . z, with no epsilon. z is SPSA's
// direction (Philox keyed by ZKey), so the estimate g_j = grad . z_j feeds ZOEngine's update.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "zof/backend.h"
#include "zof/config.h"

#include "zof/model.h"
#include "zof/zo.h"

namespace zof {

// Sums over micro-batches, kept as sums so that data-parallel ranks can add them (as QueryLosses).
struct JVPSums {
  double sum_loss = 0;          // summed NLL at theta
  std::vector<double> sum_dir;  // (q) directional derivative of the summed NLL along z_j
  double count = 0;             // scored tokens
  // g_j = sum_dir[j] / count: the derivative of the mean NLL along z_j, which is what SPSA's
  // projected gradient estimates (without its O(eps^2) bias). zof::Error when nothing is scored.
  std::vector<double> gradients() const;
};

// The JVP walk: embed -> layers -> head, the block graphs Forward runs (src/model/block_graph.h)
// carrying the primal hidden state and one tangent per direction. Memory: the forward's
// activations, one layer's saved values and their tangents, one tangent hidden state per
// direction; z is generated a block at a time (the embedding's z per direction stays for the
// tied LM head), never for the whole model. fp32 through the Backend (its *_jvp ops), or with
// bf16 matrix products (a bf16 run's, --dtype bf16): each product of the primal and of the
// tangent reads its weight and its z rounded to bf16 and accumulates in fp32; attention, norms
// and every sum stay fp32. The tests run the same walk over plain float64 loops as the oracle
// (src/zo/jvp_walk.h).
template <class K>
class JVPWalk;
namespace graph {
struct JvpBackendKernels;
}

class JVPEstimator {
 public:
  // max_rows: the most tokens (Batch::rows) of one micro-batch. directions: the per-direction buffers
  // allocated up front (a walk with more directions allocates the rest; on a device, allocate
  // everything before the streamer plans its share of the memory). products: F32 or BF16, the
  // matrix products' precision (bf16 adds two scratch copies of the largest tensor, 2 bytes an
  // element).
  JVPEstimator(const Model& model, Backend& backend, int64_t max_rows, int directions = 1,
               DType products = DType::F32);
  ~JVPEstimator();
  JVPEstimator(const JVPEstimator&) = delete;
  JVPEstimator& operator=(const JVPEstimator&) = delete;

  // The summed NLL at theta and its directional derivatives along z(keys[j]), summed over the
  // micro-batches. theta is only read: apply a pending update (ZOEngine::flush) first.
  JVPSums directional_derivatives(const std::vector<ZKey>& keys,
                                  const std::vector<LossBatch>& micro);
  // The summed NLL at theta + shift * z(key) (no tangents), host backends only: central
  // differences of the forward, to check the tangents against.
  JVPSums loss_along(const ZKey& key, double shift, const std::vector<LossBatch>& micro);
  // Read the weights from a streamer's device blocks (the ZO engine's, when it streams) instead
  // of the Model's storage; null: the storage. Every buffer of the walk is backend memory, so
  // with a streamer the walk runs on a device backend.
  void set_weights(BlockStreamer* s);

 private:
  std::unique_ptr<JVPWalk<graph::JvpBackendKernels>> walk_;
};

}  // namespace zof
