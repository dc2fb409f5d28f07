// MeZO's evaluation on the real stories260K model: candidate scores checked against an independent
// per-sequence computation, the model's obvious favourites predicted, and training targets that
// score exactly the answer's tokens.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "common.h"
#include "zof/backend.h"
#include "zof/data.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/model.h"
#include "zof/perplexity.h"
#include "util/philox.h"
#include "zof/tokenizer.h"
#include "zof/zo.h"

namespace {

std::string model_dir() { return zof::test::assets_dir() + "/models/stories260K"; }

// The average log-likelihood of candidate's tokens given prompt, computed the long way: the full
// sequence alone through next_token_nll, then the candidate positions averaged by hand.
double score_by_hand(zof::Forward& fwd, const zof::Tokenizer& tok, const std::string& prompt,
                     const std::string& candidate) {
  const std::vector<int32_t> full = tok.encode(prompt + candidate, true);
  const std::vector<int32_t> p = tok.encode(prompt, true);
  // These hand-made examples are chosen so that the prompt's tokens are a prefix of the full
  // text's (stories260K: every candidate starts a new word).
  EXPECT_TRUE(p.size() < full.size() && std::equal(p.begin(), p.end(), full.begin()))
      << prompt << candidate;
  const zof::Batch b = zof::Batch::from_sequences({full});
  std::vector<float> nll;
  fwd.next_token_nll(b, nll);
  double sum = 0;
  int n = 0;
  for (size_t t = p.size(); t < full.size(); ++t) {  // token t is predicted at position t - 1
    sum -= nll[t - 1];
    ++n;
  }
  return sum / n;
}

std::vector<zof::Example> copa_style() {
  return {
      {"Lily was hungry so ", {"she ate an apple.", "the sky had a dog."}, 0},
      {"The dog was tired because ", {"it ran all day.", "green is a tree."}, 0},
      {"Tom fell down so ", {"he cried.", "the moon was happy and sang."}, 1},  // labelled "wrong"
      {"Once upon a", {" time", " banana"}, 0},
      {"The sun was hot so ", {"they went to the park to play.", "a car."}, 0},
  };
}

}  // namespace

TEST(Scoring, CandidateScoresMatchAHandComputation) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  const zof::Model model = zof::Model::load(model_dir());
  const zof::Tokenizer tok = zof::Tokenizer::load(model_dir());
  auto be = zof::test::cpu_backend(1);
  const int64_t max_len = 32, batch_rows = 48;  // small: several padded forwards
  zof::Forward fwd(model, *be, std::max<int64_t>(batch_rows, 64));
  const auto ex = copa_style();

  std::vector<int> want_pred;
  int64_t want_correct = 0;
  std::vector<std::vector<double>> want(ex.size());
  for (size_t i = 0; i < ex.size(); ++i) {
    for (const auto& c : ex[i].candidates)
      want[i].push_back(score_by_hand(fwd, tok, ex[i].prompt, c));
    int best = 0;
    for (int c = 1; c < (int)want[i].size(); ++c)
      if (want[i][c] > want[i][best]) best = c;
    want_pred.push_back(best);
    want_correct += best == ex[i].label;
  }

  const auto got = zof::candidate_scores(fwd, tok, ex, max_len, batch_rows);
  for (size_t i = 0; i < ex.size(); ++i)
    for (size_t c = 0; c < ex[i].candidates.size(); ++c)
      EXPECT_NEAR(got[i][c], want[i][c], 1e-4 * std::max(1.0, std::fabs(want[i][c])))
          << "example " << i << " candidate " << c;
  std::vector<int> pred;
  const double acc = zof::candidate_accuracy(fwd, tok, ex, max_len, batch_rows, &pred);
  EXPECT_EQ(pred, want_pred);
  EXPECT_DOUBLE_EQ(acc, (double)want_correct / (double)ex.size());
  // The model prefers the sensible endings (its favourites are the labelled answers, and the
  // deliberately mislabelled third example counts as wrong).
  EXPECT_EQ(pred, (std::vector<int>{0, 0, 0, 0, 0}));
  EXPECT_DOUBLE_EQ(acc, 0.8);
}

