// From examples to forward passes: tokenising prompt + answer with the loss on the answer only,
// text windows, the resumable batch sampler, and MeZO's evaluation by candidate scoring.
#include "zof/data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "zof/error.h"

namespace zof {

namespace {

constexpr uint32_t kStreamEpoch = 4;

// MeZO's .strip(' '): spaces only, so the newline that ends RTE/CB prompts stays.
std::string strip_spaces(const std::string& s) {
  const size_t b = s.find_first_not_of(' ');
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(' ') - b + 1);
}

// One forward sequence and the (position, target) pairs it scores, each credited to a unit (a
// candidate of an example, or a completion): pos[i] predicts target[i] for unit[i].
struct ScoredSeq {
  std::vector<int32_t> ids;
  std::vector<int32_t> pos, target;
  std::vector<int64_t> unit;
};

// A tokenized prompt + answer as one sequence scoring the answer's tokens, for unit u.
ScoredSeq answer_seq(const TokenizedExample& t, int64_t u) {
  ScoredSeq s;
  s.ids = t.ids;
  for (int64_t i = std::max<int64_t>(t.cand_start, 1); i < (int64_t)t.ids.size(); ++i) {
    s.pos.push_back((int32_t)(i - 1));
    s.target.push_back(t.ids[i]);
    s.unit.push_back(u);
  }
  return s;
}

// Whether candidates differ only in one last token (SST-2's " great" / " terrible", RTE's and CB's
// "Yes" / "No" / "Maybe" with GPT-2's or SmolLM2's tokenizer); if so they run as one sequence
// (shared_prompt_seq): the shared tokens, with every candidate's token scored at the last
// position. The same log-probabilities as one sequence each (a position sees only the tokens
// before it), in a forward of one sequence instead of one per candidate.
bool one_token_apart(const std::vector<TokenizedExample>& c) {
  if (c.size() < 2) return false;
  const size_t L = c[0].ids.size();
  if (L < 2) return false;
  for (const TokenizedExample& t : c)
    if (t.ids.size() != L || t.cand_start != (int64_t)L - 1 ||
        !std::equal(t.ids.begin(), t.ids.end() - 1, c[0].ids.begin()))
      return false;
  return true;
}

// The shared sequence of candidates one_token_apart, candidate c credited to unit first_unit + c.
bool shared_prompt_seq(const std::vector<TokenizedExample>& c, int64_t first_unit, ScoredSeq& out) {
  if (!one_token_apart(c)) return false;
  const size_t L = c[0].ids.size();
  out = ScoredSeq{};
  out.ids.assign(c[0].ids.begin(), c[0].ids.end() - 1);
  for (size_t k = 0; k < c.size(); ++k) {
    out.pos.push_back((int32_t)(L - 2));
    out.target.push_back(c[k].ids[L - 1]);
    out.unit.push_back(first_unit + (int64_t)k);
  }
  return true;
}

// The right-padded LossBatch of seqs, in order, with their pairs; units must come in order, each
// unit's pairs consecutive. cand_end: where each unit's pairs end (if given).
LossBatch batch_of(const std::vector<ScoredSeq>& seqs, int32_t pad_id,
                   std::vector<int32_t>* cand_end) {
  std::vector<std::vector<int32_t>> ids;
  ids.reserve(seqs.size());
  for (const ScoredSeq& q : seqs) ids.push_back(q.ids);
  LossBatch lb;
  lb.batch = Batch::from_sequences(ids, pad_id);
  const int64_t T = lb.batch.T;
  int64_t unit = -1;
  for (size_t r = 0; r < seqs.size(); ++r)
    for (size_t k = 0; k < seqs[r].pos.size(); ++k) {
      if (cand_end && seqs[r].unit[k] != unit) {
        ZOF_ASSERT(seqs[r].unit[k] == unit + 1);
        unit = seqs[r].unit[k];
        cand_end->push_back((int32_t)lb.score_rows.size());
      }
      lb.score_rows.push_back((int32_t)(r * T + seqs[r].pos[k]));
      lb.score_targets.push_back(seqs[r].target[k]);
    }
  if (cand_end && !cand_end->empty()) {  // from where each unit starts to where it ends
    cand_end->erase(cand_end->begin());
    cand_end->push_back((int32_t)lb.score_rows.size());
  }
  return lb;
}

// Sums of log-likelihoods of each unit's scored tokens: out_sum[u], out_count[u] (n_units).
// Packs sequences, longest first, into forwards of at most batch_rows tokens, back to back with
// no padding (Batch::pack's layout, the training walk's): on the CPU a sequence's scores are then
// the same bits whatever else is evaluated with it.
void score_sequences(Forward& fwd, const std::vector<ScoredSeq>& seqs, int64_t n_units,
                     int64_t batch_rows, std::vector<double>& out_sum,
                     std::vector<int64_t>& out_count, int64_t* tokens = nullptr) {
  if (tokens) {
    *tokens = 0;
    for (const ScoredSeq& q : seqs) *tokens += (int64_t)q.ids.size();
  }
  out_sum.assign(n_units, 0.0);
  out_count.assign(n_units, 0);
  std::vector<int64_t> order(seqs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return seqs[a].ids.size() > seqs[b].ids.size();
  });
  std::vector<float> nll;
  std::vector<int32_t> rows, targets;
  size_t i0 = 0;
  while (i0 < order.size()) {
    const int64_t T = (int64_t)seqs[order[i0]].ids.size();  // the longest of this forward
    ZOF_CHECK(T <= batch_rows, "a sequence of " + std::to_string(T) +
                                   " tokens does not fit the evaluation batch of " +
                                   std::to_string(batch_rows) + " tokens; raise the batch");
    std::vector<std::vector<int32_t>> part;
    int64_t used = 0;
    size_t i1 = i0;
    for (; i1 < order.size(); ++i1) {
      const std::vector<int32_t>& ids = seqs[order[i1]].ids;
      if (used + (int64_t)ids.size() > batch_rows) break;
      part.push_back(ids);
      used += (int64_t)ids.size();
    }
    if (used == 1) part.push_back(part[0]);  // one token: run it twice, the products at two rows
    const Batch batch = Batch::from_sequences(part).pack();
    rows.clear();
    targets.clear();
    for (size_t r = i0; r < i1; ++r) {
      const ScoredSeq& s = seqs[order[r]];
      for (size_t k = 0; k < s.pos.size(); ++k) {
        rows.push_back((int32_t)batch.row((int64_t)(r - i0), s.pos[k]));
        targets.push_back(s.target[k]);
      }
    }
    nll.resize(rows.size());
    fwd.nll_at(batch, rows.data(), targets.data(), (int64_t)rows.size(), nll.data());
    size_t at = 0;
    for (size_t r = i0; r < i1; ++r) {
      const ScoredSeq& s = seqs[order[r]];
      for (size_t k = 0; k < s.pos.size(); ++k, ++at) {
        out_sum[s.unit[k]] -= (double)nll[at];
        ++out_count[s.unit[k]];
      }
    }
    i0 = i1;
  }
}

}  // namespace

