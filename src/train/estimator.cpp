// The two estimators of estimator.h: SPSA through ZOEngine's perturbed walk, JVP through the
// forward-mode walk of jvp.h, both reduced as QueryLosses so the loop treats them alike.
#include "train/estimator.h"

#include "train/tensor_share.h"
#include "zof/backend.h"
#include "zof/error.h"
#include "zo/jvp.h"
#include "zof/model.h"

namespace zof::train {
namespace {

class SpsaEstimator : public Estimator {
 public:
  explicit SpsaEstimator(ZOEngine& engine) : engine_(engine) {}
  QueryLosses sums(uint32_t step, const std::vector<LossBatch>& micro) override {
    return engine_.perturbed_losses(step, micro);
  }
  std::vector<double> gradients(const QueryLosses& all) const override {
    return engine_.projected_gradients(all);
  }
  double loss(const QueryLosses&, double lp, double lm) const override { return 0.5 * (lp + lm); }
  std::string not_finite(double lp, double lm) const override {
    return "loss is not finite (+eps " + std::to_string(lp) + ", -eps " + std::to_string(lm);
  }
  bool perturbed() const override { return true; }

 protected:
  ZOEngine& engine_;
};

// g_j from forward-mode AD instead of two perturbed losses; the engine still schedules and
// applies the updates, so the step log and replay are the same.
class JvpEstimator : public Estimator {
 public:
  JvpEstimator(ZOEngine& engine, const Model& model, Backend& backend, int64_t max_rows,
               int queries, uint64_t seed, DType products)
      : engine_(engine), queries_(queries), seed_(seed) {
    const size_t before = backend.free_memory();
    jvp_ = std::make_unique<JVPEstimator>(model, backend, max_rows, queries, products);
    const size_t after = backend.free_memory();
    engine.add_buffer_bytes(before > after ? before - after : 0);  // in the streaming budget
  }
  QueryLosses sums(uint32_t step, const std::vector<LossBatch>& micro) override {
    // The walk reads theta: the previous step's update goes in first (on the device, when
    // streaming: the JVP walk reads the streamer's blocks, not the host copy).
    engine_.flush(/*to_host=*/false);
    std::vector<ZKey> keys;
    for (int j = 0; j < queries_; ++j) keys.push_back(ZKey{seed_, step, (uint32_t)j});
    const JVPSums js = jvp_->directional_derivatives(keys, micro);
    // The + slots carry the directional derivatives, the - slots the loss at theta (the same
    // number in each).
    QueryLosses ql;
    ql.sum_plus = js.sum_dir;
    ql.sum_minus.assign(queries_, js.sum_loss);
    ql.count = js.count;
    return ql;
  }
  std::vector<double> gradients(const QueryLosses& all) const override {
    return JVPSums{all.sum_minus[0], all.sum_plus, all.count}.gradients();
  }
  double loss(const QueryLosses& all, double, double) const override {
    return all.sum_minus[0] / all.count;  // at theta
  }
  std::string not_finite(double lp, double lm) const override {
    return "loss or directional derivative is not finite (loss " + std::to_string(lm) +
           ", mean derivative " + std::to_string(lp);
  }
  bool perturbed() const override { return false; }
  void use_streamer(BlockStreamer* s) override { jvp_->set_weights(s); }

 private:
  ZOEngine& engine_;
  const int queries_;
  const uint64_t seed_;
  std::unique_ptr<JVPEstimator> jvp_;
};

// SPSA on a tensor-parallel slice: the engine applies the pending update to the slice (z at
// each element's global index), then each direction's two copies of the slice, at theta +/- eps
// z_j as a single process's walk makes them, run through the tensor-parallel forward. Every rank
// of a tensor group gets the same sums (the forward's reductions are in rank order).
class TensorEstimator : public SpsaEstimator {
 public:
  TensorEstimator(ZOEngine& engine, TensorShare& share, Backend& backend, int64_t max_rows)
      : SpsaEstimator(engine),
        share_(share),
        be_(backend),
        max_rows_(max_rows),
        work_(Model::zeros(share.plan().local)),
        fwd_(work_, share.plan(), backend, share.group(), max_rows) {
    share.wire(fwd_);  // this rank's pipeline stage (all of the model without stages)
  }
  QueryLosses sums(uint32_t step, const std::vector<LossBatch>& micro) override {
    check_loss_batches(micro, share_.config(), max_rows_, "the tensor-parallel walk");
    engine_.flush(/*to_host=*/false);  // the previous step's update, into the slice
    const ZOStepOptions& o = engine_.options();
    QueryLosses ql;
    ql.sum_plus.assign((size_t)o.queries, 0.0);
    ql.sum_minus.assign((size_t)o.queries, 0.0);
    for (const auto& lb : micro) ql.count += lb.units();
    std::vector<float> nll;
    std::vector<double> row;
    for (int j = 0; j < o.queries; ++j) {
      const ZKey key = direction_key(o, step, (uint32_t)j);
      for (int sign : {1, -1}) {
        tp::perturbed_copy(share_.plan(), be_, share_.local(), key, o.eps, sign, work_.storage(),
                           &share_.stage_params());
        double& sum = sign > 0 ? ql.sum_plus[(size_t)j] : ql.sum_minus[(size_t)j];
        for (const auto& lb : micro) {
          nll.resize((size_t)lb.scored());
          fwd_.nll_at(lb.batch, lb.score_rows.data(), lb.score_targets.data(), lb.scored(),
                      nll.data());
          row.assign(nll.begin(), nll.end());
          sum += loss_sum(lb, row.data());
        }
      }
    }
    return ql;
  }
  uint64_t exchanged_bytes() const override { return fwd_.bytes_exchanged(); }

 private:
  TensorShare& share_;
  Backend& be_;
  const int64_t max_rows_;
  Model work_;  // the slice at theta +/- eps z_j, one stream at a time
  tp::TensorForward fwd_;
};

}  // namespace

std::unique_ptr<Estimator> make_tensor_estimator(ZOEngine& engine, TensorShare& share,
                                                 Backend& backend, int64_t max_rows) {
  return std::make_unique<TensorEstimator>(engine, share, backend, max_rows);
}

std::unique_ptr<Estimator> make_estimator(const TrainOptions& opt, ZOEngine& engine,
                                          const Model& model, Backend& backend, int64_t max_rows) {
  // opt.dtype is resolved by now (auto: what this machine computes fast).
  ZOF_ASSERT(opt.dtype == ComputeChoice::Fp32 || opt.dtype == ComputeChoice::Bf16);
  // The JVP walk draws dense tangents; the engine would apply a low-rank update of its g.
  ZOF_ASSERT(opt.estimator != EstimatorChoice::Jvp || opt.low_rank == 0);
  if (opt.estimator == EstimatorChoice::Jvp)
    return std::make_unique<JvpEstimator>(engine, model, backend, max_rows, opt.queries, opt.seed,
                                          opt.dtype == ComputeChoice::Bf16 ? DType::BF16
                                                                           : DType::F32);
  return std::make_unique<SpsaEstimator>(engine);
}

}  // namespace zof::train
