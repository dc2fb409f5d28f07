// Packed batches (Batch::pack, the training walk's layout): sequences back to back with no
// padding, every matrix product over real tokens only, attention per sequence at its own length.
// A sequence's values do not depend on what else the batch holds: bit for bit alone, in any
// company and order, split into micro-batches any way; against the padded layout within the
// dtype's tolerance (the kernels' blocking follows the sequence length), and on the scalar
// reference, whose loops do not block, bit for bit.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common.h"
#include "model/scored_rows.h"
#include "zo/jvp.h"
#include "zof/backend.h"
#include "zof/data.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/loss.h"
#include "zof/model.h"
#include "zof/zo.h"

namespace {

std::string model_dir() { return zof::test::assets_dir() + "/models/stories260K"; }

// Sequences of assorted lengths (one of a single token, one of the model's whole context),
// their tokens from a fixed stream over the vocabulary.
std::vector<std::vector<int32_t>> assorted(int64_t vocab, int64_t context) {
  std::vector<std::vector<int32_t>> s;
  uint64_t x = 12345;
  for (int64_t len : std::initializer_list<int64_t>{23, 2, 1, 40, 9, context, 17, 31}) {
    std::vector<int32_t> t;
    for (int64_t i = 0; i < len; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t.push_back((int32_t)((x >> 33) % (uint64_t)vocab));
    }
    s.push_back(std::move(t));
  }
  return s;
}

std::vector<std::vector<int32_t>> pick(const std::vector<std::vector<int32_t>>& s,
                                       std::vector<int> idx) {
  std::vector<std::vector<int32_t>> out;
  for (int i : idx) out.push_back(s[size_t(i)]);
  return out;
}

// Next-token NLL of sequence i of a batch, in token order.
std::vector<float> rows_of(const zof::Batch& b, const std::vector<float>& nll, int64_t i) {
  std::vector<float> out;
  for (int64_t t = 0; t < b.lengths[size_t(i)]; ++t) out.push_back(nll[size_t(b.row(i, t))]);
  return out;
}

}  // namespace