// ---- tokenisation -----------------------------------------------------------------------------

TokenizedExample tokenize_example(const Tokenizer& tok, const std::string& prompt,
                                  const std::string& candidate, int64_t max_len, int64_t index,
                                  const std::string& where) {
  ZOF_CHECK(max_len >= 2, "--seq-len must be at least 2");
  TokenizedExample e;
  e.ids = tok.encode(strip_spaces(prompt + candidate), true);
  const std::vector<int32_t> p = tok.encode(strip_spaces(prompt), true);
  size_t lcp = 0;
  while (lcp < p.size() && lcp < e.ids.size() && p[lcp] == e.ids[lcp]) ++lcp;
  e.cand_start = (int64_t)lcp;
  const int64_t n = (int64_t)e.ids.size(), n_cand = n - e.cand_start;
  const std::string at = where.empty() ? "example " + std::to_string(index) : where;
  // An example read from a file is a run's (its limit is --seq-len); one built in code names the
  // max_len argument as the unit tests expect (tests/unit/test_data.cpp).
  const std::string limit = where.empty() ? "--max-len" : "--seq-len";
  ZOF_CHECK(n_cand >= 1, at + ": the answer \"" + candidate +
                             "\" has no tokens of its own after the prompt; give it some text");
  ZOF_CHECK(n_cand < max_len, at + ": the answer alone is " + std::to_string(n_cand) +
                                  " tokens, which leaves no room for the prompt in " + limit +
                                  " " + std::to_string(max_len) + "; raise " + limit +
                                  " or shorten the answer");
  if (n > max_len) {
    // Cut the prompt on the left, keeping BOS, as MeZO does (demonstrations matter least).
    const bool bos = tok.bos_id() >= 0 && e.ids[0] == tok.bos_id();
    std::vector<int32_t> ids;
    if (bos) ids.push_back(e.ids[0]);
    ids.insert(ids.end(), e.ids.end() - (max_len - (bos ? 1 : 0)), e.ids.end());
    e.cand_start -= n - max_len;
    e.ids = std::move(ids);
    e.truncated = true;
  }
  return e;
}

