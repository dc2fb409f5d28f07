// The ZO step as a walk over blocks with both perturbed hidden states (see zo.h).
#include "zof/zo.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "zof/error.h"

namespace zof {

int64_t LossBatch::scored() const {
  int64_t n = 0;
  for (auto t : targets) n += t >= 0;
  return n;
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
    : model_(model), be_(backend), fwd_(model, backend, max_rows), opt_(opt), max_rows_(max_rows) {
  ZOF_CHECK(opt.queries >= 1, "--queries must be at least 1");
  ZOF_CHECK(opt.eps > 0 && std::isfinite(opt.eps), "--eps must be a positive number");
  const auto& params = model_.params();
  const auto& cfg = model_.config();
  tok_ = model_.token_table();
  lm_ = model_.lm_head();
  ZOF_ASSERT(tok_ >= 0 && lm_ >= 0);
  // Block copies hold every parameter but the two big tables, 16-float aligned.
  copy_off_.assign(params.size(), -1);
  int64_t copy_size = 1;
  for (const Block& blk : model_.blocks()) {
    int64_t off = 0;
    for (int pi : blk.params) {
      if (pi == tok_ || pi == lm_) continue;
      copy_off_[pi] = off;
      off += (params[pi].numel + 15) / 16 * 16;
    }
    copy_size = std::max(copy_size, off);
  }
  const int64_t Et = params[tok_].shape[1], El = params[lm_].shape[1], V = cfg.vocab_size;
  // A chunk of about 4 MB of the LM head, a multiple of 64 rows (the GEMM's N).
  vocab_chunk_ = opt.vocab_chunk > 0 ? std::min(V, opt.vocab_chunk)
                 : std::min<int64_t>(V, std::max<int64_t>(64, ((1 << 20) / El) / 64 * 64));
  auto alloc = [&](int64_t n) { return (float*)be_.alloc(std::max<int64_t>(n, 1) * sizeof(float)); };
  blk_plus_ = alloc(copy_size);
  blk_minus_ = alloc(copy_size);
  tok_plus_ = alloc(max_rows * Et);
  tok_minus_ = alloc(max_rows * Et);
  w_plus_ = alloc(vocab_chunk_ * El);
  w_minus_ = alloc(vocab_chunk_ * El);
  logit_plus_ = alloc(max_rows * vocab_chunk_);
  logit_minus_ = alloc(max_rows * vocab_chunk_);
  x_plus_ = alloc(max_rows * El);
  x_minus_ = alloc(max_rows * El);
  ce_state_ = alloc(6 * max_rows);
  for (int j = 0; j < opt.queries; ++j) {
    h_plus_.push_back(alloc(max_rows * cfg.hidden_size));
    h_minus_.push_back(alloc(max_rows * cfg.hidden_size));
  }
}

ZOEngine::~ZOEngine() {
  for (float* p : {blk_plus_, blk_minus_, tok_plus_, tok_minus_, w_plus_, w_minus_, logit_plus_,
                   logit_minus_, x_plus_, x_minus_, ce_state_})
    be_.free(p);
  for (float* p : h_plus_) be_.free(p);
  for (float* p : h_minus_) be_.free(p);
}

Model::ParamLocator ZOEngine::copy_locator(const float* base, const float* tokens) const {
  return [this, base, tokens](int pi) -> const float* {
    if (pi == tok_) return tokens;
    if (pi == lm_) return nullptr;  // untied LM head: read chunk by chunk in head_sums
    ZOF_ASSERT(copy_off_[pi] >= 0);
    return base + copy_off_[pi];
  };
}

void ZOEngine::block_pass(int block, bool apply_update, const ZKey* cur, float* plus,
                          float* minus) {
  const Block& blk = model_.blocks()[block];
  auto& params = model_.params();
  const bool upd = apply_update && !pending_.empty();
  for (int pi : blk.params) {
    Param& p = params[pi];
    const int64_t off = copy_off_[pi];
    const bool copy = off >= 0 && cur;
    if (!copy && !upd) continue;
    be_.zo_pass(p.data, p.numel, (uint32_t)pi, 0, upd ? pending_.terms.data() : nullptr,
                upd ? (int)pending_.terms.size() : 0, p.decay ? pending_.lr_wd : 0.f,
                copy ? cur : nullptr, opt_.eps, copy && plus ? plus + off : nullptr,
                copy && minus ? minus + off : nullptr);
  }
}

int64_t ZOEngine::embed_rows(const ZKey& key, const int32_t* ids, int64_t rows,
                             std::vector<int32_t>& local) {
  const Param& t = model_.params()[tok_];
  const int64_t V = t.shape[0], E = t.shape[1];
  for (int64_t i = 0; i < rows; ++i)
    ZOF_CHECK(ids[i] >= 0 && ids[i] < V, "token id " + std::to_string(ids[i]) +
                                             " is outside the model's vocabulary of " +
                                             std::to_string(V));
  std::vector<int32_t> uniq(ids, ids + rows);
  std::sort(uniq.begin(), uniq.end());
  uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
  local.resize(rows);
  for (int64_t i = 0; i < rows; ++i)
    local[i] = (int32_t)(std::lower_bound(uniq.begin(), uniq.end(), ids[i]) - uniq.begin());
  for (size_t k = 0; k < uniq.size(); ++k) {
    const int64_t first = (int64_t)uniq[k] * E;
    be_.zo_pass(t.data + first, E, (uint32_t)tok_, first, nullptr, 0, 0.f, &key, opt_.eps,
                tok_plus_ + k * E, tok_minus_ + k * E);
  }
  return (int64_t)uniq.size();
}

void ZOEngine::head_sums(const ZKey& key, const float* hp, const float* hm, int64_t rows,
                         const int32_t* targets, double& sum_plus, double& sum_minus) {
  const Param& lm = model_.params()[lm_];
  const int64_t V = lm.shape[0], E = lm.shape[1];
  std::vector<int64_t> sel;
  std::vector<int32_t> tg;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] < 0) continue;
    ZOF_CHECK(targets[r] < V, "target token id " + std::to_string(targets[r]) +
                                  " is outside the vocabulary of " + std::to_string(V));
    sel.push_back(r);
    tg.push_back(targets[r]);
  }
  sum_plus = sum_minus = 0;
  const int64_t n = (int64_t)sel.size();
  if (n == 0) return;
  // Features of the scored rows only: the LM head's GEMMs are the head's cost.
  for (int sign = 0; sign < 2; ++sign) {
    float* x = sign == 0 ? x_plus_ : x_minus_;
    const HeadWeights w = model_.head(copy_locator(sign == 0 ? blk_plus_ : blk_minus_, nullptr));
    fwd_.head_features(w, sign == 0 ? hp : hm, rows, x);
    for (int64_t i = 0; i < n; ++i)
      if (sel[i] != i) be_.copy_device(x + i * E, x + sel[i] * E, E * sizeof(float), nullptr);
  }
  float *mp = ce_state_, *sp = mp + n, *tp = sp + n, *mm = tp + n, *sm = mm + n, *tm = sm + n;
  std::fill(mp, mp + n, -std::numeric_limits<float>::infinity());
  std::fill(mm, mm + n, -std::numeric_limits<float>::infinity());
  std::fill(sp, sp + n, 0.f);
  std::fill(sm, sm + n, 0.f);
  std::fill(tp, tp + n, 0.f);
  std::fill(tm, tm + n, 0.f);
  for (int64_t v0 = 0; v0 < V; v0 += vocab_chunk_) {
    const int64_t nv = std::min(vocab_chunk_, V - v0);
    be_.zo_pass(lm.data + v0 * E, nv * E, (uint32_t)lm_, v0 * E, nullptr, 0, 0.f, &key, opt_.eps,
                w_plus_, w_minus_);
    be_.matmul(x_plus_, w_plus_, nullptr, logit_plus_, n, nv, E);
    be_.cross_entropy_chunk(logit_plus_, tg.data(), n, nv, v0, mp, sp, tp);
    be_.matmul(x_minus_, w_minus_, nullptr, logit_minus_, n, nv, E);
    be_.cross_entropy_chunk(logit_minus_, tg.data(), n, nv, v0, mm, sm, tm);
  }
  for (int64_t i = 0; i < n; ++i) {
    sum_plus += (double)(mp[i] + std::log(sp[i]) - tp[i]);
    sum_minus += (double)(mm[i] + std::log(sm[i]) - tm[i]);
  }
}

