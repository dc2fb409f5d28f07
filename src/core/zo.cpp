// The ZO step as a walk over blocks with both perturbed hidden states (see zo.h).
#include "zof/zo.h"

#include <algorithm>
#include <cmath>

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
  const auto& blocks = model_.blocks();
  int64_t span = 0;
  for (size_t b = 1; b < blocks.size(); ++b) span = std::max(span, blocks[b].span);
  for (int j = 0; j < opt.queries; ++j) {
    embed_plus_.push_back((float*)be_.alloc(blocks[0].span * sizeof(float)));
    embed_minus_.push_back((float*)be_.alloc(blocks[0].span * sizeof(float)));
  }
  blk_plus_ = (float*)be_.alloc(std::max<int64_t>(span, 1) * sizeof(float));
  blk_minus_ = (float*)be_.alloc(std::max<int64_t>(span, 1) * sizeof(float));
}

ZOEngine::~ZOEngine() {
  for (float* p : embed_plus_) be_.free(p);
  for (float* p : embed_minus_) be_.free(p);
  be_.free(blk_plus_);
  be_.free(blk_minus_);
}

void ZOEngine::block_pass(int block, bool apply_update, const ZKey* cur, float* plus,
                          float* minus) {
  const Block& blk = model_.blocks()[block];
  auto& params = model_.params();
  const bool upd = apply_update && !pending_.empty();
  for (int pi : blk.params) {
    Param& p = params[pi];
    const int64_t off = (p.data - model_.storage()) - blk.offset;
    be_.zo_pass(p.data, p.numel, (uint32_t)pi, upd ? pending_.terms.data() : nullptr,
                upd ? (int)pending_.terms.size() : 0, p.decay ? pending_.lr_wd : 0.f, cur,
                opt_.eps, plus ? plus + off : nullptr, minus ? minus + off : nullptr);
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

  for (size_t mb = 0; mb < micro.size(); ++mb) {
    const Batch& b = micro[mb].batch;
    const int64_t rows = b.B * b.T;
    ZOF_CHECK(rows <= max_rows_, "batch of " + std::to_string(rows) +
                                     " tokens exceeds the engine's capacity of " +
                                     std::to_string(max_rows_));
    ZOF_ASSERT((int64_t)micro[mb].targets.size() == rows);
    std::vector<int32_t> pos(rows);
    std::vector<uint8_t> mask(rows);
    for (int64_t i = 0; i < b.B; ++i)
      for (int64_t t = 0; t < b.T; ++t) {
        pos[i * b.T + t] = (int32_t)t;
        mask[i * b.T + t] = t < b.lengths[i];
      }
    std::vector<std::vector<float>> hp(q, std::vector<float>(rows * C)),
        hm(q, std::vector<float>(rows * C));
    const bool first = mb == 0;
    // Block 0: the embedding. Its perturbed copies stay for the (tied) head.
    if (has_embed) {
      for (int j = 0; j < q; ++j) {
        block_pass(0, first && j == 0, &keys[j], embed_plus_[j], embed_minus_[j]);
        fwd_.embed(model_.embed(embed_plus_[j]), b.ids.data(), pos.data(), rows, hp[j].data());
        fwd_.embed(model_.embed(embed_minus_[j]), b.ids.data(), pos.data(), rows, hm[j].data());
      }
    } else {
      for (int j = 0; j < q; ++j) {
        io_.recv(2 * j, hp[j].data(), rows * C);
        io_.recv(2 * j + 1, hm[j].data(), rows * C);
      }
    }
    // The transformer layers, each resident once for all 2q streams.
    for (int li = li_lo; li < li_hi; ++li) {
      for (int j = 0; j < q; ++j) {
        block_pass(li + 1, first && j == 0, &keys[j], blk_plus_, blk_minus_);
        fwd_.layer(li, model_.layer(li, blk_plus_), hp[j].data(), b.B, b.T, pos.data(),
                   mask.data(), nullptr);
        fwd_.layer(li, model_.layer(li, blk_minus_), hm[j].data(), b.B, b.T, pos.data(),
                   mask.data(), nullptr);
      }
    }
    if (!has_head) {
      for (int j = 0; j < q; ++j) {
        io_.send(2 * j, hp[j].data(), rows * C);
        io_.send(2 * j + 1, hm[j].data(), rows * C);
      }
      continue;
    }
    // A head stage without the embedding perturbs its own copy of the tied table.
    if (!has_embed && cfg.tie_embeddings)
      for (int j = 0; j < q; ++j)
        block_pass(0, first && j == 0, &keys[j], embed_plus_[j], embed_minus_[j]);
    // The head: final norm, projections, LM head, NLL of the scored positions.
    std::vector<float> nll(rows);
    for (int j = 0; j < q; ++j) {
      block_pass(nblocks - 1, first && j == 0, &keys[j], blk_plus_, blk_minus_);
      for (int sign = 0; sign < 2; ++sign) {
        const float* head = sign == 0 ? blk_plus_ : blk_minus_;
        const float* emb = sign == 0 ? embed_plus_[j] : embed_minus_[j];
        const auto& h = sign == 0 ? hp[j] : hm[j];
        fwd_.head_nll(model_.head(head, model_.embed(emb).tokens), h.data(), rows,
                      micro[mb].targets.data(), nll.data());
        double s = 0;
        for (int64_t r = 0; r < rows; ++r) s += nll[r];
        (sign == 0 ? out.sum_plus : out.sum_minus)[j] += s;
      }
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
    backend.zo_pass(p.data, p.numel, (uint32_t)pi, u.terms.data(), (int)u.terms.size(),
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