std::vector<TokenizedExample> tokenize_examples(const Tokenizer& tok,
                                                const std::vector<Example>& examples,
                                                int64_t max_len, int64_t* truncated) {
  std::vector<TokenizedExample> out;
  out.reserve(examples.size());
  int64_t cut = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& ex = examples[i];
    ZOF_CHECK(ex.label >= 0 && ex.label < (int)ex.candidates.size(),
              "example " + std::to_string(i) + " has no valid label (" + std::to_string(ex.label) +
                  ") to train on");
    out.push_back(tokenize_example(tok, ex.prompt, ex.candidates[ex.label], max_len, (int64_t)i, ex.where));
    cut += out.back().truncated;
  }
  if (truncated) *truncated = cut;
  return out;
}

LossBatch make_loss_batch(const std::vector<TokenizedExample>& examples,
                          const std::vector<int64_t>& indices, int32_t pad_id) {
  std::vector<ScoredSeq> seqs;
  seqs.reserve(indices.size());
  for (int64_t i : indices) {
    ZOF_ASSERT(i >= 0 && i < (int64_t)examples.size());
    seqs.push_back(answer_seq(examples[i], 0));
  }
  return batch_of(seqs, pad_id, nullptr);
}

std::vector<std::vector<TokenizedExample>> tokenize_candidates(
    const Tokenizer& tok, const std::vector<Example>& examples, int64_t max_len,
    int64_t* truncated) {
  std::vector<std::vector<TokenizedExample>> out(examples.size());
  int64_t cut = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& ex = examples[i];
    ZOF_CHECK(ex.label >= 0 && ex.label < (int)ex.candidates.size(),
              "example " + std::to_string(i) + " has no valid label (" + std::to_string(ex.label) +
                  ") to train on");
    bool any_cut = false;
    for (const std::string& c : ex.candidates) {
      out[i].push_back(tokenize_example(tok, ex.prompt, c, max_len, (int64_t)i, ex.where));
      any_cut = any_cut || out[i].back().truncated;
    }
    cut += any_cut;
  }
  if (truncated) *truncated = cut;
  return out;
}

