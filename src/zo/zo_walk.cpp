// The ZO engine's walk (zo.h): one pass over the blocks that carries the 2q perturbed hidden
// states through each block while its weights are at hand, applying the pending update as it
// goes (block_pass), with the batch's rows of the token table and the LM head perturbed apart;
// the losses it returns and the projected gradients from them.
#include "zof/zo.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/scored_rows.h"
#include "zof/error.h"
#include "zof/streaming.h"

#include "zo/zo_engine.h"

namespace zof {

ZKey ZOEngine::Impl::key(uint32_t step, int j) const {
  return direction_key(opt_, step, (uint32_t)j);
}

std::vector<tp::ElementRun> ZOEngine::Impl::element_runs(int pi) const {
  if (element_runs_.empty()) return {tp::ElementRun{0, 0, model_.params()[pi].numel}};
  return element_runs_[pi];
}

ZKey ZOEngine::Impl::masked(const ZKey& k, int pi) const {
  ZKey m = k;
  m.mask = mask_[pi];
  // A low-rank direction draws a matrix's z from factors of its width (a slice's: the whole
  // matrix's); vectors stay dense.
  if (slice_) return tp::param_key(*slice_, pi, m);
  const Param& p = model_.params()[pi];
  m.cols = p.shape.size() >= 2 ? (uint32_t)p.shape.back() : 0;
  return m;
}

DType ZOEngine::Impl::copy_dtype(int pi) const {
  return model_.params()[pi].gemm ? opt_.compute : DType::F32;
}

Model::ParamLocator ZOEngine::Impl::copy_locator(const float* base, const float* tokens) const {
  return [this, base, tokens](int pi) -> Weight {
    if (pi == tok_) return tokens;
    if (pi == lm_) return Weight();  // untied LM head: read chunk by chunk in head_sums
    ZOF_ASSERT(copy_off_[pi] >= 0);
    return Weight(reinterpret_cast<const char*>(base) + copy_off_[pi], copy_dtype(pi));
  };
}

void ZOEngine::Impl::copy_theta(const Theta& th, void* dst, DType ct, int64_t n) {
  if (th.dtype == DType::F32) {
    be_.cast(th.f32(), dst, ct, n);
  } else if (ct == th.dtype) {
    if (n > 0) be_.copy_device(dst, th.p, size_t(n) * dtype_size(ct), nullptr);
  } else {
    ZOF_ASSERT(ct == DType::F32);
    be_.widen(th.p, th.dtype, static_cast<float*>(dst), n);
  }
}

void ZOEngine::Impl::held_pass(const Theta& th, int64_t n, int pi, int64_t first, const ZKey& cur,
                               void* plus, void* minus, DType ct, void* theta_out) {
  const Param& p = model_.params()[pi];
  std::vector<ZOUpdateTerm> terms = pending_.terms;
  for (auto& t : terms) t.key = masked(t.key, pi);
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

void ZOEngine::Impl::block_pass(int block, bool apply_update, const ZKey* cur, float* plus,
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
      for (auto& t : terms) t.key = masked(t.key, pi);
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
      float* const m = state(pi, 1);
      float* const v = o.kind == ZOOptimizer::Adam ? state(pi, 2) : nullptr;
      for (const tp::ElementRun& r : element_runs(pi))
        be_.zo_update_state(th.at(r.local), m + r.local, v ? v + r.local : nullptr, r.n,
                            (uint32_t)pi, r.global, terms.data(), (int)terms.size(), o, round);
      if (!copy) continue;
    }
    // ZO-SGD's update rides along with the perturbation.
    const bool fused = upd && !stateful;
    if (!element_runs_.empty()) {  // a tensor-parallel slice: the update only, run by run
      ZOF_ASSERT(!copy);
      if (fused)
        for (const tp::ElementRun& r : element_runs(pi))
          be_.zo_pass(th.at(r.local), r.n, (uint32_t)pi, r.global, terms.data(),
                      (int)terms.size(), p.decay ? pending_.lr_wd : 0.f, round, nullptr, 0.f,
                      nullptr, nullptr, DType::F32);
      continue;
    }
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

bool ZOEngine::Impl::windowed(int block) const {
  return opt_.write_back_every > 1 && disk_ && !stream_ && disk_->on_disk(block);
}

int ZOEngine::Impl::window_steps(bool apply) const {
  // A closing walk's passes after its first read the block as that pass left it: updated.
  return apply || !wb_close_ ? (int)wb_window_.size() : 0;
}

void ZOEngine::Impl::window_passes(const Theta& t, int64_t n, int pi, int64_t first, int k,
                                   const ZKey* cur, void* plus, void* minus, DType ct,
                                   void* theta_out) {
  const Param& p = model_.params()[pi];
  const int passes = cur ? std::max(k, 1) : k;
  for (int s = 0; s < passes; ++s) {
    const bool copies = s == passes - 1 && cur;
    std::vector<ZOUpdateTerm> terms;
    float lr_wd = 0.f;
    ZKey rk;  // a bf16 master's rounding of step s: its own (seed, step), as round_key()
    if (s < k) {
      const PendingUpdate& u = wb_window_[s];
      terms = u.terms;
      for (auto& t2 : terms) t2.key = masked(t2.key, pi);
      lr_wd = p.decay ? u.lr_wd : 0.f;
      rk.seed = u.terms[0].key.seed;
      rk.step = u.terms[0].key.step;
    }
    const ZKey ck = copies ? masked(*cur, pi) : ZKey{};
    be_.zo_pass(t, n, (uint32_t)pi, first, terms.empty() ? nullptr : terms.data(),
                (int)terms.size(), lr_wd, s < k && opt_.master == DType::BF16 ? &rk : nullptr,
                copies ? &ck : nullptr, opt_.eps, copies ? plus : nullptr,
                copies ? minus : nullptr, ct);
  }
  if (cur && theta_out) copy_theta(t, theta_out, ct, n);
}

void ZOEngine::Impl::window_read(const Theta& th, int64_t n, int pi, int64_t first,
                                 const ZKey& cur, void* plus, void* minus, DType ct,
                                 void* theta_out) {
  const int k = window_steps(false);
  if (k == 0) {  // nothing held (any more): the block's own bytes are current
    window_passes(th, n, pi, first, 0, &cur, plus, minus, ct, theta_out);
    return;
  }
  const Theta scratch(wb_scratch_, th.dtype);
  const int64_t cs = (int64_t)dtype_size(ct);
  for (int64_t k0 = 0; k0 < n; k0 += held_n_) {
    const int64_t m = std::min(held_n_, n - k0);
    auto at = [&](void* b) -> void* { return b ? static_cast<char*>(b) + k0 * cs : nullptr; };
    copy_theta(th.at(k0), scratch.p, th.dtype, m);
    window_passes(scratch, m, pi, first + k0, k, &cur, at(plus), at(minus), ct, at(theta_out));
  }
}

void ZOEngine::Impl::window_pass(int block, bool apply, const ZKey* cur, float* plus,
                                 float* minus) {
  const Block& blk = model_.blocks()[block];
  const int k = window_steps(apply);
  char* const pc = reinterpret_cast<char*>(plus);
  char* const mc = reinterpret_cast<char*>(minus);
  for (int pi : blk.params) {
    const int64_t off = copy_off_[pi];
    const bool copy = off >= 0 && cur;  // the token table and LM head: perturb_rows, head_sums
    if (!apply && !copy) continue;
    const DType ct = copy_dtype(pi);
    // One-sided: the second stream is theta itself.
    const bool one = opt_.one_sided && minus;
    void* const po = copy && plus ? pc + off : nullptr;
    void* const mo = copy && minus && !one ? mc + off : nullptr;
    void* const to = copy && one ? mc + off : nullptr;
    if (apply)  // in place: the block is written back after this walk
      window_passes(theta(pi), model_.params()[pi].numel, pi, 0, k, copy ? cur : nullptr, po, mo,
                    ct, to);
    else
      window_read(theta(pi), model_.params()[pi].numel, pi, 0, *cur, po, mo, ct, to);
  }
}

void ZOEngine::Impl::token_rows(const int32_t* ids, int64_t rows, std::vector<int32_t>& uniq,
                                std::vector<int32_t>& local) {
  uniq.assign(ids, ids + rows);
  std::sort(uniq.begin(), uniq.end());
  uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
  local.resize(rows);
  for (int64_t i = 0; i < rows; ++i)
    local[i] = (int32_t)(std::lower_bound(uniq.begin(), uniq.end(), ids[i]) - uniq.begin());
}

void ZOEngine::Impl::perturb_rows(const ZKey& key, int64_t n_uniq) {
  const int64_t E = model_.params()[tok_].shape[1];
  const ZKey mk = masked(key, tok_);
  const Theta table = theta(tok_);
  // An open rounding window (held_pass) or write-back window (window_read): row by row.
  const bool wread = windowed(0) && window_steps(false) > 0;
  if (hold_ || wread) {
    ZOF_ASSERT((int64_t)uniq_host_.size() == n_uniq);
    for (int64_t k = 0; k < n_uniq; ++k) {
      const int64_t first = int64_t(uniq_host_[k]) * E;
      float* const prow = tok_plus_ + k * E;
      float* const mrow = tok_minus_ + k * E;
      float* const two = opt_.one_sided ? nullptr : mrow;  // the -eps copy, or theta itself
      float* const one = opt_.one_sided ? mrow : nullptr;
      if (wread)
        window_read(table.at(first), E, tok_, first, mk, prow, two, DType::F32, one);
      else
        held_pass(table.at(first), E, tok_, first, mk, prow, two, DType::F32, one);
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

void ZOEngine::Impl::head_sums(const ZKey& key, const float* hp, const float* hm,
                               const LossBatch& lb, double& sum_plus, double& sum_minus) {
  const int64_t rows = lb.batch.rows();
  const bool minus = hm != nullptr;  // one-sided, query > 0: the theta stream is query 0's
  const Param& lm = model_.params()[lm_];
  const int64_t V = lm.shape[0], E = lm.shape[1];
  sum_plus = sum_minus = 0;
  if (lb.score_rows.empty()) return;
  // A lone pair runs twice (its second copy unused): a product of one row is the backends'
  // decoding path, whose sums may differ in the last bits from the same row among others
  // (Backend::matmul), and a replica or micro-batch must score a pair as the whole batch does.
  const bool lone = lb.score_rows.size() == 1 && max_rows_ >= 2;
  const std::vector<int32_t> lone_sel(2, lb.score_rows[0]), lone_tg(2, lb.score_targets[0]);
  const std::vector<int32_t>&sel = lone ? lone_sel : lb.score_rows,
                        &tg = lone ? lone_tg : lb.score_targets;
  const int64_t n = (int64_t)sel.size(), C = model_.config().hidden_size;
  // Features of the scored rows only (gathered by the embedding op, the hidden states as its
  // table; a row scored against several targets comes once for each): the LM head's GEMMs are
  // the head's cost.
  bool all = n == rows;  // every row scored once, in order: no gather
  for (int64_t i = 0; all && i < n; ++i) all = sel[i] == i;
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
  const bool wread = windowed(lm_block_) && window_steps(false) > 0;
  for (int64_t v0 = 0; v0 < V; v0 += vocab_chunk_) {
    const int64_t nv = std::min(vocab_chunk_, V - v0);
    // Two-point: both signs from one pass; one-sided: the second stream reads theta itself.
    const bool two_point = minus && !opt_.one_sided;
    const DType ct = opt_.compute;  // the LM head is a matrix product's weight
    if (hold_)  // an open rounding window; one-sided: theta itself into w_minus_
      held_pass(head.at(v0 * E), nv * E, lm_, v0 * E, mk, w_plus_, two_point ? w_minus_ : nullptr,
                ct, minus && !two_point ? w_minus_ : nullptr);
    else if (wread)  // the write-back window's, the same way
      window_read(head.at(v0 * E), nv * E, lm_, v0 * E, mk, w_plus_,
                  two_point ? w_minus_ : nullptr, ct, minus && !two_point ? w_minus_ : nullptr);
    else
      be_.zo_pass(head.at(v0 * E), nv * E, (uint32_t)lm_, v0 * E, nullptr, 0, 0.f, &mk,
                  opt_.eps, w_plus_, two_point ? w_minus_ : nullptr, ct);
    be_.matmul(x_plus_, w_plus_, ct, nullptr, logit_plus_, n, nv, E);
    if (cap != 0.f) be_.softcap(logit_plus_, logit_plus_, cap, n * nv);
    be_.cross_entropy_chunk(logit_plus_, targets_, n, nv, v0, mp, sp, tp);
    if (!minus) continue;
    const void* wm = two_point || hold_ || wread ? (const void*)w_minus_ : head.at(v0 * E).p;
    if (!two_point && !hold_ && !wread && (ct != DType::F32 || head.dtype != DType::F32)) {
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
  std::vector<double> nll(n);  // loss_sum reads the first lb.scored()
  for (int64_t i = 0; i < n; ++i) nll[i] = ((double)mp[i] - (double)tp[i]) + std::log((double)sp[i]);
  sum_plus = loss_sum(lb, nll.data());
  if (!minus) return;
  for (int64_t i = 0; i < n; ++i) nll[i] = ((double)mm[i] - (double)tm[i]) + std::log((double)sm[i]);
  sum_minus = loss_sum(lb, nll.data());
}

ZOEngine::Impl::StepWalk ZOEngine::Impl::step_walk(uint32_t step) const {
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
void ZOEngine::Impl::walk_embed(const StepWalk& w, const DeviceInputs& in, int64_t n_uniq,
                                bool first, bool dirty) {
  const int64_t rows = in.rows, C = model_.config().hidden_size;
  const int q = (int)w.keys.size();
  if (!w.has_embed) {
    for (int j = 0; j < q; ++j) {
      io_.recv(2 * j, h_plus_[j], rows * C);
      if (has_minus(j)) io_.recv(2 * j + 1, h_minus_[j], rows * C);
    }
    return;
  }
  acquire(0);
  const bool win = windowed(0);
  for (int j = 0; j < q; ++j) {
    if (win)
      window_pass(0, wb_close_ && first && j == 0, &w.keys[j], blk_plus_,
                  has_minus(j) ? blk_minus_ : nullptr);
    else
      block_pass(0, first && j == 0, &w.keys[j], blk_plus_, has_minus(j) ? blk_minus_ : nullptr);
    perturb_rows(w.keys[j], n_uniq);
    fwd_.embed(model_.embed(copy_locator(blk_plus_, tok_plus_)), in.ids, in.embed_pos, rows,
               h_plus_[j]);
    if (has_minus(j))
      fwd_.embed(model_.embed(copy_locator(blk_minus_, tok_minus_)), in.ids, in.embed_pos, rows,
                 h_minus_[j]);
  }
  release(0, win ? first && wb_close_ && !wb_window_.empty() : dirty);
}

// The stage's transformer layers, each resident once for all 2q streams.
void ZOEngine::Impl::walk_layers(const StepWalk& w, const DeviceInputs& in, bool first,
                                 bool dirty) {
  const int q = (int)w.keys.size();
  for (int li = w.li_lo; li < w.li_hi; ++li) {
    acquire(li + 1);
    const bool win = windowed(li + 1);
    for (int j = 0; j < q; ++j) {
      if (win)  // the write-back window: applied once by a closing walk's first pass
        window_pass(li + 1, wb_close_ && first && j == 0, &w.keys[j], blk_plus_,
                    has_minus(j) ? blk_minus_ : nullptr);
      else
        block_pass(li + 1, first && j == 0, &w.keys[j], blk_plus_,
                   has_minus(j) ? blk_minus_ : nullptr);
      fwd_.layer(li, model_.layer(li, copy_locator(blk_plus_, nullptr)), h_plus_[j], in);
      if (has_minus(j))
        fwd_.layer(li, model_.layer(li, copy_locator(blk_minus_, nullptr)), h_minus_[j], in);
    }
    release(li + 1, win ? first && wb_close_ && !wb_window_.empty() : dirty);
  }
}

// The head: final norm, projections, LM head in vocabulary chunks, NLL of the scored rows (a
// stage without it sends the 2q streams on). A tied LM head is the embedding block's token table.
void ZOEngine::Impl::walk_head(const StepWalk& w, const LossBatch& lb, bool first, bool dirty,
                               QueryLosses& out) {
  const int64_t rows = lb.batch.rows(), C = model_.config().hidden_size;
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
  const bool win = windowed(last);
  for (int j = 0; j < q; ++j) {
    if (win)
      window_pass(last, wb_close_ && first && j == 0, &w.keys[j], blk_plus_,
                  has_minus(j) ? blk_minus_ : nullptr);
    else
      block_pass(last, first && j == 0, &w.keys[j], blk_plus_,
                 has_minus(j) ? blk_minus_ : nullptr);
    double sp = 0, sm = 0;
    head_sums(w.keys[j], h_plus_[j], has_minus(j) ? h_minus_[j] : nullptr, lb, sp, sm);
    out.sum_plus[j] += sp;
    out.sum_minus[j] += has_minus(j) ? sm : 0.0;
  }
  if (lm_block_ != last) release(lm_block_, false);
  release(last, win ? first && wb_close_ && !wb_window_.empty() : dirty);
  out.count += lb.units();
}

QueryLosses ZOEngine::Impl::perturbed_losses(uint32_t step, const std::vector<LossBatch>& micro) {
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
  // The write-back window takes this step's update; it closes when it holds write_back_every.
  // (Once: a walk retried after an error finds the update there already.)
  if (opt_.write_back_every > 1 && disk_ && !stream_ && !pending_.empty() &&
      (wb_window_.empty() ||
       wb_window_.back().terms[0].key.step != pending_.terms[0].key.step))
    wb_window_.push_back(pending_);
  wb_close_ = (int)wb_window_.size() >= opt_.write_back_every;
  if (disk_) disk_->begin_walk(walk_order(micro.size()));  // first: the streamer reads through it
  if (stream_) stream_->begin_walk(walk_order(micro.size()));
  std::vector<int32_t> uniq, local;
  for (size_t mb = 0; mb < micro.size(); ++mb) {
    const Batch& b = micro[mb].batch;
    // The embedding reads a compact table of the batch's rows: its ids index that.
    if (w.has_embed) {
      token_rows(b.ids.data(), b.rows(), uniq, local);
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
  if (wb_close_) wb_window_.clear();  // written back by this walk
  wb_close_ = false;
  fwd_.weights_changed();
  return out;
}

std::vector<double> ZOEngine::Impl::projected_gradients(const QueryLosses& l) const {
  ZOF_CHECK(l.count > 0, "the batch has no scored tokens (every target is masked)");
  std::vector<double> g(l.sum_plus.size());
  for (size_t j = 0; j < g.size(); ++j)
    g[j] = (l.sum_plus[j] - l.sum_minus[j]) / l.count / ((opt_.one_sided ? 1.0 : 2.0) * opt_.eps);
  return g;
}

}  // namespace zof