// The mean log-likelihood of a tokenized example's candidate tokens (its ids as they are, cut
// on the left or not), through its own sequence.
double score_tokenized(zof::Forward& fwd, const zof::TokenizedExample& t) {
  const zof::Batch b = zof::Batch::from_sequences({t.ids});
  std::vector<float> nll;
  fwd.next_token_nll(b, nll);
  double sum = 0;
  int n = 0;
  for (size_t i = std::max<int64_t>(t.cand_start, 1); i < t.ids.size(); ++i, ++n) sum -= nll[i - 1];
  return sum / n;
}

namespace {

// Examples that share one sequence of the prompt (one-token candidates after the same prompt
// tokens) beside ones that must not (candidates of several tokens, even of equal length and a
// common first token; a single candidate), and a prompt cut on the left at 32 tokens.
std::vector<zof::Example> mixed_examples() {
  std::string long_prompt;
  for (int i = 0; i < 6; ++i) long_prompt += "Lily was very happy. ";
  long_prompt += "She went to";
  return {
      {"Once upon a time, there was a", {" little", " big", " happy"}, 0},
      {"Lily was very happy. She went to", {" the", " a"}, 0},
      {"Tom fell down so ", {"he cried.", "a car."}, 0},                 // several tokens each
      {"One day, Tim and", {" his", " her"}, 1},
      {"Once upon a time, there was a", {" the big", " the happy"}, 1},  // " the" common
      {long_prompt, {" the", " a"}, 1},                                  // cut on the left
      {"One day, Tim and", {" his"}, 0},                                 // one candidate
  };
}
const std::vector<bool> kMixedShares = {true, true, false, true, false, true, false};

}  // namespace

// Examples whose candidates are one token each after the same prompt tokens (MeZO's SST-2, RTE
// and CB verbalizers) run as one sequence of the prompt, each candidate scored at its last
// position: the same scores as each candidate's own sequence, beside examples that must not
// share (candidates of several tokens, even of equal length and a common first token; a single
// candidate) and a prompt cut on the left to fit.
TEST(Scoring, OneTokenCandidatesShareOneForwardOfThePrompt) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  const zof::Model model = zof::Model::load(model_dir());
  const zof::Tokenizer tok = zof::Tokenizer::load(model_dir());
  auto be = zof::test::cpu_backend(1);
  const int64_t max_len = 32, batch_rows = 48;
  zof::Forward fwd(model, *be, 64);
  const std::vector<zof::Example> ex = mixed_examples();
  const std::vector<bool>& shares = kMixedShares;
  std::vector<std::vector<zof::TokenizedExample>> t(ex.size());
  int64_t tokens_shared = 0, tokens_separate = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    for (const std::string& c : ex[i].candidates) {
      t[i].push_back(zof::tokenize_example(tok, ex[i].prompt, c, max_len, (int64_t)i, ""));
      tokens_separate += (int64_t)t[i].back().ids.size();
    }
    // The fixture is what it says in this vocabulary: one-token answers where they share.
    for (const auto& x : t[i])
      ASSERT_EQ(x.ids.size() - x.cand_start == 1, shares[i] || i == 6) << "example " << i;
    tokens_shared += shares[i] ? (int64_t)t[i][0].ids.size() - 1
                               : [&] {
                                   int64_t n = 0;
                                   for (const auto& x : t[i]) n += (int64_t)x.ids.size();
                                   return n;
                                 }();
  }
  ASSERT_TRUE(t[5][0].truncated && t[5][1].truncated);
  ASSERT_EQ(t[4][0].ids.size(), t[4][1].ids.size());
  ASSERT_EQ(t[4][0].ids[t[4][0].cand_start], t[4][1].ids[t[4][1].cand_start]);

  int64_t tokens = -1;
  const auto got = zof::candidate_scores(fwd, tok, ex, max_len, batch_rows, &tokens);
  EXPECT_EQ(tokens, tokens_shared);
  EXPECT_LT(tokens_shared + 60, tokens_separate);
  for (size_t i = 0; i < ex.size(); ++i)
    for (size_t c = 0; c < ex[i].candidates.size(); ++c) {
      const double want = i == 5 ? score_tokenized(fwd, t[i][c])
                                 : score_by_hand(fwd, tok, ex[i].prompt, ex[i].candidates[c]);
      EXPECT_NEAR(got[i][c], want, 1e-5 * std::max(1.0, std::fabs(want)))
          << "example " << i << " candidate " << c;
    }
  // A row or target outside the batch (or a target of -1, which nll reads as unscored) is
  // refused, not read.
  const zof::Batch b = zof::Batch::from_sequences({tok.encode("Once upon a", true)});
  float nll = 0;
  const int32_t bad_row = (int32_t)(b.B * b.T), ok_row = 0, ok_tok = 1;
  const int32_t bad_tok = (int32_t)model.config().vocab_size, minus_one = -1;
  EXPECT_THROW(fwd.nll_at(b, &bad_row, &ok_tok, 1, &nll), zof::Error);
  EXPECT_THROW(fwd.nll_at(b, &ok_row, &bad_tok, 1, &nll), zof::Error);
  EXPECT_THROW(fwd.nll_at(b, &ok_row, &minus_one, 1, &nll), zof::Error);
}

