// The estimator the step loop calls: this rank's sums for a step, which reduce over the replicas
// alike, and the projected gradients from the reduced sums. Two implementations: SPSA (two
// perturbed losses per direction, through ZOEngine) and JVP (forward-mode directional
// derivatives, through JVPEstimator); the engine schedules and applies the updates for both.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zof/trainer.h"
#include "zof/zo.h"

namespace zof {
class Backend;
class BlockStreamer;
}  // namespace zof

namespace zof::train {

class Estimator {
 public:
  virtual ~Estimator() = default;
  // This rank's sums over its micro-batches of the step: SPSA's losses at theta +/- eps z_j, or
  // JVP's directional derivatives in the + slots and the loss at theta in every - slot.
  virtual QueryLosses sums(uint32_t step, const std::vector<LossBatch>& micro) = 0;
  // g_j from the sums of every replica (all finite).
  virtual std::vector<double> gradients(const QueryLosses& all) const = 0;
  // The step's training loss from the reduced sums and the means over directions of the +
  // and - slots.
  virtual double loss(const QueryLosses& all, double mean_plus, double mean_minus) const = 0;
  // What was not finite, for "step N: ...; update skipped".
  virtual std::string not_finite(double mean_plus, double mean_minus) const = 0;
  // Whether the step's record carries loss_plus and loss_minus (perturbed losses).
  virtual bool perturbed() const = 0;
  // The weights now stream through the engine's device blocks: read them there.
  virtual void use_streamer(BlockStreamer* s) {}
  // Bytes this rank has handed its tensor group so far (tp::TensorForward::bytes_exchanged; 0
  // without tensor parallel).
  virtual uint64_t exchanged_bytes() const { return 0; }
};

// --estimator spsa or jvp for the engine (whose buffers count the JVP walk's in the streaming
// budget).
class TensorShare;
// SPSA on this rank's slice of a tensor-parallel run (--tensor-parallel T): the engine (over
// share.local(), with its element runs) applies the updates.
std::unique_ptr<Estimator> make_tensor_estimator(ZOEngine& engine, TensorShare& share,
                                                 Backend& backend, int64_t max_rows);

std::unique_ptr<Estimator> make_estimator(const TrainOptions& opt, ZOEngine& engine,
                                          const Model& model, Backend& backend, int64_t max_rows);

}  // namespace zof::train