LossBatch make_choice_batch(const std::vector<std::vector<TokenizedExample>>& candidates,
                            const std::vector<int>& labels, const std::vector<int64_t>& indices,
                            int32_t pad_id) {
  std::vector<ScoredSeq> seqs;
  std::vector<LossBatch::Choice> choices;
  int64_t unit = 0;
  for (int64_t i : indices) {
    ZOF_ASSERT(i >= 0 && i < (int64_t)candidates.size() && i < (int64_t)labels.size());
    const std::vector<TokenizedExample>& c = candidates[i];
    choices.push_back({(int32_t)unit, (int32_t)c.size(), labels[i]});
    ScoredSeq shared;
    if (shared_prompt_seq(c, unit, shared)) {
      seqs.push_back(std::move(shared));
    } else {
      for (size_t k = 0; k < c.size(); ++k) {
        seqs.push_back(answer_seq(c[k], unit + (int64_t)k));
        ZOF_ASSERT(!seqs.back().pos.empty());  // tokenize_example keeps a candidate token
      }
    }
    unit += (int64_t)c.size();
  }
  std::vector<int32_t> cand_end;
  LossBatch lb = batch_of(seqs, pad_id, &cand_end);
  lb.cand_end = std::move(cand_end);
  lb.choices = std::move(choices);
  return lb;
}

LossBatch pad_loss_batch(LossBatch lb, int64_t T, int32_t pad_id) {
  const int64_t B = lb.batch.B, T0 = lb.batch.T;
  if (T0 == T) return lb;
  ZOF_ASSERT(T0 < T);
  std::vector<int32_t> ids(B * T, pad_id);
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(lb.batch.ids.begin() + b * T0, T0, ids.begin() + b * T);
  lb.batch.ids = std::move(ids);
  lb.batch.T = T;
  for (int32_t& r : lb.score_rows) r = (int32_t)(r / T0 * T + r % T0);
  return lb;
}

LossBatch pack_loss_batch(LossBatch lb) {
  if (lb.batch.packed()) return lb;
  const int64_t T = lb.batch.T;
  Batch p = lb.batch.pack();
  for (int32_t& r : lb.score_rows) {
    ZOF_ASSERT(r % T < lb.batch.lengths[size_t(r / T)]);
    r = (int32_t)p.row(r / T, r % T);
  }
  lb.batch = std::move(p);
  return lb;
}

int64_t choice_length(const std::vector<TokenizedExample>& candidates) {
  if (one_token_apart(candidates)) return (int64_t)candidates[0].ids.size() - 1;
  int64_t n = 0;
  for (const TokenizedExample& t : candidates) n = std::max<int64_t>(n, (int64_t)t.ids.size());
  return n;
}

// ---- text ---------------------------------------------------------------------------------------

TextData load_text(const std::string& path, const Tokenizer& tok, int64_t seq_len,
                   double eval_fraction) {
  ZOF_CHECK(seq_len >= 2, "--seq-len must be at least 2");
  check_input_file("--data", path, "--task text reads one plain-text file");
  std::ifstream f(path, std::ios::binary);
  ZOF_CHECK(f.good(), path + ": cannot open for reading");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<int32_t> tokens = tok.encode(ss.str(), false);
  const int32_t bos = tok.bos_id();
  const int64_t body = seq_len - (bos >= 0 ? 1 : 0);
  std::vector<std::vector<int32_t>> windows;
  for (size_t i = 0; i < tokens.size(); i += body) {
    std::vector<int32_t> w;
    if (bos >= 0) w.push_back(bos);
    w.insert(w.end(), tokens.begin() + i, tokens.begin() + std::min(tokens.size(), i + body));
    if (w.size() >= 2) windows.push_back(std::move(w));
  }
  ZOF_CHECK(windows.size() >= 2, path + ": " + std::to_string(tokens.size()) + " tokens make " +
                                     std::to_string(windows.size()) + " window(s) of --seq-len " +
                                     std::to_string(seq_len) +
                                     "; --task text needs at least 2 (one held out), so " +
                                     "use a longer text or a shorter --seq-len");
  ZOF_CHECK(eval_fraction > 0 && eval_fraction < 1, "the eval fraction must be between 0 and 1");
  const int64_t nw = (int64_t)windows.size();
  const int64_t n_eval = std::clamp<int64_t>((int64_t)std::llround(nw * eval_fraction), 1, nw - 1);
  TextData d;
  d.tokens = (int64_t)tokens.size();
  d.train.assign(windows.begin(), windows.end() - n_eval);
  d.eval.assign(windows.end() - n_eval, windows.end());
  return d;
}