// Evaluation packs its forwards as the training walk does: on the CPU an example's candidate
// scores are the same bits evaluated alone, among the others, reordered, or in a forward of
// another size, in fp32 and bf16 products and on 1 and 2 threads (`zof eval --eval-examples 32`
// scores its examples as the full set does). The last example shares a sequence of one token
// (BOS alone), which alone would be a forward of one row, the matmul's decoding path: it runs
// as two. Also on a random model 8x as wide, where that path's sums differ (at stories260K's
// width of 64 they happen not to).
TEST(Scoring, AnExampleScoresTheSameBitsWhateverIsEvaluatedWithIt) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  const zof::Model model = zof::Model::load(model_dir());
  const zof::Tokenizer tok = zof::Tokenizer::load(model_dir());
  zof::ModelConfig wide_cfg = model.config();
  wide_cfg.hidden_size *= 8, wide_cfg.num_heads *= 8, wide_cfg.num_kv_heads *= 8;
  wide_cfg.intermediate_size = 1024;
  const zof::Model wide = zof::Model::random(wide_cfg, 3);
  const int64_t max_len = 32;
  std::vector<zof::Example> ex = mixed_examples();
  ex.push_back({"", {" Once", " The"}, 0});
  ASSERT_EQ(zof::tokenize_example(tok, "", " Once", max_len, 0, "").ids.size(), 2u);
  std::vector<zof::Example> reversed(ex.rbegin(), ex.rend());
  for (const zof::Model* m : {&model, &wide})
    for (zof::DType ct : {zof::DType::F32, zof::DType::BF16})
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(m == &wide ? "wide, " : "") + zof::dtype_name(ct) + ", " +
                     std::to_string(threads) + " threads");
        auto be = zof::test::cpu_backend(threads);
        zof::Forward fwd(*m, *be, 96);
        fwd.set_compute(ct);
        int64_t tokens = 0;
        const auto all = zof::candidate_scores(fwd, tok, ex, max_len, 96, &tokens);
        ASSERT_GT(tokens, 96);  // several forwards, each holding several sequences
        const auto rev = zof::candidate_scores(fwd, tok, reversed, max_len, 40);
        for (size_t i = 0; i < ex.size(); ++i) {
          const auto alone = zof::candidate_scores(fwd, tok, {ex[i]}, max_len, 32);
          EXPECT_EQ(all[i], alone[0]) << "example " << i << " alone";
          EXPECT_EQ(rev[ex.size() - 1 - i], alone[0]) << "example " << i << " reordered";
        }
      }
}

