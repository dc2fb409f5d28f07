// The ZO step as a walk over blocks with both perturbed hidden states (see zo.h).
#include "zof/zo.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/scored_rows.h"
#include "zof/error.h"
#include "zof/streaming.h"

namespace zof {

int64_t LossBatch::scored() const {
  int64_t n = 0;
  for (auto t : targets) n += t >= 0;
  return n;
}

double loss_sum(const LossBatch& lb, const double* row_nll) {
  const int64_t T = lb.batch.T;
  double sum = 0;
  if (lb.choices.empty()) {
    for (size_t i = 0; i < lb.targets.size(); ++i)
      if (lb.targets[i] >= 0) sum += row_quantized(row_nll[i]);
    return sum;
  }
  std::vector<double> score;
  for (const LossBatch::Choice& c : lb.choices) {
    score.assign(c.count, 0.0);
    for (int32_t k = 0; k < c.count; ++k) {
      const int64_t b = c.first + k;
      double s = 0;
      int64_t n = 0;
      for (int64_t t = 0; t < T; ++t)
        if (lb.targets[b * T + t] >= 0) s += row_nll[b * T + t], ++n;
      score[k] = -s / (double)std::max<int64_t>(n, 1);  // mean log-likelihood
    }
    const double top = *std::max_element(score.begin(), score.end());
    double z = 0;
    for (double x : score) z += std::exp(x - top);
    sum += row_quantized(top + std::log(z) - score[c.label]);
  }
  return sum;
}

LossBatch LossBatch::next_token(Batch b) {
  LossBatch lb;
  lb.targets.assign(b.B * b.T, -1);
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t t = 0; t + 1 < b.lengths[i]; ++t) lb.targets[i * b.T + t] = b.ids[i * b.T + t + 1];
  lb.batch = std::move(b);
  return lb;
}

ZOEngine::ZOEngine(Model& model, Backend& backend, int64_t max_rows, ZOStepOptions opt)
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
      if (opt.round_every > 1) {  // an open window's fp32 chunk of the master (held_pass)
        int64_t largest = 1;
        for (const Param& p : params) largest = std::max(largest, p.numel);
        held_n_ = std::min<int64_t>(largest, int64_t(1) << 20);
        held_ = alloc(held_n_);
      }
    }
    // Sparse MeZO thresholds: the (1 - sparsity) quantile of |theta| of each matrix, so that the
    // entries above it (the largest) are left alone.
    mask_.assign(params.size(), std::numeric_limits<float>::infinity());
    if (opt.sparsity > 0.f) {
      std::vector<float> mag;
      for (size_t pi = 0; pi < params.size(); ++pi) {
        const Param& p = params[pi];
        if (p.shape.size() < 2) continue;
        mag.resize(p.numel);  // the host's storage, read on the host
        const uint16_t* h = p.data ? nullptr : model_.storage_bf16() + p.offset;
        for (int64_t i = 0; i < p.numel; ++i)
          mag[i] = std::fabs(h ? bf16_to_f32(h[i]) : p.data[i]);
        const int64_t k = std::min<int64_t>(p.numel - 1, (int64_t)((1.0 - opt.sparsity) * p.numel));
        std::nth_element(mag.begin(), mag.begin() + k, mag.end());
        mask_[pi] = mag[k];
      }
    }
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

ZOEngine::~ZOEngine() {
  if (stream_) {
    try {
      stream_->sync_to_host();  // the weights the walks applied, as without streaming
    } catch (...) {
    }
    fwd_.set_weights(nullptr);
    stream_.reset();
  }
  release_buffers();
}