QueryLosses ZOEngine::perturbed_losses(uint32_t step, const std::vector<LossBatch>& micro) {
  ZOF_CHECK(!micro.empty(), "a ZO step needs at least one batch");
  const auto& cfg = model_.config();
  const int q = opt_.queries;
  const int64_t C = cfg.hidden_size;
  const int nblocks = (int)model_.blocks().size();
  QueryLosses out;
  out.sum_plus.assign(q, 0.0);
  out.sum_minus.assign(q, 0.0);
  std::vector<ZKey> keys(q);
  for (int j = 0; j < q; ++j) keys[j] = ZKey{opt_.seed, step, (uint32_t)j};
  // The stage's share of the walk (the whole walk in one process).
  const int first_blk = first_block_, last_blk = last_block_ < 0 ? nblocks - 1 : last_block_;
  const bool has_embed = first_blk == 0, has_head = last_blk == nblocks - 1;
  const int li_lo = std::max(0, first_blk - 1), li_hi = std::min<int>((int)cfg.num_layers, last_blk);
  std::vector<int32_t> pos, local;
  std::vector<uint8_t> mask;

  for (size_t mb = 0; mb < micro.size(); ++mb) {
    const Batch& b = micro[mb].batch;
    const int64_t rows = b.B * b.T;
    ZOF_CHECK(rows <= max_rows_, "batch of " + std::to_string(rows) +
                                     " tokens exceeds the engine's capacity of " +
                                     std::to_string(max_rows_));
    ZOF_ASSERT((int64_t)micro[mb].targets.size() == rows);
    pos.resize(rows);
    mask.resize(rows);
    for (int64_t i = 0; i < b.B; ++i)
      for (int64_t t = 0; t < b.T; ++t) {
        pos[i * b.T + t] = (int32_t)t;
        mask[i * b.T + t] = t < b.lengths[i];
      }
    const bool first = mb == 0;
    // Block 0: the embedding, with only the batch's rows of the token table perturbed.
    if (has_embed) {
      for (int j = 0; j < q; ++j) {
        block_pass(0, first && j == 0, &keys[j], blk_plus_, blk_minus_);
        embed_rows(keys[j], b.ids.data(), rows, local);
        fwd_.embed(model_.embed(copy_locator(blk_plus_, tok_plus_)), local.data(), pos.data(),
                   rows, h_plus_[j]);
        fwd_.embed(model_.embed(copy_locator(blk_minus_, tok_minus_)), local.data(), pos.data(),
                   rows, h_minus_[j]);
      }
    } else {
      for (int j = 0; j < q; ++j) {
        io_.recv(2 * j, h_plus_[j], rows * C);
        io_.recv(2 * j + 1, h_minus_[j], rows * C);
      }
    }
    // The transformer layers, each resident once for all 2q streams.
    for (int li = li_lo; li < li_hi; ++li) {
      for (int j = 0; j < q; ++j) {
        block_pass(li + 1, first && j == 0, &keys[j], blk_plus_, blk_minus_);
        fwd_.layer(li, model_.layer(li, copy_locator(blk_plus_, nullptr)), h_plus_[j], b.B, b.T,
                   pos.data(), mask.data(), nullptr);
        fwd_.layer(li, model_.layer(li, copy_locator(blk_minus_, nullptr)), h_minus_[j], b.B,
                   b.T, pos.data(), mask.data(), nullptr);
      }
    }
    if (!has_head) {
      for (int j = 0; j < q; ++j) {
        io_.send(2 * j, h_plus_[j], rows * C);
        io_.send(2 * j + 1, h_minus_[j], rows * C);
      }
      continue;
    }
    // A head stage without the embedding keeps its own copy of the tied table up to date (z is
    // regenerated from the seed, so the tied weights never cross ranks).
    if (!has_embed && cfg.tie_embeddings && first) block_pass(0, true, nullptr, nullptr, nullptr);
    // The head: final norm, projections, LM head in vocabulary chunks, NLL of the scored rows.
    for (int j = 0; j < q; ++j) {
      block_pass(nblocks - 1, first && j == 0, &keys[j], blk_plus_, blk_minus_);
      double sp = 0, sm = 0;
      head_sums(keys[j], h_plus_[j], h_minus_[j], rows, micro[mb].targets.data(), sp, sm);
      out.sum_plus[j] += sp;
      out.sum_minus[j] += sm;
    }
    out.count += (double)micro[mb].scored();
  }
  pending_ = PendingUpdate{};  // applied during the first walk
  return out;
}