TEST(Scoring, ModelsFavouriteIsPredicted) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  const zof::Model model = zof::Model::load(model_dir());
  const zof::Tokenizer tok = zof::Tokenizer::load(model_dir());
  auto be = zof::test::cpu_backend(1);
  zof::Forward fwd(model, *be, 256);
  const std::vector<zof::Example> ex = {
      {"Once upon a", {" banana", " time"}, 1},
      {"Once upon a", {" time", " banana"}, 0},
      {"Once upon a time, there was a little", {" spaceship", " girl"}, 1},
  };
  std::vector<int> pred;
  EXPECT_DOUBLE_EQ(zof::candidate_accuracy(fwd, tok, ex, 64, 256, &pred), 1.0);
  EXPECT_EQ(pred, (std::vector<int>{1, 0, 1}));
}

TEST(Scoring, TrainingTargetsScoreExactlyTheAnswer) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  const zof::Model model = zof::Model::load(model_dir());
  const zof::Tokenizer tok = zof::Tokenizer::load(model_dir());
  auto be = zof::test::cpu_backend(1);
  zof::Forward fwd(model, *be, 256);
  const auto ex = copa_style();
  const auto t = zof::tokenize_examples(tok, ex, 32);
  const std::vector<int64_t> rows = {0, 1, 2, 3, 4};
  const zof::LossBatch lb = zof::make_loss_batch(t, rows);
  std::vector<float> nll(lb.batch.B * lb.batch.T);
  const std::vector<int32_t> targets = lb.position_targets();
  fwd.nll(lb.batch, targets.data(), nll.data());
  for (size_t i = 0; i < ex.size(); ++i) {
    double sum = 0;
    int64_t n = 0;
    for (int64_t p = 0; p < lb.batch.T; ++p)
      if (targets[i * lb.batch.T + p] >= 0) {
        sum += nll[i * lb.batch.T + p];
        ++n;
      }
    // The loss of a training row is minus the score of its correct candidate.
    const std::string& ans = ex[i].candidates[ex[i].label];
    EXPECT_EQ(n, (int64_t)(t[i].ids.size() - t[i].cand_start));
    EXPECT_NEAR(-sum / n, score_by_hand(fwd, tok, ex[i].prompt, ans), 1e-4) << "example " << i;
  }
  // The completion metric is the same loss, averaged over all answer tokens.
  double total = 0;
  for (size_t k = 0; k < nll.size(); ++k)
    if (targets[k] >= 0) total += nll[k];
  const auto r = zof::completion_nll(fwd, tok, ex, 32, 64);
  EXPECT_EQ(r.tokens, lb.scored());
  EXPECT_NEAR(r.nll, total / (double)lb.scored(), 1e-5);
}

TEST(Scoring, HeldOutWindowsMatchPerplexity) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  const std::string text_path =
      zof::test::assets_dir() + "/data/tinystories/tinystories_sample_cs336.txt";
  ZOF_REQUIRE_PATH(text_path);
  const zof::Model model = zof::Model::load(model_dir());
  const zof::Tokenizer tok = zof::Tokenizer::load(model_dir());
  auto be = zof::test::cpu_backend(1);
  zof::Forward fwd(model, *be, 4 * 64);
  const auto td = zof::load_text(text_path, tok, 64, 0.1);
  std::vector<int32_t> held;  // the held-out windows' text tokens, re-windowed by perplexity()
  for (const auto& w : td.eval) held.insert(held.end(), w.begin() + 1, w.end());
  const auto want = zof::perplexity(fwd, held, tok.bos_id(), 64, 4);
  const auto got = zof::windows_nll(fwd, td.eval, 4 * 64);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.windows, want.windows);
  EXPECT_NEAR(got.nll, want.nll, 1e-5);
  // Each window is a sequence of its own in a packed batch: one window a forward, or as many as
  // fit 4 x 64 rows (the short last one with its neighbours), the same bits.
  const auto alone = zof::windows_nll(fwd, td.eval, 64);
  EXPECT_EQ(alone.tokens, got.tokens);
  EXPECT_EQ(alone.nll, got.nll);
  // A trained model on its own kind of text (about 3.5 on plain TinyStories; this sample's
  // "<|endoftext|>" markers are spelled out in bytes), far below the 512-token vocabulary.
  EXPECT_LT(got.ppl, 30.0);
}