void ZOEngine::release_buffers() {
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

int ZOEngine::state_planes() const {
  switch (opt_.optimizer) {
    case ZOStepOptions::Optimizer::SGD: return 0;
    case ZOStepOptions::Optimizer::Momentum: return 1;
    case ZOStepOptions::Optimizer::Adam: return 2;
  }
  return 0;
}

void ZOEngine::alloc_device_state() {
  ZOF_ASSERT(!stream_ && !m_ && state_planes() > 0);
  const int64_t n = model_.storage_size();
  const std::vector<float> zeros(std::min<int64_t>(n, 1 << 20), 0.f);
  float* planes[2] = {nullptr, nullptr};
  try {
    for (int k = 0; k < state_planes(); ++k) {
      planes[k] = (float*)be_.alloc(n * sizeof(float));
      for (int64_t i = 0; i < n; i += (int64_t)zeros.size())
        be_.copy_to_device(planes[k] + i, zeros.data(),
                           std::min<int64_t>((int64_t)zeros.size(), n - i) * sizeof(float), nullptr);
    }
    be_.synchronize(nullptr);  // the zeros are read from a host vector about to go
  } catch (...) {
    for (float* p : planes)
      if (p) be_.free(p);
    throw;
  }
  m_ = planes[0];
  v_ = planes[1];
}

float* ZOEngine::state(int pi, int plane) {
  ZOF_ASSERT(plane >= 1 && plane <= state_planes());
  if (stream_) return stream_->plane(pi, plane);
  if (!m_) alloc_device_state();
  return (plane == 1 ? m_ : v_) + model_.params()[pi].offset;
}

void ZOEngine::read_state(std::vector<float>& m, std::vector<float>& v) {
  flush();  // with streaming, the host masters are current from here
  const int64_t n = model_.storage_size();
  const int planes = state_planes();
  m.assign(planes >= 1 ? n : 0, 0.f);
  v.assign(planes >= 2 ? n : 0, 0.f);
  if (planes == 0) return;
  if (stream_) {
    std::copy(state_host_[0], state_host_[0] + n, m.data());
    if (planes == 2) std::copy(state_host_[1], state_host_[1] + n, v.data());
    return;
  }
  if (!m_) return;  // no update yet: the zeros above
  be_.copy_to_host(m.data(), m_, n * sizeof(float), nullptr);
  if (planes == 2) be_.copy_to_host(v.data(), v_, n * sizeof(float), nullptr);
  be_.synchronize(nullptr);
}

void ZOEngine::write_state(const std::vector<float>& m, const std::vector<float>& v) {
  const int64_t n = model_.storage_size();
  const int planes = state_planes();
  ZOF_ASSERT((int64_t)m.size() == (planes >= 1 ? n : 0) &&
             (int64_t)v.size() == (planes >= 2 ? n : 0));
  if (planes == 0) return;
  if (stream_) {
    // Prefetches may be reading the host masters and resident blocks hold the current state:
    // both settle first; then every device copy is dropped and uploaded again from the new state.
    stream_->sync_to_host();
    std::copy(m.begin(), m.end(), state_host_[0]);
    if (planes == 2) std::copy(v.begin(), v.end(), state_host_[1]);
    stream_->reload_from_host();
    return;
  }
  if (!m_) alloc_device_state();
  be_.copy_to_device(m_, m.data(), n * sizeof(float), nullptr);
  if (planes == 2) be_.copy_to_device(v_, v.data(), n * sizeof(float), nullptr);
  be_.synchronize(nullptr);
}

ZKey ZOEngine::key(uint32_t step, int j) const {
  ZKey k{opt_.seed, step, (uint32_t)j};
  k.dist = opt_.dist;
  return k;
}

ZKey ZOEngine::masked(const ZKey& k, int pi) const {
  ZKey m = k;
  m.mask = mask_[pi];
  return m;
}

DType ZOEngine::copy_dtype(int pi) const {
  return model_.params()[pi].gemm ? opt_.compute : DType::F32;
}

Model::ParamLocator ZOEngine::copy_locator(const float* base, const float* tokens) const {
  return [this, base, tokens](int pi) -> Weight {
    if (pi == tok_) return tokens;
    if (pi == lm_) return Weight();  // untied LM head: read chunk by chunk in head_sums
    ZOF_ASSERT(copy_off_[pi] >= 0);
    return Weight(reinterpret_cast<const char*>(base) + copy_off_[pi], copy_dtype(pi));
  };
}

void ZOEngine::copy_theta(const Theta& th, void* dst, DType ct, int64_t n) {
  if (th.dtype == DType::F32) {
    be_.cast(th.f32(), dst, ct, n);
  } else if (ct == th.dtype) {
    if (n > 0) be_.copy_device(dst, th.p, size_t(n) * dtype_size(ct), nullptr);
  } else {
    ZOF_ASSERT(ct == DType::F32);
    be_.widen(th.p, th.dtype, static_cast<float*>(dst), n);
  }
}

void ZOEngine::held_pass(const Theta& th, int64_t n, int pi, int64_t first, const ZKey& cur,
                         void* plus, void* minus, DType ct, void* theta_out) {
  const Param& p = model_.params()[pi];
  std::vector<ZOUpdateTerm> terms = pending_.terms;
  for (auto& t : terms) t.key.mask = mask_[pi];
  const float lr_wd = p.decay ? pending_.lr_wd : 0.f;
  const int64_t cs = (int64_t)dtype_size(ct);
  for (int64_t k = 0; k < n; k += held_n_) {
    const int64_t m = std::min(held_n_, n - k);
    auto at = [&](void* b) { return b ? static_cast<void*>(static_cast<char*>(b) + k * cs) : b; };
    // The master's chunk in fp32, updated there by the window's terms (the same arithmetic as
    // the pass that will round it) and perturbed from that; the master is not written.
    copy_theta(th.at(k), held_, DType::F32, m);
    be_.zo_pass(Theta(held_), m, (uint32_t)pi, first + k, terms.data(), (int)terms.size(), lr_wd,
                nullptr, &cur, opt_.eps, at(plus), at(minus), ct);
    if (theta_out) be_.cast(held_, at(theta_out), ct, m);
  }
}

void ZOEngine::block_pass(int block, bool apply_update, const ZKey* cur, float* plus,
                          float* minus) {
  const Block& blk = model_.blocks()[block];
  auto& params = model_.params();
  if (hold_) {  // an open rounding window: copies only, from the master and the window's terms
    ZOF_ASSERT(cur && !pending_.empty());
    char* const pc = reinterpret_cast<char*>(plus);
    char* const mc = reinterpret_cast<char*>(minus);
    for (int pi : blk.params) {
      const int64_t off = copy_off_[pi];
      if (off < 0) continue;  // the token table and the LM head: perturb_rows, head_sums
      const bool one = opt_.one_sided && minus;
      held_pass(theta(pi), params[pi].numel, pi, 0, masked(*cur, pi), plus ? pc + off : nullptr,
                minus && !one ? mc + off : nullptr, copy_dtype(pi), one ? mc + off : nullptr);
    }
    return;
  }
  const bool upd = apply_update && !pending_.empty();
  const bool stateful = opt_.optimizer != ZOStepOptions::Optimizer::SGD;
  std::vector<ZOUpdateTerm> terms;
  for (int pi : blk.params) {
    Param& p = params[pi];
    const int64_t off = copy_off_[pi];
    const bool copy = off >= 0 && cur;
    if (!copy && !upd) continue;
    const Theta th = theta(pi);
    if (upd) {
      terms = pending_.terms;
      for (auto& t : terms) t.key.mask = mask_[pi];
    }
    // A bf16 master: each update in fp32, rounded back stochastically in the same pass, before
    // any copy is made from it.
    const bool rounds = upd && opt_.master == DType::BF16;
    const ZKey rk = rounds ? round_key() : ZKey{};
    const ZKey* round = rounds ? &rk : nullptr;
    if (upd && stateful) {
      ZOOptimizer o;
      o.kind = opt_.optimizer == ZOStepOptions::Optimizer::Adam ? ZOOptimizer::Adam
                                                                 : ZOOptimizer::Momentum;
      o.lr = pending_.lr;
      o.beta1 = opt_.beta1;
      o.beta2 = opt_.beta2;
      o.eps = opt_.adam_eps;
      o.wd = p.decay ? pending_.wd : 0.f;
      o.bc1 = (float)(1.0 / (1.0 - std::pow((double)opt_.beta1, (double)pending_.t)));
      o.bc2 = (float)(1.0 / (1.0 - std::pow((double)opt_.beta2, (double)pending_.t)));
      be_.zo_update_state(th, state(pi, 1), o.kind == ZOOptimizer::Adam ? state(pi, 2) : nullptr,
                          p.numel, (uint32_t)pi, 0, terms.data(), (int)terms.size(), o, round);
      if (!copy) continue;
    }
    // ZO-SGD's update rides along with the perturbation.
    const bool fused = upd && !stateful;
    const ZKey ck = cur ? masked(*cur, pi) : ZKey{};
    // One-sided: the second stream runs at theta itself. The copies of a bf16 walk's matrices
    // are bf16 (from the master, after this pass's update).
    const DType ct = copy_dtype(pi);
    char* const pc = reinterpret_cast<char*>(plus);
    char* const mc = reinterpret_cast<char*>(minus);
    char* mo = copy && minus && !opt_.one_sided ? mc + off : nullptr;
    be_.zo_pass(th, p.numel, (uint32_t)pi, 0, fused ? terms.data() : nullptr,
                fused ? (int)terms.size() : 0, p.decay ? pending_.lr_wd : 0.f, round,
                copy ? &ck : nullptr, opt_.eps, copy && plus ? pc + off : nullptr, mo, ct);
    if (copy && minus && opt_.one_sided) copy_theta(th, mc + off, ct, p.numel);
  }
}

void ZOEngine::token_rows(const int32_t* ids, int64_t rows, std::vector<int32_t>& uniq,
                          std::vector<int32_t>& local) {
  uniq.assign(ids, ids + rows);
  std::sort(uniq.begin(), uniq.end());
  uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
  local.resize(rows);
  for (int64_t i = 0; i < rows; ++i)
    local[i] = (int32_t)(std::lower_bound(uniq.begin(), uniq.end(), ids[i]) - uniq.begin());
}

void ZOEngine::perturb_rows(const ZKey& key, int64_t n_uniq) {
  const int64_t E = model_.params()[tok_].shape[1];
  const ZKey mk = masked(key, tok_);
  const Theta table = theta(tok_);
  if (hold_) {  // an open rounding window: row by row through held_pass
    ZOF_ASSERT((int64_t)uniq_host_.size() == n_uniq);
    for (int64_t k = 0; k < n_uniq; ++k) {
      const int64_t first = int64_t(uniq_host_[k]) * E;
      float* const mrow = tok_minus_ + k * E;
      held_pass(table.at(first), E, tok_, first, mk, tok_plus_ + k * E,
                opt_.one_sided ? nullptr : mrow, DType::F32, opt_.one_sided ? mrow : nullptr);
    }
    return;
  }
  // One launch for all rows (uniq_dev_ holds the batch's distinct ids); one-sided: the second
  // stream reads theta itself, gathered (a bf16 master's rows widened one by one: host memory).
  be_.zo_rows(table, E, uniq_dev_, n_uniq, (uint32_t)tok_, mk, opt_.eps, tok_plus_,
              opt_.one_sided ? nullptr : tok_minus_);
  if (!opt_.one_sided) return;
  if (table.dtype == DType::F32) {
    be_.embedding(uniq_dev_, table.f32(), tok_minus_, n_uniq, E, false);
    return;
  }
  ZOF_ASSERT((int64_t)uniq_host_.size() == n_uniq);
  for (int64_t k = 0; k < n_uniq; ++k)
    be_.widen(table.at(int64_t(uniq_host_[k]) * E).p, table.dtype, tok_minus_ + k * E, E);
}

void ZOEngine::head_sums(const ZKey& key, const float* hp, const float* hm, const LossBatch& lb,
                         double& sum_plus, double& sum_minus) {
  const int64_t rows = lb.batch.B * lb.batch.T;
  const int32_t* targets = lb.targets.data();
  const bool minus = hm != nullptr;  // one-sided, query > 0: the theta stream is query 0's
  const Param& lm = model_.params()[lm_];
  const int64_t V = lm.shape[0], E = lm.shape[1];
  const ScoredRows scored(targets, rows, V);
  const std::vector<int32_t>&sel = scored.rows, &tg = scored.targets;
  sum_plus = sum_minus = 0;
  const int64_t n = (int64_t)sel.size(), C = model_.config().hidden_size;
  if (n == 0) return;
  // Features of the scored rows only (gathered by the embedding op, the hidden states as its
  // table): the LM head's GEMMs are the head's cost.
  const bool all = n == rows;  // every row scored: no gather
  int32_t* sel_dev = fwd_.index_buffer();
  if (!all) be_.copy_to_device(sel_dev, sel.data(), n * sizeof(int32_t), nullptr);
  be_.copy_to_device(targets_, tg.data(), n * sizeof(int32_t), nullptr);
  for (int sign = 0; sign < (minus ? 2 : 1); ++sign) {
    const float* h = sign == 0 ? hp : hm;
    if (!all) {
      be_.embedding(sel_dev, h, h_sel_, n, C, false);
      h = h_sel_;
    }
    const HeadWeights w = model_.head(copy_locator(sign == 0 ? blk_plus_ : blk_minus_, nullptr));
    fwd_.head_features(w, h, n, sign == 0 ? x_plus_ : x_minus_);
  }
  // The online softmax's state per row (max, sum, target logit) for each sign, from
  // (-inf, 0, 0).
  std::vector<float> st(6 * n, 0.f);
  std::fill(st.begin(), st.begin() + n, -std::numeric_limits<float>::infinity());
  std::fill(st.begin() + 3 * n, st.begin() + 4 * n, -std::numeric_limits<float>::infinity());
  be_.copy_to_device(ce_state_, st.data(), 6 * n * sizeof(float), nullptr);
  float *mp = ce_state_, *sp = mp + n, *tp = sp + n, *mm = tp + n, *sm = mm + n, *tm = sm + n;
  const ZKey mk = masked(key, lm_);
  const Theta head = theta(lm_);
  const float cap = model_.config().final_softcap;  // Gemma 2's final_logit_softcapping
  for (int64_t v0 = 0; v0 < V; v0 += vocab_chunk_) {
    const int64_t nv = std::min(vocab_chunk_, V - v0);
    // Two-point: both signs from one pass; one-sided: the second stream reads theta itself.
    const bool two_point = minus && !opt_.one_sided;
    const DType ct = opt_.compute;  // the LM head is a matrix product's weight
    if (hold_)  // an open rounding window; one-sided: theta itself into w_minus_
      held_pass(head.at(v0 * E), nv * E, lm_, v0 * E, mk, w_plus_, two_point ? w_minus_ : nullptr,
                ct, minus && !two_point ? w_minus_ : nullptr);
    else
      be_.zo_pass(head.at(v0 * E), nv * E, (uint32_t)lm_, v0 * E, nullptr, 0, 0.f, &mk,
                  opt_.eps, w_plus_, two_point ? w_minus_ : nullptr, ct);
    be_.matmul(x_plus_, w_plus_, ct, nullptr, logit_plus_, n, nv, E);
    if (cap != 0.f) be_.softcap(logit_plus_, logit_plus_, cap, n * nv);
    be_.cross_entropy_chunk(logit_plus_, targets_, n, nv, v0, mp, sp, tp);
    if (!minus) continue;
    const void* wm = two_point || hold_ ? (const void*)w_minus_ : head.at(v0 * E).p;
    if (!two_point && !hold_ && (ct != DType::F32 || head.dtype != DType::F32)) {
      copy_theta(head.at(v0 * E), w_minus_, ct, nv * E);  // one-sided: theta in the walk's type
      wm = w_minus_;
    }
    be_.matmul(x_minus_, wm, ct, nullptr, logit_minus_, n, nv, E);
    if (cap != 0.f) be_.softcap(logit_minus_, logit_minus_, cap, n * nv);
    be_.cross_entropy_chunk(logit_minus_, targets_, n, nv, v0, mm, sm, tm);
  }
  be_.copy_to_host(st.data(), ce_state_, 6 * n * sizeof(float), nullptr);
  be_.synchronize(nullptr);
  mp = st.data(), sp = mp + n, tp = sp + n, mm = tp + n, sm = mm + n, tm = sm + n;
  // Each row's nll is formed in double (max and target logit are large and close: GPT-2's
  // logits sit near -100, where a float sum would round at 1e-5), then the batch's loss from
  // them (loss_sum: each token's or example's loss rounded to the row quantum, so that the
  // totals do not depend on how rows are split).
  std::vector<double> nll(rows, 0.0);
  for (int64_t i = 0; i < n; ++i)
    nll[sel[i]] = ((double)mp[i] - (double)tp[i]) + std::log((double)sp[i]);
  sum_plus = loss_sum(lb, nll.data());
  if (!minus) return;
  for (int64_t i = 0; i < n; ++i)
    nll[sel[i]] = ((double)mm[i] - (double)tm[i]) + std::log((double)sm[i]);
  sum_minus = loss_sum(lb, nll.data());
}

void check_loss_batches(const std::vector<LossBatch>& micro, const ModelConfig& cfg,
                        int64_t max_rows, const char* who) {
  const int64_t V = cfg.vocab_size;
  for (const LossBatch& lb : micro) {
    const int64_t rows = lb.batch.B * lb.batch.T;
    ZOF_CHECK(rows <= max_rows, "batch of " + std::to_string(rows) + " tokens exceeds " + who +
                                    "'s capacity of " + std::to_string(max_rows));
    ZOF_ASSERT((int64_t)lb.targets.size() == rows && (int64_t)lb.batch.ids.size() == rows);
    int64_t next = 0;  // choices cover consecutive sequences, each with a scored token
    for (const LossBatch::Choice& c : lb.choices) {
      ZOF_ASSERT(c.first == next && c.count >= 1 && c.first + c.count <= lb.batch.B &&
                 c.label >= 0 && c.label < c.count);
      next = c.first + c.count;
      for (int32_t k = 0; k < c.count; ++k) {
        const int32_t* t = lb.targets.data() + (int64_t)(c.first + k) * lb.batch.T;
        ZOF_ASSERT(std::any_of(t, t + lb.batch.T, [](int32_t x) { return x >= 0; }));
      }
    }
    ZOF_ASSERT(lb.choices.empty() || next == lb.batch.B);
    ZOF_CHECK(lb.batch.T <= cfg.max_position,
              "a sequence of " + std::to_string(lb.batch.T) + " tokens is beyond the model's " +
                  "context of " + std::to_string(cfg.max_position) +
                  " tokens (max_position_embeddings)");
    for (int64_t i = 0; i < rows; ++i) {
      ZOF_CHECK(lb.batch.ids[i] >= 0 && lb.batch.ids[i] < V,
                "token id " + std::to_string(lb.batch.ids[i]) +
                    " is outside the model's vocabulary of " + std::to_string(V));
      ZOF_CHECK(lb.targets[i] < V, "target token id " + std::to_string(lb.targets[i]) +
                                       " is outside the vocabulary of " + std::to_string(V));
    }
  }
}

ZOEngine::StepWalk ZOEngine::step_walk(uint32_t step) const {
  StepWalk w;
  const int q = opt_.queries;
  for (int j = 0; j < q; ++j) w.keys.push_back(key(step, j));
  // The stage's share of the walk (the whole walk in one process).
  w.nblocks = (int)model_.blocks().size();
  const int first_blk = first_block_, last_blk = last_block_ < 0 ? w.nblocks - 1 : last_block_;
  w.has_embed = first_blk == 0, w.has_head = last_blk == w.nblocks - 1;
  w.li_lo = std::max(0, first_blk - 1);
  w.li_hi = std::min<int>((int)model_.config().num_layers, last_blk);
  return w;
}

// Block 0: the embedding, with only the batch's rows of the token table perturbed (a stage
// without it receives the 2q streams instead).
void ZOEngine::walk_embed(const StepWalk& w, const DeviceInputs& in, int64_t n_uniq, bool first,
                          bool dirty) {
  const int64_t rows = in.B * in.T, C = model_.config().hidden_size;
  const int q = (int)w.keys.size();
  if (!w.has_embed) {
    for (int j = 0; j < q; ++j) {
      io_.recv(2 * j, h_plus_[j], rows * C);
      if (has_minus(j)) io_.recv(2 * j + 1, h_minus_[j], rows * C);
    }
    return;
  }
  acquire(0);
  for (int j = 0; j < q; ++j) {
    block_pass(0, first && j == 0, &w.keys[j], blk_plus_, has_minus(j) ? blk_minus_ : nullptr);
    perturb_rows(w.keys[j], n_uniq);
    fwd_.embed(model_.embed(copy_locator(blk_plus_, tok_plus_)), in.ids, in.embed_pos, rows,
               h_plus_[j]);
    if (has_minus(j))
      fwd_.embed(model_.embed(copy_locator(blk_minus_, tok_minus_)), in.ids, in.embed_pos, rows,
                 h_minus_[j]);
  }
  release(0, dirty);
}

// The stage's transformer layers, each resident once for all 2q streams.
void ZOEngine::walk_layers(const StepWalk& w, const DeviceInputs& in, bool first, bool dirty) {
  const int q = (int)w.keys.size();
  for (int li = w.li_lo; li < w.li_hi; ++li) {
    acquire(li + 1);
    for (int j = 0; j < q; ++j) {
      block_pass(li + 1, first && j == 0, &w.keys[j], blk_plus_,
                 has_minus(j) ? blk_minus_ : nullptr);
      fwd_.layer(li, model_.layer(li, copy_locator(blk_plus_, nullptr)), h_plus_[j], in.B, in.T,
                 in.pos, in.key_mask, nullptr);
      if (has_minus(j))
        fwd_.layer(li, model_.layer(li, copy_locator(blk_minus_, nullptr)), h_minus_[j], in.B,
                   in.T, in.pos, in.key_mask, nullptr);
    }
    release(li + 1, dirty);
  }
}

// The head: final norm, projections, LM head in vocabulary chunks, NLL of the scored rows (a
// stage without it sends the 2q streams on). A tied LM head is the embedding block's token table.
void ZOEngine::walk_head(const StepWalk& w, const LossBatch& lb, bool first, bool dirty,
                         QueryLosses& out) {
  const int64_t rows = lb.batch.B * lb.batch.T, C = model_.config().hidden_size;
  const int q = (int)w.keys.size(), last = w.nblocks - 1;
  if (!w.has_head) {
    for (int j = 0; j < q; ++j) {
      io_.send(2 * j, h_plus_[j], rows * C);
      if (has_minus(j)) io_.send(2 * j + 1, h_minus_[j], rows * C);
    }
    return;
  }
  // A head stage without the embedding keeps its own copy of the tied table up to date (z is
  // regenerated from the seed, so the tied weights never cross ranks).
  if (!w.has_embed && model_.config().tie_embeddings && first)
    block_pass(0, true, nullptr, nullptr, nullptr);
  acquire(last);
  if (lm_block_ != last) acquire(lm_block_);
  for (int j = 0; j < q; ++j) {
    block_pass(last, first && j == 0, &w.keys[j], blk_plus_, has_minus(j) ? blk_minus_ : nullptr);
    double sp = 0, sm = 0;
    head_sums(w.keys[j], h_plus_[j], has_minus(j) ? h_minus_[j] : nullptr, lb, sp, sm);
    out.sum_plus[j] += sp;
    out.sum_minus[j] += has_minus(j) ? sm : 0.0;
  }
  if (lm_block_ != last) release(lm_block_, false);
  release(last, dirty);
  out.count += lb.units();
}

QueryLosses ZOEngine::perturbed_losses(uint32_t step, const std::vector<LossBatch>& micro) {
  ZOF_CHECK(opt_.perturb, "this ZO engine only applies updates (ZOStepOptions::perturb is off): "
                          "it has no buffers for perturbed losses");
  ZOF_CHECK(!micro.empty(), "a ZO step needs at least one batch");
  const int q = opt_.queries;
  // Every input is checked before the walk changes anything: the pending update is applied
  // block by block as the walk goes, so an error part way would leave it half applied.
  check_loss_batches(micro, model_.config(), max_rows_, "the engine");
  const StepWalk w = step_walk(step);
  QueryLosses out;
  out.sum_plus.assign(q, 0.0);
  out.sum_minus.assign(q, 0.0);
  // A bf16 master's open rounding window (step not a multiple of round_every): this walk only
  // reads the master, through the window's updates; the walk of the window's last step + 1
  // applies and rounds them all.
  hold_ = opt_.round_every > 1 && !pending_.empty() && step % (uint32_t)opt_.round_every != 0;
  if (stream_) stream_->begin_walk(walk_order(micro.size()));
  std::vector<int32_t> uniq, local;
  for (size_t mb = 0; mb < micro.size(); ++mb) {
    const Batch& b = micro[mb].batch;
    // The embedding reads a compact table of the batch's rows: its ids index that.
    if (w.has_embed) {
      token_rows(b.ids.data(), b.B * b.T, uniq, local);
      be_.copy_to_device(uniq_dev_, uniq.data(), uniq.size() * sizeof(int32_t), nullptr);
      uniq_host_ = uniq;
    }
    const DeviceInputs in = fwd_.upload(b, w.has_embed ? local.data() : nullptr);
    const bool first = mb == 0;
    // The walk applies the update to each block (an open window writes nothing).
    const bool dirty = first && !pending_.empty() && !hold_;
    walk_embed(w, in, (int64_t)uniq.size(), first, dirty);
    walk_layers(w, in, first, dirty);
    walk_head(w, micro[mb], first, dirty, out);
  }
  // One-sided: query 0's second stream runs at theta and serves every query; the others have
  // only their +eps stream.
  if (opt_.one_sided)
    for (int j = 1; j < q; ++j) out.sum_minus[j] = out.sum_minus[0];  // L(theta), shared
  if (!hold_) pending_ = PendingUpdate{};  // applied during the first walk
  hold_ = false;
  fwd_.weights_changed();
  return out;
}

std::vector<double> ZOEngine::projected_gradients(const QueryLosses& l) const {
  ZOF_CHECK(l.count > 0, "the batch has no scored tokens (every target is masked)");
  std::vector<double> g(l.sum_plus.size());
  for (size_t j = 0; j < g.size(); ++j)
    g[j] = (l.sum_plus[j] - l.sum_minus[j]) / l.count / ((opt_.one_sided ? 1.0 : 2.0) * opt_.eps);
  return g;
}

PendingUpdate ZOEngine::make_update(const ZOStepOptions& opt, uint32_t step, float lr,
                                    const std::vector<double>& g) {
  PendingUpdate u;
  const double q = (double)g.size();
  const bool sgd = opt.optimizer == ZOStepOptions::Optimizer::SGD;
  for (size_t j = 0; j < g.size(); ++j) {
    ZKey k{opt.seed, step, (uint32_t)j};
    k.dist = opt.dist;
    u.terms.push_back(ZOUpdateTerm{k, (float)((sgd ? lr : 1.0) * g[j] / q)});
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

ZKey ZOEngine::round_key() const {
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

void ZOEngine::schedule_update(uint32_t step, float lr, const std::vector<double>& g) {
  add_update(make_update(opt_, step, lr, g));
}

void ZOEngine::add_update(const PendingUpdate& u) {
  if (pending_.empty()) {
    pending_ = u;
    return;
  }
  // Only a rounding window keeps updates past a walk (or a flush).
  ZOF_ASSERT(opt_.round_every > 1);
  pending_.join(u);
}

void ZOEngine::set_stage(int first, int last, StageIO io) {
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

bool ZOEngine::owns_block(int b) const {
  const int nblocks = (int)model_.blocks().size();
  const int last = last_block_ < 0 ? nblocks - 1 : last_block_;
  if (b >= first_block_ && b <= last) return true;
  return b == 0 && last == nblocks - 1 && model_.config().tie_embeddings;
}

void ZOEngine::flush(bool to_host) {
  hold_ = false;  // a flush closes a rounding window (even after a walk cut short)
  if (!pending_.empty()) {
    const auto& blocks = model_.blocks();
    if (stream_) stream_->begin_walk(walk_order(0));
    for (int b = 0; b < (int)blocks.size(); ++b)
      if (owns_block(b)) {
        acquire(b);
        block_pass(b, true, nullptr, nullptr, nullptr);
        release(b, true);
      }
  }
  pending_ = PendingUpdate{};
  fwd_.weights_changed();
  if (stream_ && to_host) stream_->sync_to_host();
}

void ZOEngine::sync_to_host() {
  if (stream_) stream_->sync_to_host();
}

void ZOEngine::round_weights(DType dtype) {
  if (dtype == DType::F32) return;
  flush();  // the host master is current
  model_.round_to(dtype);
  if (stream_) stream_->reload_from_host();
  fwd_.weights_changed();
}

Theta ZOEngine::theta(int pi) const {
  if (stream_) return stream_->param(pi);
  return Theta(model_.param_ptr(pi), model_.storage_dtype());
}

void ZOEngine::acquire(int block) {
  if (stream_) stream_->acquire(block);
}

void ZOEngine::release(int block, bool dirty) {
  if (stream_) stream_->release(block, dirty);
}

std::vector<int> ZOEngine::walk_order(size_t micro_batches) const {
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

size_t ZOEngine::streaming_minimum() const {
  return streaming_buffers() + BlockStreamer::min_bytes(model_, 1 + state_planes());
}

size_t ZOEngine::streaming_buffers() const {
  // A bf16 evaluation converts each streamed block into scratch of its own.
  return buffer_bytes_ + fwd_.streamed_compute_bytes();
}

void ZOEngine::enable_streaming(size_t gpu_mem) {
  ZOF_CHECK(first_block_ == 0 && last_block_ < 0,
            "--gpu-mem (parameter streaming) does not combine with pipeline stages; use "
            "--pipeline-stages 1");
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
    float* p = (float*)be_.alloc_host_pinned(n * sizeof(float));
    std::fill(p, p + n, 0.f);
    state_host_.push_back(p);
  }
  stream_ = std::make_unique<BlockStreamer>(model_, be_, blocks, state_host_);
  fwd_.set_weights(stream_.get());  // evaluation reads the device copies too
}

double ZOEngine::loss(const std::vector<LossBatch>& micro) {
  flush();
  double sum = 0, count = 0;
  for (const auto& lb : micro) {
    std::vector<float> nll(lb.batch.B * lb.batch.T);
    fwd_.nll(lb.batch, lb.targets.data(), nll.data());
    const std::vector<double> row(nll.begin(), nll.end());
    sum += loss_sum(lb, row.data());
    count += lb.units();
  }
  ZOF_CHECK(count > 0, "the batch has no scored tokens");
  return sum / count;
}

}  // namespace zof