TEST(Packed, PackMovesTheSequencesBackToBack) {
  const zof::Batch p = zof::Batch::from_sequences({{5, 6, 7}, {8}, {9, 10}}, 0);
  ASSERT_FALSE(p.packed());
  EXPECT_EQ(p.rows(), 9);
  const zof::Batch k = p.pack();
  ASSERT_TRUE(k.packed());
  EXPECT_EQ(k.B, 3);
  EXPECT_EQ(k.T, 3);
  EXPECT_EQ(k.rows(), 6);
  EXPECT_EQ(k.ids, (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(k.starts, (std::vector<int32_t>{0, 3, 4, 6}));
  EXPECT_EQ(k.row(2, 1), 5);
  EXPECT_EQ(p.row(2, 1), 7);
  // The pairs move with their tokens.
  zof::LossBatch lb = zof::LossBatch::next_token(p);
  const zof::LossBatch packed = zof::pack_loss_batch(lb);
  EXPECT_EQ(lb.score_rows, (std::vector<int32_t>{0, 1, 6}));
  EXPECT_EQ(packed.score_rows, (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(packed.score_targets, lb.score_targets);
  EXPECT_EQ(zof::LossBatch::next_token(k).score_rows, packed.score_rows);
}

TEST(Packed, InconsistentLayoutsAreRefused) {
  zof::Model model = zof::Model::load(model_dir());
  const zof::Batch good = zof::Batch::from_sequences({{5, 6, 7}, {8}, {9, 10}}, 0).pack();
  auto refused = [&](zof::Batch b, const char* what) {
    zof::LossBatch lb = zof::LossBatch::next_token(good);
    lb.batch = std::move(b);
    EXPECT_THROW(zof::check_loss_batches({lb}, model.config(), 64, "the test"), zof::Error)
        << what;
  };
  zof::check_loss_batches({zof::LossBatch::next_token(good)}, model.config(), 64, "the test");
  zof::Batch b = good;
  b.starts[2] = 5;
  refused(b, "a start off its length");
  b = good;
  b.starts.pop_back();
  refused(b, "starts missing one");
  b = good;
  b.ids.push_back(3);
  refused(b, "more ids than rows");
  b = good;
  b.lengths[1] = 0, b.starts = {0, 3, 3, 5};
  refused(b, "an empty sequence");
  b = good;
  b.T = 2;
  refused(b, "a length past T");
  // The forward's own entry checks the layout before writing positions by it.
  auto be = zof::test::cpu_backend(1);
  zof::Forward fwd(model, *be, 64);
  b = good;
  b.starts = {0, 1, 2, 3}, b.ids.resize(3);  // rows 3, lengths 3 + 1 + 2
  std::vector<float> nll;
  EXPECT_THROW(fwd.next_token_nll(b, nll), zof::Error);
  fwd.next_token_nll(good, nll);
  EXPECT_EQ((int64_t)nll.size(), good.rows());
}

// Forward: each sequence's NLL in a packed batch equals its NLL alone, bit for bit, in fp32 and
// bf16 products and on 1 and 2 threads; against the padded batch within the products' tolerance.
TEST(Packed, ASequenceIsComputedAsItselfInAnyBatch) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  zof::Model model = zof::Model::load(model_dir());
  const auto& cfg = model.config();
  const auto seqs = assorted(cfg.vocab_size, cfg.max_position);
  const zof::Batch padded = zof::Batch::from_sequences(seqs);
  const zof::Batch packed = padded.pack();
  const zof::Batch shuffled = zof::Batch::from_sequences(pick(seqs, {5, 3, 0, 7, 1, 6, 2, 4})).pack();
  const int at[] = {2, 4, 6, 1, 7, 0, 5, 3};  // where shuffled holds sequence i
  ASSERT_LT(packed.rows(), padded.rows() / 2);
  for (zof::DType ct : {zof::DType::F32, zof::DType::BF16})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(zof::dtype_name(ct)) + ", " + std::to_string(threads) + " threads");
      auto be = zof::test::cpu_backend(threads);
      zof::Forward fwd(model, *be, padded.rows());
      fwd.set_compute(ct);
      std::vector<float> a, p, s, one;
      fwd.next_token_nll(packed, a);
      fwd.next_token_nll(padded, p);
      fwd.next_token_nll(shuffled, s);
      ASSERT_EQ((int64_t)a.size(), packed.rows());
      const double tol = ct == zof::DType::F32 ? 2e-5 : 2e-2;
      for (int64_t i = 0; i < packed.B; ++i) {
        fwd.next_token_nll(zof::Batch::from_sequences({seqs[size_t(i)]}).pack(), one);
        EXPECT_EQ(rows_of(packed, a, i), one) << "sequence " << i << " alone";
        EXPECT_EQ(rows_of(shuffled, s, at[i]), one) << "sequence " << i << " reordered";
        const std::vector<float> q = rows_of(padded, p, i);
        for (size_t t = 0; t + 1 < q.size(); ++t)
          EXPECT_NEAR(q[t], one[t], tol * std::max(1.f, std::fabs(one[t])))
              << "sequence " << i << " token " << t << " padded";
      }
    }
  // The scalar reference does not block: packed and padded are the same arithmetic.
  auto ref = zof::test::reference_backend();
  zof::Forward fwd(model, *ref, padded.rows());
  std::vector<float> a, p;
  fwd.next_token_nll(packed, a);
  fwd.next_token_nll(padded, p);
  for (int64_t i = 0; i < packed.B; ++i) {
    std::vector<float> q = rows_of(padded, p, i), k = rows_of(packed, a, i);
    q.pop_back(), k.pop_back();  // the last token predicts nothing
    EXPECT_EQ(q, k) << "sequence " << i;
  }
}

// Forward::logits: a batch whose last head chunk holds one row (kHeadChunk + 1 rows) gives that
// row the logits it has in any other batch; a product of one row is the matmul's decoding path,
// so the chunk runs it with the row before it.
TEST(Packed, ALoneRowInTheLastHeadChunkHasItsLogitsOfAnyBatch) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  zof::Model model = zof::Model::load(model_dir());
  const auto& cfg = model.config();
  const auto s = assorted(cfg.vocab_size, cfg.max_position);
  std::vector<int32_t> a(s[5].begin(), s[5].begin() + zof::kHeadChunk);  // fills one chunk
  const zof::Batch first = zof::Batch::from_sequences({a, s[2]}).pack();  // s[2]: one token
  const zof::Batch second = zof::Batch::from_sequences({s[2], s[0]}).pack();
  ASSERT_EQ(first.rows(), zof::kHeadChunk + 1);
  for (zof::DType ct : {zof::DType::F32, zof::DType::BF16}) {
    SCOPED_TRACE(zof::dtype_name(ct));
    auto be = zof::test::cpu_backend(2);
    zof::Forward fwd(model, *be, first.rows());
    fwd.set_compute(ct);
    std::vector<float> l1, l2;
    fwd.logits(first, l1);
    fwd.logits(second, l2);
    const int64_t V = cfg.vocab_size, r = first.row(1, 0);
    EXPECT_EQ(std::vector<float>(l1.begin() + r * V, l1.begin() + (r + 1) * V),
              std::vector<float>(l2.begin(), l2.begin() + V));
  }
}