// MeZO's classification objective (--objective classification) against the same loss written
// plainly: each candidate scored alone by the scalar reference backend, the cross-entropy of the
// scores in double. At theta (ZOEngine::loss) and at theta +/- eps z (the perturbed walk, whose
// head sums per-row losses by loss_sum), against the whole model perturbed by hand.
TEST(Scoring, ClassificationObjectiveIsTheCrossEntropyOverCandidateScores) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  zof::Model model = zof::Model::load(model_dir());
  const zof::Tokenizer tok = zof::Tokenizer::load(model_dir());
  auto ref = zof::test::reference_backend();
  auto cpu = zof::test::cpu_backend(1);
  auto ex = copa_style();
  ex.push_back({"Once upon a time, there was a little", {" girl", " spaceship", " banana"}, 2});
  auto by_hand = [&](zof::Model& m) {
    zof::Forward fwd(m, *ref, 256);
    double sum = 0;
    for (const auto& e : ex) {
      std::vector<double> s;
      for (const auto& c : e.candidates) s.push_back(score_by_hand(fwd, tok, e.prompt, c));
      double z = 0;
      for (double x : s) z += std::exp(x);
      sum += std::log(z) - s[e.label];
    }
    return sum / (double)ex.size();
  };
  const auto cands = zof::tokenize_candidates(tok, ex, 64);
  std::vector<int> labels;
  for (const auto& e : ex) labels.push_back(e.label);
  // Two micro-batches: examples 0-2, and 3-5 with the three-way one.
  const std::vector<zof::LossBatch> micro = {zof::make_choice_batch(cands, labels, {0, 1, 2}),
                                             zof::make_choice_batch(cands, labels, {3, 4, 5})};
  EXPECT_EQ(micro[1].choices.size(), 3u);
  EXPECT_EQ(micro[1].choices[2].count, 3);
  EXPECT_EQ(micro[1].units(), 3.0);
  const double want = by_hand(model);
  int64_t rows = 0;
  for (const auto& lb : micro) rows = std::max<int64_t>(rows, lb.batch.B * lb.batch.T);
  zof::ZOStepOptions o;
  o.eps = 1e-2f;
  o.seed = 17;
  zof::ZOEngine eng(model, *cpu, rows, o);
  EXPECT_NEAR(eng.loss(micro), want, 1e-5 * want);
  const zof::QueryLosses ql = eng.perturbed_losses(0, micro);
  EXPECT_EQ(ql.count, (double)ex.size());
  // theta +/- eps z for the whole model, written plainly.
  const std::vector<float> theta(model.storage(), model.storage() + model.storage_size());
  for (int sign : {1, -1}) {
    const zof::ZKey key{o.seed, 0, 0};
    for (size_t pi = 0; pi < model.params().size(); ++pi) {
      const auto& p = model.params()[pi];
      const int64_t off = p.data - model.storage();
      for (int64_t e = 0; e < p.numel; ++e)
        model.storage()[off + e] = (float)((double)theta[off + e] +
                                           sign * (double)o.eps *
                                               zof::z_element(key, (uint32_t)pi, (uint64_t)e));
    }
    const double l = by_hand(model);
    std::copy(theta.begin(), theta.end(), model.storage());
    const double got = (sign > 0 ? ql.sum_plus[0] : ql.sum_minus[0]) / ql.count;
    EXPECT_NEAR(got, l, 1e-5 * l) << "sign " << sign;
    EXPECT_GT(std::fabs(l - want), 1e-5) << "z should move the loss";
  }
}

