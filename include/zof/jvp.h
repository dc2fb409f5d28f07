// The forward-gradient estimator (Baydin et al. 2022, "Gradients without backpropagation"): one
// forward pass in forward-mode AD carries beside every activation its tangent along a direction
// z, and ends with the exact directional derivative dL/dtheta . z, with no epsilon. z is SPSA's
// direction (Philox keyed by ZKey), so the estimate g_j = grad . z_j feeds ZOEngine's update.
// The walk over blocks that applies the tangent rules of jvp_ops.h (through the Backend in fp32,
// through the plain loops in float64 for tests and references).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "zof/backend.h"
#include "zof/config.h"

#include "zof/model.h"
#include "zof/philox.h"
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

// The JVP walk: embed -> layers -> head, mirroring Forward, carrying the primal hidden state and
// one tangent per direction. Memory: the forward's activations, one layer's saved intermediates
// and their tangents, one tangent hidden state per direction; z is generated a block at a time
// (the embedding's z per direction stays for the tied LM head), never for the whole model.
// T = float is the trainer's estimator (matrix products through Backend::matmul); T = double
// converts each block's weights to float64 as the walk reaches it (tests, references).
template <class T>
class BasicJVPEstimator {
 public:
  // max_rows: the most tokens (B*T) of one micro-batch. directions: the per-direction buffers
  // allocated up front (a walk with more directions allocates the rest; on a device, allocate
  // everything before the streamer plans its share of the memory).
  BasicJVPEstimator(const Model& model, Backend& backend, int64_t max_rows, int directions = 1);
  ~BasicJVPEstimator();
  BasicJVPEstimator(const BasicJVPEstimator&) = delete;
  BasicJVPEstimator& operator=(const BasicJVPEstimator&) = delete;

  // The summed NLL at theta and its directional derivatives along z(keys[j]), summed over the
  // micro-batches. theta is only read: apply a pending update (ZOEngine::flush) first.
  JVPSums directional_derivatives(const std::vector<ZKey>& keys,
                                  const std::vector<LossBatch>& micro);
  // The summed NLL at theta + shift * z(key), the weights formed in T (no tangents): central
  // differences of the T-precision forward, to check the tangents against.
  JVPSums loss_along(const ZKey& key, double shift, const std::vector<LossBatch>& micro);

  // Every op through the Backend, the tangents through its *_jvp ops (T = float only; the
  // default), or the plain loops of jvp_ops.h (the oracle the Backend path is tested against).
  void set_backend_ops(bool on) { backend_ops_ = on; }
  // fp32: read the weights from a streamer's device blocks (the ZO engine's, when it streams)
  // instead of the Model's storage; null: the storage. Every buffer of the fp32 walk is backend
  // memory, so with a streamer the walk runs on a device backend.
  void set_weights(BlockStreamer* s);

 private:
  struct Impl;
  JVPSums walk(const std::vector<ZKey>& keys, const ZKey* shift_key, double shift,
               const std::vector<LossBatch>& micro);
  std::unique_ptr<Impl> impl_;
  bool backend_ops_ = true;
};

using JVPEstimator = BasicJVPEstimator<float>;

extern template class BasicJVPEstimator<float>;
extern template class BasicJVPEstimator<double>;

}  // namespace zof