// The SPSA dual walk and the JVP walk: a step's packed batch split into micro-batches any way
// (one of them scoring a single pair) gives the one batch's sums bit for bit; the padded batch's
// within fp32.
TEST(Packed, MicroBatchesOfAPackedStepSumToTheOneBatch) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  zof::Model model = zof::Model::load(model_dir());
  const auto& cfg = model.config();
  const auto seqs = assorted(cfg.vocab_size, cfg.max_position);
  auto lb = [&](std::vector<int> idx) {
    return zof::pack_loss_batch(zof::LossBatch::next_token(zof::Batch::from_sequences(pick(seqs, idx))));
  };
  const zof::LossBatch whole = lb({0, 1, 2, 3, 4, 5, 6, 7});
  // Sequence 1 alone scores one pair: a lone row through the LM head.
  const std::vector<zof::LossBatch> split = {lb({6}), lb({1}), lb({3, 0, 7, 2}), lb({5, 4})};
  ASSERT_EQ(split[1].scored(), 1);
  const zof::LossBatch padded = zof::LossBatch::next_token(zof::Batch::from_sequences(seqs));
  auto be = zof::test::cpu_backend(2);
  zof::ZOStepOptions o;
  o.eps = 1e-2f;
  o.seed = 11;
  zof::ZOEngine eng(model, *be, padded.batch.rows(), o);
  const zof::QueryLosses a = eng.perturbed_losses(0, {whole});
  const zof::QueryLosses b = eng.perturbed_losses(0, split);
  const zof::QueryLosses c = eng.perturbed_losses(0, {padded});
  EXPECT_EQ(a.count, (double)whole.scored());
  EXPECT_EQ(b.count, a.count);
  EXPECT_EQ(b.sum_plus[0], a.sum_plus[0]);
  EXPECT_EQ(b.sum_minus[0], a.sum_minus[0]);
  EXPECT_NEAR(c.sum_plus[0], a.sum_plus[0], 1e-5 * a.sum_plus[0]);
  EXPECT_NEAR(c.sum_minus[0], a.sum_minus[0], 1e-5 * a.sum_minus[0]);
  EXPECT_GT(std::fabs(a.sum_plus[0] - a.sum_minus[0]), 1e-4) << "z should move the loss";
  EXPECT_NEAR(eng.loss({whole}), eng.loss({padded}), 1e-5 * eng.loss({padded}));
  EXPECT_EQ(eng.loss(split), eng.loss({whole}));

  zof::JVPEstimator jvp(model, *be, padded.batch.rows(), 2);
  const std::vector<zof::ZKey> keys{{11, 0, 0}, {11, 0, 1}};
  const zof::JVPSums ja = jvp.directional_derivatives(keys, {whole});
  const zof::JVPSums jb = jvp.directional_derivatives(keys, split);
  const zof::JVPSums jc = jvp.directional_derivatives(keys, {padded});
  EXPECT_EQ(jb.sum_loss, ja.sum_loss);
  EXPECT_NEAR(jc.sum_loss, ja.sum_loss, 1e-5 * ja.sum_loss);
  for (size_t j = 0; j < keys.size(); ++j) {
    EXPECT_EQ(jb.sum_dir[j], ja.sum_dir[j]) << "direction " << j;
    EXPECT_NEAR(jc.sum_dir[j], ja.sum_dir[j], 1e-4 * std::fabs(ja.sum_dir[j]) + 1e-6)
        << "direction " << j;
  }
}