// The classification objective over candidates that differ in one last token trains on one
// sequence of the shared tokens (make_choice_batch), each candidate scored at its last position:
// the loss at theta and at theta +/- eps z are those of one sequence per candidate (within fp32:
// the batch's shapes differ), both the plain loss written by hand on the scalar reference, and
// packed micro-batches (pack_loss_batch, the training walk's layout) sum to the one packed
// batch's losses bit for bit, and padded ones (pad_loss_batch) to the one padded batch's.
TEST(Scoring, ClassificationOnOneTokenCandidatesTrainsOnOneSequenceOfThePrompt) {
  ZOF_REQUIRE_PATH(model_dir() + "/model.safetensors");
  zof::Model model = zof::Model::load(model_dir());
  const zof::Tokenizer tok = zof::Tokenizer::load(model_dir());
  auto ref = zof::test::reference_backend();
  auto cpu = zof::test::cpu_backend(1);
  std::vector<zof::Example> ex = mixed_examples();
  ex[0].label = 2;
  const std::vector<bool>& shares = kMixedShares;
  const auto cands = zof::tokenize_candidates(tok, ex, 32);
  std::vector<int> labels;
  for (const auto& e : ex) labels.push_back(e.label);
  std::vector<int64_t> all(ex.size());
  std::iota(all.begin(), all.end(), 0);
  const zof::LossBatch shared = zof::make_choice_batch(cands, labels, all);
  // One sequence for each sharing example, one per candidate otherwise; each shared sequence is
  // choice_length long and scores every candidate's last token at its last position.
  int64_t seqs = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    seqs += shares[i] ? 1 : (int64_t)cands[i].size();
    const size_t L = cands[i][0].ids.size();
    EXPECT_EQ(zof::choice_length(cands[i]), shares[i] ? (int64_t)L - 1 : [&] {
      int64_t n = 0;
      for (const auto& c : cands[i]) n = std::max<int64_t>(n, (int64_t)c.ids.size());
      return n;
    }()) << "example " << i;
  }
  ASSERT_EQ(shared.batch.B, seqs);
  ASSERT_EQ(shared.choices.size(), ex.size());
  // The sequences built are as long as choice_length says.
  int64_t longest = 0;
  for (size_t i = 0, row = 0; i < ex.size(); ++i) {
    longest = std::max(longest, zof::choice_length(cands[i]));
    if (shares[i]) {
      EXPECT_EQ(shared.batch.lengths[row++], zof::choice_length(cands[i])) << "example " << i;
      continue;
    }
    for (const auto& c : cands[i])
      EXPECT_EQ(shared.batch.lengths[row++], (int32_t)c.ids.size()) << "example " << i;
  }
  EXPECT_EQ(shared.batch.T, longest);
  const int32_t c0 = shared.choices[0].first;  // example 0: three pairs at one row
  const int32_t r0 = shared.score_rows[c0 ? shared.cand_end[c0 - 1] : 0];
  EXPECT_EQ(r0, (int32_t)cands[0][0].ids.size() - 2);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(shared.score_rows[k], r0);
    EXPECT_EQ(shared.score_targets[k], cands[0][k].ids.back());
  }

  // The same objective with one sequence per candidate, built plainly.
  std::vector<zof::TokenizedExample> flat;
  for (const auto& c : cands) flat.insert(flat.end(), c.begin(), c.end());
  std::vector<int64_t> each(flat.size());
  std::iota(each.begin(), each.end(), 0);
  zof::LossBatch separate = zof::make_loss_batch(flat, each);
  for (const auto& t : flat)
    separate.cand_end.push_back((separate.cand_end.empty() ? 0 : separate.cand_end.back()) +
                                (int32_t)(t.ids.size() - std::max<int64_t>(t.cand_start, 1)));
  separate.choices = shared.choices;
  ASSERT_EQ(separate.cand_end.back(), separate.scored());
  ASSERT_GT(separate.batch.B * separate.batch.T, shared.batch.B * shared.batch.T + 60);

  // The loss written by hand: every candidate alone on the scalar reference.
  double want = 0;
  {
    zof::Forward fwd(model, *ref, 64);
    for (size_t i = 0; i < ex.size(); ++i) {
      std::vector<double> s;
      for (const auto& c : cands[i]) s.push_back(score_tokenized(fwd, c));
      const double top = *std::max_element(s.begin(), s.end());
      double z = 0;
      for (double x : s) z += std::exp(x - top);
      want += top + std::log(z) - s[ex[i].label];
    }
    want /= (double)ex.size();
  }
  const int64_t rows = separate.batch.B * separate.batch.T;
  zof::ZOStepOptions o;
  o.eps = 1e-2f;
  o.seed = 5;
  zof::ZOEngine eng(model, *cpu, rows, o);
  const double got = eng.loss({shared});
  EXPECT_NEAR(got, want, 1e-5 * want);
  EXPECT_NEAR(eng.loss({separate}), want, 1e-5 * want);
  const zof::QueryLosses a = eng.perturbed_losses(0, {shared});
  const zof::QueryLosses b = eng.perturbed_losses(0, {separate});
  EXPECT_EQ(a.count, (double)ex.size());
  EXPECT_EQ(b.count, a.count);
  EXPECT_NEAR(a.sum_plus[0], b.sum_plus[0], 1e-5 * b.sum_plus[0]);
  EXPECT_NEAR(a.sum_minus[0], b.sum_minus[0], 1e-5 * b.sum_minus[0]);
  EXPECT_GT(std::fabs(a.sum_plus[0] - a.sum_minus[0]), 1e-4) << "z should move the loss";

  // Micro-batches of the same step, padded to its longest: the one batch's sums, bit for bit.
  const int64_t T = shared.batch.T;
  const std::vector<zof::LossBatch> micro = {
      zof::pad_loss_batch(zof::make_choice_batch(cands, labels, {0, 1, 5}), T),
      zof::pad_loss_batch(zof::make_choice_batch(cands, labels, {2, 3, 4, 6}), T)};
  ASSERT_TRUE(micro[0].batch.T == T && micro[1].batch.T == T);
  ASSERT_LT(zof::make_choice_batch(cands, labels, {2, 3, 4, 6}).batch.T, T);  // padding moved rows
  const zof::QueryLosses m = eng.perturbed_losses(0, micro);
  EXPECT_EQ(m.count, a.count);
  EXPECT_EQ(m.sum_plus[0], a.sum_plus[0]);
  EXPECT_EQ(m.sum_minus[0], a.sum_minus[0]);
  // Packed, each sequence at its own length: the one packed batch's sums, bit for bit.
  const zof::QueryLosses pa = eng.perturbed_losses(0, {zof::pack_loss_batch(shared)});
  const zof::QueryLosses pm = eng.perturbed_losses(
      0, {zof::pack_loss_batch(zof::make_choice_batch(cands, labels, {6, 1, 5})),
          zof::pack_loss_batch(zof::make_choice_batch(cands, labels, {2, 0, 4, 3}))});
  EXPECT_EQ(pm.count, a.count);
  EXPECT_EQ(pm.sum_plus[0], pa.sum_plus[0]);
  EXPECT_EQ(pm.sum_minus[0], pa.sum_minus[0]);
  EXPECT_NEAR(pa.sum_plus[0], b.sum_plus[0], 1e-5 * b.sum_plus[0]);
}
