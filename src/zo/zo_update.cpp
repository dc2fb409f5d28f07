// The ZO engine's updates (zo.h): a step's update made from its projected gradients, held as
// the pending update (joined over a bf16 master's rounding window), and applied by the next walk
// or by flush(); rounding the master weights.
#include "zof/zo.h"

#include "zof/error.h"
#include "zof/streaming.h"

#include "zo/zo_engine.h"

namespace zof {

PendingUpdate ZOEngine::make_update(const ZOStepOptions& opt, uint32_t step, float lr,
                                    const std::vector<double>& g) {
  PendingUpdate u;
  const double q = (double)g.size();
  const bool sgd = opt.optimizer == ZOStepOptions::Optimizer::SGD;
  for (size_t j = 0; j < g.size(); ++j) {
    u.terms.push_back(ZOUpdateTerm{direction_key(opt, step, (uint32_t)j),
                                   (float)((sgd ? lr : 1.0) * g[j] / q)});
  }
  if (sgd) {
    u.lr_wd = lr * opt.weight_decay;
  } else {
    u.lr = lr;
    u.wd = opt.weight_decay;
    u.t = step + 1;
  }
  return u;
}

ZKey ZOEngine::Impl::round_key() const {
  ZOF_ASSERT(!pending_.terms.empty());
  ZKey k;  // the update's own (seed, step), as its z: whoever made it, they travel together
  k.seed = pending_.terms[0].key.seed;
  k.step = pending_.terms[0].key.step;
  return k;
}

void PendingUpdate::join(const PendingUpdate& later) {
  ZOF_ASSERT(lr == 0.f && later.lr == 0.f);  // ZO-SGD's
  terms.insert(terms.end(), later.terms.begin(), later.terms.end());
  lr_wd += later.lr_wd;
}

void ZOEngine::Impl::schedule_update(uint32_t step, float lr, const std::vector<double>& g) {
  add_update(make_update(opt_, step, lr, g));
}

void ZOEngine::Impl::add_update(const PendingUpdate& u) {
  if (pending_.empty()) {
    pending_ = u;
    return;
  }
  // Only a rounding window keeps updates past a walk (or a flush).
  ZOF_ASSERT(opt_.round_every > 1);
  pending_.join(u);
}

void ZOEngine::Impl::flush(bool to_host) {
  hold_ = false;  // a flush closes a rounding window (even after a walk cut short)
  // And the disk tier's write-back window (whose blocks take the pending update with it).
  if (!pending_.empty() && opt_.write_back_every > 1 && disk_ && !stream_)
    wb_window_.push_back(pending_);
  if (!pending_.empty() || !wb_window_.empty()) {
    const auto& blocks = model_.blocks();
    if (disk_) disk_->begin_walk(walk_order(0));
    if (stream_) stream_->begin_walk(walk_order(0));
    for (int b = 0; b < (int)blocks.size(); ++b)
      if (owns_block(b)) {
        acquire(b);
        const bool win = windowed(b);
        if (win)
          window_pass(b, true, nullptr, nullptr, nullptr);
        else
          block_pass(b, true, nullptr, nullptr, nullptr);
        release(b, win ? !wb_window_.empty() : !pending_.empty());
      }
  }
  pending_ = PendingUpdate{};
  wb_window_.clear();
  fwd_.weights_changed();
  if (stream_ && to_host) stream_->sync_to_host();
}

void ZOEngine::Impl::round_weights(DType dtype) {
  if (dtype == DType::F32) return;
  flush();  // the host master is current
  model_.round_to(dtype, disk_.get());  // block by block through a disk tier
  if (stream_) stream_->reload_from_host();
  fwd_.weights_changed();
}

}  // namespace zof