LossBatch make_text_batch(const std::vector<std::vector<int32_t>>& windows,
                          const std::vector<int64_t>& indices, int32_t pad_id) {
  std::vector<std::vector<int32_t>> seqs;
  for (int64_t i : indices) {
    ZOF_ASSERT(i >= 0 && i < (int64_t)windows.size());
    seqs.push_back(windows[i]);
  }
  return LossBatch::next_token(Batch::from_sequences(seqs, pad_id));
}

// ---- the sampler ------------------------------------------------------------------------------

BatchSampler::BatchSampler(int64_t n, int64_t batch_size, uint64_t seed)
    : n_(n), B_(batch_size), seed_(seed) {
  ZOF_CHECK(n >= 1, "no training examples to sample batches from");
  ZOF_CHECK(batch_size >= 1, "--batch-size must be at least 1");
}

const std::vector<int64_t>& BatchSampler::perm(int64_t epoch) {
  if (epoch != cached_epoch_) {
    cached_ = sample_indices(n_, n_, seed_, kStreamEpoch, (uint64_t)epoch);
    cached_epoch_ = epoch;
  }
  return cached_;
}

std::vector<int64_t> BatchSampler::batch(int64_t step) {
  ZOF_ASSERT(step >= 0);
  std::vector<int64_t> out;
  out.reserve(B_);
  for (int64_t p = step * B_; p < (step + 1) * B_; ++p) out.push_back(perm(p / n_)[p % n_]);
  return out;
}

int64_t BatchSampler::epoch_of(int64_t step) const { return step * B_ / n_; }

std::vector<int64_t> BatchSampler::rank_slice(const std::vector<int64_t>& batch, int rank,
                                              int ranks) {
  ZOF_ASSERT(ranks >= 1 && rank >= 0 && rank < ranks);
  const int64_t B = (int64_t)batch.size();
  return std::vector<int64_t>(batch.begin() + rank * B / ranks,
                              batch.begin() + (rank + 1) * B / ranks);
}

// ---- evaluation ---------------------------------------------------------------------------------

std::vector<std::vector<double>> candidate_scores(Forward& fwd, const Tokenizer& tok,
                                                  const std::vector<Example>& examples,
                                                  int64_t max_len, int64_t batch_rows,
                                                  int64_t* tokens) {
  ZOF_CHECK(batch_rows >= max_len, "the evaluation batch (" + std::to_string(batch_rows) +
                                       " tokens) must hold one sequence of --seq-len " +
                                       std::to_string(max_len));
  std::vector<ScoredSeq> seqs;
  std::vector<int64_t> first_unit(examples.size() + 1, 0);  // example i's candidates' units
  for (size_t i = 0; i < examples.size(); ++i) {
    first_unit[i + 1] = first_unit[i] + (int64_t)examples[i].candidates.size();
    std::vector<TokenizedExample> c;
    for (const std::string& cand : examples[i].candidates)
      c.push_back(tokenize_example(tok, examples[i].prompt, cand, max_len, (int64_t)i,
                                   examples[i].where));
    ScoredSeq shared;
    if (shared_prompt_seq(c, first_unit[i], shared)) {
      seqs.push_back(std::move(shared));
      continue;
    }
    for (size_t k = 0; k < c.size(); ++k)
      seqs.push_back(answer_seq(c[k], first_unit[i] + (int64_t)k));
  }
  std::vector<double> sum;
  std::vector<int64_t> count;
  score_sequences(fwd, seqs, first_unit.back(), batch_rows, sum, count, tokens);
  std::vector<std::vector<double>> scores(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    scores[i].resize(examples[i].candidates.size());
    for (size_t k = 0; k < scores[i].size(); ++k) {
      const int64_t u = first_unit[i] + (int64_t)k;
      scores[i][k] = count[u] ? sum[u] / (double)count[u] : -INFINITY;
    }
  }
  return scores;
}

