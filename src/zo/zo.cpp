// The ZO step as a walk over blocks with both perturbed hidden states (see zo.h). This file
// holds ZOEngine's public calls (each forwards to its Impl, src/zo/zo_engine.h), the engine's
// construction and buffers, its pipeline stage, parameter streaming and the evaluation loss.
// The walk is in zo_walk.cpp, the optimizer state in zo_state.cpp, the updates in
// zo_update.cpp; the loss of a batch in src/model/loss.cpp.
#include "zof/zo.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "zof/error.h"
#include "zof/streaming.h"

#include "zo/zo_engine.h"

namespace zof {

// ---- ZOEngine: the interface, over its Impl -------------------------------------------------

ZOEngine::ZOEngine(Model& model, Backend& backend, int64_t max_rows, ZOStepOptions opt)
    : impl_(std::make_unique<Impl>(model, backend, max_rows, opt)) {}
ZOEngine::~ZOEngine() = default;

QueryLosses ZOEngine::perturbed_losses(uint32_t step, const std::vector<LossBatch>& micro) {
  return impl_->perturbed_losses(step, micro);
}
void ZOEngine::set_stage(int first, int last, StageIO io) {
  impl_->set_stage(first, last, std::move(io));
}
bool ZOEngine::owns_block(int b) const { return impl_->owns_block(b); }
std::vector<double> ZOEngine::projected_gradients(const QueryLosses& l) const {
  return impl_->projected_gradients(l);
}
void ZOEngine::schedule_update(uint32_t step, float lr, const std::vector<double>& g) {
  impl_->schedule_update(step, lr, g);
}
void ZOEngine::add_update(const PendingUpdate& u) { impl_->add_update(u); }
void ZOEngine::flush(bool to_host) { impl_->flush(to_host); }
void ZOEngine::sync_to_host() { impl_->sync_to_host(); }
const PendingUpdate& ZOEngine::pending() const { return impl_->pending_; }
void ZOEngine::set_pending(PendingUpdate p) { impl_->pending_ = std::move(p); }
double ZOEngine::loss(const std::vector<LossBatch>& micro) { return impl_->loss(micro); }
Forward& ZOEngine::forward() { return impl_->fwd_; }
const ZOStepOptions& ZOEngine::options() const { return impl_->opt_; }
void ZOEngine::enable_streaming(size_t gpu_mem) { impl_->enable_streaming(gpu_mem); }
BlockStreamer* ZOEngine::streamer() { return impl_->stream_.get(); }
void ZOEngine::enable_disk_tier(uint64_t host_mem, const std::string& dir, int io_threads,
                                bool unwritten, const DiskStore* store) {
  impl_->enable_disk_tier(host_mem, dir, io_threads, unwritten, store);
}
DiskTier* ZOEngine::disk_tier() { return impl_->disk_.get(); }
BlockAccess* ZOEngine::host_blocks() { return impl_->disk_.get(); }
void ZOEngine::set_sparsity_from_weights() { impl_->sparsity_thresholds(); }
void ZOEngine::disable_disk_tier(bool keep_weights) {
  if (impl_->stream_) {
    try {
      impl_->stream_->sync_to_host();
    } catch (...) {
      if (keep_weights) throw;  // the weights are dropped anyway: the tier still goes
    }
  }
  impl_->drop_disk_tier(keep_weights);
}
uint64_t ZOEngine::disk_tier_minimum() const {
  return DiskTier::min_bytes(impl_->model_, 1 + impl_->state_planes(), impl_->disk_keep());
}
DiskTierPlan ZOEngine::disk_tier_plan(uint64_t host_mem) const {
  impl_->check_disk_budget(host_mem);
  return DiskTier::plan(impl_->model_, 1 + impl_->state_planes(), host_mem, impl_->disk_keep(),
                        /*writes_back=*/true);
}
size_t ZOEngine::buffer_bytes() const { return impl_->buffer_bytes_; }
void ZOEngine::add_buffer_bytes(size_t bytes) { impl_->buffer_bytes_ += bytes; }
void ZOEngine::round_weights(DType dtype) { impl_->round_weights(dtype); }
size_t ZOEngine::streaming_minimum() const { return impl_->streaming_minimum(); }
size_t ZOEngine::streaming_buffers() const { return impl_->streaming_buffers(); }
int ZOEngine::state_planes() const { return impl_->state_planes(); }
void ZOEngine::read_state(std::vector<float>& m, std::vector<float>& v) { impl_->read_state(m, v); }
void ZOEngine::write_state(const std::vector<float>& m, const std::vector<float>& v) {
  impl_->write_state(m, v);
}
void ZOEngine::read_state_blocks(const std::vector<int>& blocks, const StateFn& fn) {
  impl_->read_state_blocks(blocks, fn);
}
void ZOEngine::write_state_blocks(const std::vector<int>& blocks, const StateFn& fn) {
  impl_->write_state_blocks(blocks, fn);
}
const std::vector<float>& ZOEngine::masks() const { return impl_->mask_; }
void ZOEngine::set_tensor_slice(const tp::Plan& plan) {
  Impl& i = *impl_;
  const int np = (int)i.model_.params().size();
  ZOF_ASSERT((int)plan.params.size() == np && !i.opt_.perturb && !i.stream_ && !i.disk_ &&
             i.opt_.master == DType::F32 && i.model_.storage_dtype() == DType::F32 &&
             i.opt_.sparsity == 0.f);
  i.element_runs_.clear();
  i.slice_ = &plan;
  for (int pi = 0; pi < np; ++pi) {
    i.element_runs_.push_back(tp::element_runs(plan, pi));
    int64_t n = 0;
    for (const tp::ElementRun& r : i.element_runs_.back()) n += r.n;
    ZOF_ASSERT(n == i.model_.params()[pi].numel);
  }
}

// ---- the engine ----------------------------------------------------------------------------

ZOEngine::Impl::Impl(Model& model, Backend& backend, int64_t max_rows, ZOStepOptions opt)
          : model_(model),
            be_(backend),
            free0_(backend.free_memory()),
            fwd_(model, backend, max_rows),
            opt_(opt),
            max_rows_(max_rows) {
  // A constructor that throws gets no destructor: whatever was allocated before the failure (a
  // device budget running out part way, a bad option) is given back here.
  try {
    ZOF_CHECK(opt.queries >= 1, "--queries must be at least 1");
    ZOF_CHECK(opt.eps > 0 && std::isfinite(opt.eps), "--eps must be a positive number");
    ZOF_CHECK(opt.sparsity >= 0.f && opt.sparsity < 1.f,
              "--sparsity must be in [0, 1): the fraction of each weight matrix left unperturbed");
    fwd_.set_compute(opt.compute);
    ZOF_CHECK(opt.master == DType::F32 || opt.master == DType::BF16,
              std::string("the master weights are fp32 or bf16, not ") + dtype_name(opt.master));
    // A bf16 master starts as the model rounded to nearest (a bf16 checkpoint: unchanged);
    // held in bf16 storage it is that already. A model held in bf16 is a bf16 master: an fp32
    // master's updates would be lost in it.
    ZOF_CHECK(model_.storage_dtype() == DType::F32 || opt.master == DType::BF16,
              "a model held in bf16 trains only as a bf16 master (--master bf16)");
    ZOF_CHECK(opt.round_every >= 1, "--round-every must be at least 1");
    ZOF_CHECK(opt.round_every == 1 || opt.master == DType::BF16,
              "--round-every rounds a bf16 master once every N steps: it needs --master bf16");
    ZOF_CHECK(opt.round_every == 1 || opt.optimizer == ZOStepOptions::Optimizer::SGD,
              "--round-every sums ZO-SGD's updates; momentum and Adam update through their "
              "state every step: use --round-every 1 with them");
    ZOF_CHECK(opt.write_back_every >= 1, "--write-back-every must be at least 1");
    ZOF_CHECK(opt.write_back_every == 1 || opt.optimizer == ZOStepOptions::Optimizer::SGD,
              "--write-back-every rebuilds a disk block from ZO-SGD's updates; momentum and Adam "
              "update through their state: use --write-back-every 1 with them");
    ZOF_CHECK(opt.write_back_every == 1 || opt.round_every == 1,
              "--write-back-every does not combine with a bf16 master's --round-every window (a "
              "disk block is written once a window already): use one of them");
    if (opt.master == DType::BF16) model_.round_to(DType::BF16);
    const auto& params = model_.params();
    const auto& cfg = model_.config();
    tok_ = model_.token_table();
    lm_ = model_.lm_head();
    ZOF_ASSERT(tok_ >= 0 && lm_ >= 0);
    // Block copies hold every parameter but the two big tables, each in its copy's type (a
    // bf16 walk's matrices in 2 bytes), 64-byte aligned.
    copy_off_.assign(params.size(), -1);
    int64_t copy_bytes = 64;
    for (const Block& blk : model_.blocks()) {
      int64_t off = 0;
      for (int pi : blk.params) {
        if (pi == tok_ || pi == lm_) continue;
        copy_off_[pi] = off;
        off += (params[pi].numel * (int64_t)dtype_size(copy_dtype(pi)) + 63) / 64 * 64;
      }
      copy_bytes = std::max(copy_bytes, off);
    }
    const int64_t Et = params[tok_].shape[1], El = params[lm_].shape[1], V = cfg.vocab_size;
    // A chunk of about 4 MB of the LM head, a multiple of 64 rows (the GEMM's N).
    vocab_chunk_ = opt.vocab_chunk > 0 ? std::min(V, opt.vocab_chunk)
                   : std::min<int64_t>(V, std::max<int64_t>(64, ((1 << 20) / El) / 64 * 64));
    auto alloc = [&](int64_t n) { return (float*)be_.alloc(std::max<int64_t>(n, 1) * sizeof(float)); };
    if (opt.perturb) {  // the perturbed walk's buffers
      blk_plus_ = alloc(copy_bytes / (int64_t)sizeof(float));
      blk_minus_ = alloc(copy_bytes / (int64_t)sizeof(float));
      tok_plus_ = alloc(max_rows * Et);
      tok_minus_ = alloc(max_rows * Et);
      w_plus_ = alloc(vocab_chunk_ * El);
      w_minus_ = alloc(vocab_chunk_ * El);
      logit_plus_ = alloc(max_rows * vocab_chunk_);
      logit_minus_ = alloc(max_rows * vocab_chunk_);
      x_plus_ = alloc(max_rows * El);
      x_minus_ = alloc(max_rows * El);
      ce_state_ = alloc(6 * max_rows);
      h_sel_ = alloc(max_rows * cfg.hidden_size);
      targets_ = (int32_t*)be_.alloc(std::max<int64_t>(max_rows, 1) * sizeof(int32_t));
      uniq_dev_ = (int32_t*)be_.alloc(std::max<int64_t>(max_rows, 1) * sizeof(int32_t));
      for (int j = 0; j < opt.queries; ++j) {
        h_plus_.push_back(alloc(max_rows * cfg.hidden_size));
        h_minus_.push_back(alloc(max_rows * cfg.hidden_size));
      }
      if (opt.round_every > 1 || opt.write_back_every > 1) {
        // An open window's chunk of the master: fp32 (held_pass), or the storage's type
        // (window_pass; never both).
        int64_t largest = 1;
        for (const Param& p : params) largest = std::max(largest, p.numel);
        held_n_ = std::min<int64_t>(largest, int64_t(1) << 20);
        held_ = alloc(held_n_);
        wb_scratch_ = held_;
      }
    }
    sparsity_thresholds();
    const size_t free1 = be_.free_memory();
    buffer_bytes_ = free0_ > free1 ? free0_ - free1 : 0;
    for (int b = 0; b < (int)model_.blocks().size(); ++b)
      for (int pi : model_.blocks()[b].params)
        if (pi == lm_) lm_block_ = b;
  } catch (...) {
    release_buffers();
    throw;
  }
}

void ZOEngine::Impl::sparsity_thresholds() {
  // Sparse MeZO thresholds: the (1 - sparsity) quantile of |theta| of each matrix, so that the
  // entries above it (the largest) are left alone. Read on the host, block by block through a
  // disk tier.
  const auto& params = model_.params();
  mask_.assign(params.size(), std::numeric_limits<float>::infinity());
  if (opt_.sparsity <= 0.f) return;
  const auto& blocks = model_.blocks();
  if (disk_) {
    std::vector<int> order(blocks.size());
    for (int b = 0; b < (int)blocks.size(); ++b) order[b] = b;
    disk_->begin_walk(order);
  }
  std::vector<float> mag;
  for (int b = 0; b < (int)blocks.size(); ++b) {
    if (disk_) disk_->acquire(b, false);
    for (int pi : blocks[b].params) {
      const Param& p = params[pi];
      if (p.shape.size() < 2) continue;
      mag.resize(p.numel);
      const uint16_t* h = p.data ? nullptr : model_.storage_bf16() + p.offset;
      for (int64_t i = 0; i < p.numel; ++i) mag[i] = std::fabs(h ? bf16_to_f32(h[i]) : p.data[i]);
      const int64_t k =
          std::min<int64_t>(p.numel - 1, (int64_t)((1.0 - opt_.sparsity) * p.numel));
      std::nth_element(mag.begin(), mag.begin() + k, mag.end());
      mask_[pi] = mag[k];
    }
    if (disk_) disk_->release(b, false);
  }
}

ZOEngine::Impl::~Impl() {
  if (stream_) {
    try {
      stream_->sync_to_host();  // the weights the walks applied, as without streaming
    } catch (...) {
    }
  }
  try {
    drop_disk_tier();  // the Model's storage whole again
  } catch (...) {
    disk_.reset();  // a failed transfer: wait for the others before their buffers go
  }
  if (stream_) {
    fwd_.set_weights(nullptr);
    stream_.reset();
  }
  release_buffers();
}

void ZOEngine::Impl::release_buffers() {
  for (float** p : {&blk_plus_, &blk_minus_, &tok_plus_, &tok_minus_, &w_plus_, &w_minus_,
                    &logit_plus_, &logit_minus_, &x_plus_, &x_minus_, &ce_state_, &h_sel_, &m_, &v_,
                    &held_}) {
    if (*p) be_.free(*p);
    *p = nullptr;
  }
  for (int32_t** p : {&targets_, &uniq_dev_}) {
    if (*p) be_.free(*p);
    *p = nullptr;
  }
  for (float* p : h_plus_) be_.free(p);
  for (float* p : h_minus_) be_.free(p);
  h_plus_.clear();
  h_minus_.clear();
  for (float* p : state_host_) be_.free_host_pinned(p);
  state_host_.clear();
}

void ZOEngine::Impl::set_stage(int first, int last, StageIO io) {
  const int nblocks = (int)model_.blocks().size();
  ZOF_ASSERT(0 <= first && first <= last && last < nblocks);
  ZOF_ASSERT(first == 0 || io.recv);
  ZOF_ASSERT(last == nblocks - 1 || io.send);
  ZOF_CHECK(opt_.round_every == 1,
            "--round-every does not combine with --pipeline-stages > 1; use --round-every 1");
  first_block_ = first;
  last_block_ = last;
  io_ = std::move(io);
}

bool ZOEngine::Impl::owns_block(int b) const {
  const int nblocks = (int)model_.blocks().size();
  const int last = last_block_ < 0 ? nblocks - 1 : last_block_;
  if (b >= first_block_ && b <= last) return true;
  return b == 0 && last == nblocks - 1 && model_.config().tie_embeddings;
}

Theta ZOEngine::Impl::theta(int pi) const {
  if (stream_) return stream_->param(pi);
  return Theta(model_.param_ptr(pi), model_.storage_dtype());
}

void ZOEngine::Impl::acquire(int block) {
  if (disk_ && !stream_) disk_->acquire(block);
  if (stream_) stream_->acquire(block);
}

void ZOEngine::Impl::release(int block, bool dirty) {
  if (stream_) stream_->release(block, dirty);
  if (disk_ && !stream_) disk_->release(block, dirty);
}

std::vector<int> ZOEngine::Impl::walk_order(size_t micro_batches) const {
  const int nblocks = (int)model_.blocks().size();
  std::vector<int> order;
  for (int b = 0; b < nblocks; ++b) order.push_back(b);  // micro_batches 0: flush's walk
  for (size_t mb = 1; mb < micro_batches; ++mb) {
    if (lm_block_ != nblocks - 1) order.push_back(lm_block_);
    for (int b = 0; b < nblocks; ++b) order.push_back(b);
  }
  if (micro_batches > 0 && lm_block_ != nblocks - 1) order.push_back(lm_block_);
  return order;
}

size_t ZOEngine::Impl::streaming_minimum() const {
  return streaming_buffers() + BlockStreamer::min_bytes(model_, 1 + state_planes());
}

size_t ZOEngine::Impl::streaming_buffers() const {
  // A bf16 evaluation converts each streamed block into scratch of its own.
  return buffer_bytes_ + fwd_.streamed_compute_bytes();
}

void ZOEngine::Impl::enable_streaming(size_t gpu_mem) {
  ZOF_CHECK(first_block_ == 0 && last_block_ < 0,
            "--gpu-mem (parameter streaming) does not combine with pipeline stages; use "
            "--pipeline-stages 1");
  ZOF_CHECK(opt_.write_back_every == 1,
            "--write-back-every runs on the host backend for now, not with a device (--device "
            "cuda, --sim-device): use --write-back-every 1 there");
  // The state streams from the host from the start: none may be on the device yet.
  ZOF_ASSERT(!stream_ && !m_);
  const int planes = 1 + state_planes();
  const size_t free_now = be_.free_memory();
  // No --gpu-mem: what the device has free, less a margin for what the plan cannot see (the
  // copy streams' library workspaces, kernels loaded at their first launch, allocator rounding).
  const size_t margin = gpu_mem > 0 ? 0 : std::max<size_t>(size_t(256) << 20, free_now / 50);
  const size_t budget = gpu_mem > 0 ? gpu_mem : streaming_buffers() + (free_now > margin ? free_now - margin : 0);
  const size_t need = streaming_minimum(), slots = BlockStreamer::min_bytes(model_, planes);
  const std::string slot_what =
      planes == 1 ? "its weights"
                  : planes == 2 ? "its weights and momentum" : "its weights and Adam's m and v";
  const std::string lower = planes == 1 ? "lower --batch or --seq-len"
                                        : "lower --batch or --seq-len, or use --optimizer sgd "
                                          "(no optimizer state)";
  ZOF_CHECK(budget >= need,
            "--gpu-mem " + format_bytes(budget) + " is below this run's minimum of " +
                std::to_string(need) + " bytes (" + format_bytes(need) + "): " +
                format_bytes(streaming_buffers()) + " of activation and copy buffers plus two slots of " +
                "the largest block (" + format_bytes(slots / 2) + " each: " + slot_what +
                "); raise --gpu-mem, or " + lower);
  // The evaluation's bf16 scratch is allocated later, out of what is free now.
  const size_t later = margin + fwd_.streamed_compute_bytes();
  const size_t blocks = std::min(budget - streaming_buffers(), free_now > later ? free_now - later : 0);
  ZOF_CHECK(blocks >= slots, "the device has " + format_bytes(free_now) +
                                 " free after the engine's buffers, less than the " +
                                 format_bytes(slots) + " that streaming needs (two slots of " +
                                 "the largest block, " + slot_what + "); free device memory " +
                                 "(other processes), or " + lower);
  // The state's master: pinned (the planes' copies are asynchronous), zero (no update yet).
  const int64_t n = model_.storage_size();
  while ((int)state_host_.size() < state_planes()) {
    // Zeros that cost no memory until written (a disk tier then takes the disk blocks' part).
    state_host_.push_back((float*)be_.alloc_host_pinned_zeroed(n * sizeof(float)));
  }
  stream_ = std::make_unique<BlockStreamer>(model_, be_, blocks, state_host_);
  fwd_.set_weights(stream_.get());  // evaluation reads the device copies too
  ZOF_ASSERT(!disk_);  // the disk tier is enabled after streaming, which it then sits under
}

void ZOEngine::Impl::sync_to_host() {
  // The disk blocks' stored bytes lag a write-back window: it closes first (no bit depends on
  // where it does). Only a rounding window keeps pending_ here, and the two never combine.
  if (!wb_window_.empty()) flush();
  if (stream_) stream_->sync_to_host();
}

std::vector<int> ZOEngine::Impl::disk_keep() const { return DiskTier::kept_blocks(model_); }

void ZOEngine::Impl::enable_disk_tier(uint64_t host_mem, const std::string& dir, int io_threads,
                                      bool unwritten, const DiskStore* store) {
  ZOF_CHECK(first_block_ == 0 && last_block_ < 0,
            "--host-mem (the disk tier) does not combine with pipeline stages; use "
            "--pipeline-stages 1");
  ZOF_ASSERT(!disk_);
  check_disk_budget(host_mem);
  const int planes = 1 + state_planes();
  const DiskTierPlan plan =
      DiskTier::plan(model_, planes, host_mem, disk_keep(), /*writes_back=*/true);
  const bool adopting =
      store && std::any_of(store->adopt.begin(), store->adopt.end(), [](int s) { return s >= 0; });
  if (plan.all_resident() && !adopting) return;
  std::vector<float*> extra;
  if (stream_) {
    extra = state_host_;
  } else if (state_planes() > 0) {
    if (!m_) alloc_device_state();  // the host backend's "device" memory: the state's master
    extra.push_back(m_);
    if (v_) extra.push_back(v_);
  }
  if (stream_) stream_->sync_to_host();  // no copy in flight while the blocks move out
  disk_ = store ? std::make_unique<DiskTier>(model_, extra, plan, *store, io_threads, true,
                                             unwritten)
               : std::make_unique<DiskTier>(model_, extra, plan, dir, io_threads, true,
                                             unwritten);
  if (stream_)
    stream_->set_disk_tier(disk_.get());
  else
    fwd_.set_host_blocks(disk_.get());  // evaluation walks the blocks through the tier
}

void ZOEngine::Impl::check_disk_budget(uint64_t host_mem) const {
  const int planes = 1 + state_planes();
  const uint64_t need = DiskTier::min_bytes(model_, planes, disk_keep());
  const std::string what = planes == 1   ? "its weights"
                           : planes == 2 ? "its weights and momentum"
                                         : "its weights and Adam's m and v";
  ZOF_CHECK(host_mem >= need,
            "--host-mem " + format_bytes(host_mem) + " is below this run's least of " +
                std::to_string(need) + " bytes (" + format_bytes(need) + "): " +
                (disk_keep().empty() ? std::string("")
                                     : "the block of the tied LM head, which stays resident, "
                                       "and ") +
                "two blocks in flight from disk (the largest block, " + what + "); raise "
                "--host-mem" + (planes > 1 ? ", or use --optimizer sgd (no optimizer state)" : ""));
}

void ZOEngine::Impl::drop_disk_tier(bool keep_weights) {
  if (!disk_) return;
  auto unhook = [&] {
    if (stream_) stream_->set_disk_tier(nullptr);
    fwd_.set_host_blocks(nullptr);
  };
  try {
    // The write-back window's updates first: without the tier no walk would apply them.
    if (keep_weights && !wb_window_.empty()) flush(false);
    if (keep_weights) disk_->materialize();
  } catch (...) {
    unhook();
    disk_.reset();  // waits for every transfer still in flight, then removes the store
    throw;
  }
  unhook();
  disk_.reset();
  if (!keep_weights) wb_window_.clear();
}

double ZOEngine::Impl::loss(const std::vector<LossBatch>& micro) {
  flush();
  double sum = 0, count = 0;
  for (const auto& lb : micro) {
    std::vector<float> nll(lb.scored());
    fwd_.nll_at(lb.batch, lb.score_rows.data(), lb.score_targets.data(), lb.scored(), nll.data());
    const std::vector<double> row(nll.begin(), nll.end());
    sum += loss_sum(lb, row.data());
    count += lb.units();
  }
  ZOF_CHECK(count > 0, "the batch has no scored tokens");
  return sum / count;
}

}  // namespace zof