std::vector<double> ZOEngine::projected_gradients(const QueryLosses& l) const {
  ZOF_CHECK(l.count > 0, "the batch has no scored tokens (every target is masked)");
  std::vector<double> g(l.sum_plus.size());
  for (size_t j = 0; j < g.size(); ++j)
    g[j] = (l.sum_plus[j] - l.sum_minus[j]) / l.count / (2.0 * opt_.eps);
  return g;
}

PendingUpdate ZOEngine::make_update(const ZOStepOptions& opt, uint32_t step, float lr,
                                    const std::vector<double>& g) {
  PendingUpdate u;
  const double q = (double)g.size();
  for (size_t j = 0; j < g.size(); ++j)
    u.terms.push_back(ZOUpdateTerm{ZKey{opt.seed, step, (uint32_t)j}, (float)(lr * g[j] / q)});
  u.lr_wd = lr * opt.weight_decay;
  return u;
}

void ZOEngine::schedule_update(uint32_t step, float lr, const std::vector<double>& g) {
  ZOF_ASSERT(pending_.empty());
  pending_ = make_update(opt_, step, lr, g);
}

void ZOEngine::apply_update(Model& model, Backend& backend, const PendingUpdate& u) {
  if (u.empty()) return;
  auto& params = model.params();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    Param& p = params[pi];
    backend.zo_pass(p.data, p.numel, (uint32_t)pi, 0, u.terms.data(), (int)u.terms.size(),
                    p.decay ? u.lr_wd : 0.f, nullptr, 0.f, nullptr, nullptr);
  }
}

void ZOEngine::set_stage(int first, int last, StageIO io) {
  const int nblocks = (int)model_.blocks().size();
  ZOF_ASSERT(0 <= first && first <= last && last < nblocks);
  ZOF_ASSERT(first == 0 || io.recv);
  ZOF_ASSERT(last == nblocks - 1 || io.send);
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

void ZOEngine::flush() {
  if (first_block_ == 0 && last_block_ < 0) {
    apply_update(model_, be_, pending_);
  } else if (!pending_.empty()) {
    const auto& blocks = model_.blocks();
    for (int b = 0; b < (int)blocks.size(); ++b)
      if (owns_block(b)) block_pass(b, true, nullptr, nullptr, nullptr);
  }
  pending_ = PendingUpdate{};
}

double ZOEngine::loss(const std::vector<LossBatch>& micro) {
  flush();
  double sum = 0, count = 0;
  for (const auto& lb : micro) {
    std::vector<float> nll(lb.batch.B * lb.batch.T);
    fwd_.nll(lb.batch, lb.targets.data(), nll.data());
    for (float x : nll) sum += x;
    count += (double)lb.scored();
  }
  ZOF_CHECK(count > 0, "the batch has no scored tokens");
  return sum / count;
}

}  // namespace zof