double candidate_accuracy(Forward& fwd, const Tokenizer& tok, const std::vector<Example>& examples,
                          int64_t max_len, int64_t batch_rows, std::vector<int>* predictions) {
  ZOF_CHECK(!examples.empty(), "no evaluation examples");
  for (size_t i = 0; i < examples.size(); ++i)
    ZOF_CHECK(examples[i].label >= 0 && examples[i].label < (int)examples[i].candidates.size(),
              "evaluation example " + std::to_string(i) + " has no valid label");
  const auto scores = candidate_scores(fwd, tok, examples, max_len, batch_rows);
  int64_t correct = 0;
  if (predictions) predictions->assign(examples.size(), -1);
  for (size_t i = 0; i < examples.size(); ++i) {
    const auto& s = scores[i];
    const int pred = (int)(std::max_element(s.begin(), s.end()) - s.begin());  // first on ties
    correct += pred == examples[i].label;
    if (predictions) (*predictions)[i] = pred;
  }
  return (double)correct / (double)examples.size();
}

PerplexityResult completion_nll(Forward& fwd, const Tokenizer& tok,
                                const std::vector<Example>& examples, int64_t max_len,
                                int64_t batch_rows) {
  ZOF_CHECK(!examples.empty(), "no evaluation examples");
  ZOF_CHECK(batch_rows >= max_len, "the evaluation batch (" + std::to_string(batch_rows) +
                                       " tokens) must hold one sequence of --seq-len " +
                                       std::to_string(max_len));
  const auto tokenized = tokenize_examples(tok, examples, max_len);
  std::vector<ScoredSeq> seqs;
  for (size_t i = 0; i < tokenized.size(); ++i)
    seqs.push_back(answer_seq(tokenized[i], (int64_t)i));
  std::vector<double> sum;
  std::vector<int64_t> count;
  score_sequences(fwd, seqs, (int64_t)seqs.size(), batch_rows, sum, count);
  PerplexityResult r;
  double total = 0;
  for (size_t k = 0; k < seqs.size(); ++k) {
    total -= sum[k];
    r.tokens += count[k];
  }
  ZOF_CHECK(r.tokens > 0, "the evaluation completions have no scored tokens");
  r.windows = (int64_t)examples.size();
  r.nll = total / (double)r.tokens;
  r.ppl = std::exp(r.nll);
  return r;
}

PerplexityResult windows_nll(Forward& fwd, const std::vector<std::vector<int32_t>>& windows,
                             int64_t batch_rows) {
  ZOF_CHECK(!windows.empty(), "no evaluation windows");
  PerplexityResult r;
  double total = 0;
  std::vector<float> nll;
  size_t w0 = 0;
  while (w0 < windows.size()) {
    int64_t rows = 0;
    size_t w1 = w0;
    // Greedy packing in order: as many windows as their tokens fit the batch's rows (a packed
    // batch has no padding, so a short last window takes only its own).
    while (w1 < windows.size()) {
      const int64_t T = (int64_t)windows[w1].size();
      ZOF_CHECK(T <= batch_rows, "a window of " + std::to_string(T) +
                                     " tokens does not fit the evaluation batch of " +
                                     std::to_string(batch_rows) + " tokens");
      if (rows + T > batch_rows && w1 > w0) break;
      rows += T;
      ++w1;
    }
    std::vector<std::vector<int32_t>> part(windows.begin() + w0, windows.begin() + w1);
    const Batch b = Batch::from_sequences(part).pack();  // the short last window unpadded
    fwd.next_token_nll(b, nll);
    for (int64_t i = 0; i < b.B; ++i)
      for (int64_t t = 0; t + 1 < b.lengths[i]; ++t) {
        total += nll[b.row(i, t)];
        ++r.tokens;
      }
    w0 = w1;
  }
  r.windows = (int64_t)windows.size();
  r.nll = total / (double)r.tokens;
  r.ppl = std::exp(r.nll);
  return r;
}

}  // namespace zof
