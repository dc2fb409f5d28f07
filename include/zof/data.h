// The data and task layer of `zof finetune`: MeZO's tasks (SST-2, RTE, CB, COPA) with their
// prompts and verbalizers, users' prompt/completion JSONL and plain text; tokenisation into
// LossBatches scored on the answer tokens only; a resumable batch sampler; and MeZO's evaluation
// by candidate scoring (average log-likelihood of each answer's tokens given the prompt).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zof/forward.h"
#include "zof/options.h"
#include "zof/perplexity.h"
#include "zof/tokenizer.h"
#include "zof/loss.h"

namespace zof {

// ---- examples and tasks ---------------------------------------------------------------------

// One example. Classification / multiple choice: candidates are the verbalised answers and label
// the index of the correct one. Prompt/completion data: candidates = {completion}, label = 0.
// The text the model sees for candidate c is prompt + candidates[c] (the separating space, if
// any, is part of the candidate for SST-2 and part of the prompt for COPA, as in MeZO).
// label = -1 only for unlabelled splits read with require_labels = false.
struct Example {
  std::string prompt;
  std::vector<std::string> candidates;
  int label = 0;
  std::string where{};  // "FILE:LINE" it was read from, for messages ("" when built in code)
};

enum class TaskKind {
  Classification,  // sst2, rte, cb, copa: metric = candidate accuracy
  Completion,      // jsonl: metric = mean NLL / perplexity of the completions
  Text,            // text: token windows; metric = held-out perplexity
};

TaskKind task_kind(Task task);

// Reads one file of a task (not "text") into examples with the task's prompts, in file order.
//   sst2:  TSV with a header naming the columns `sentence` and `label` (GLUE); label 0 or 1.
//   rte, cb, copa: SuperGLUE JSONL; labels as strings (entailment, ...) or HF integer ids.
//   jsonl: one {"prompt": ..., "completion": ...} object per line.
// Blank lines are skipped. require_labels = false accepts lines without a label (SuperGLUE test
// files; label -1 there) and gives them label = -1. zof::Error names the file, the 1-based line,
// the field and the fix; a file with no examples is an error.
std::vector<Example> parse_task_file(Task task, const std::string& path,
                                     bool require_labels = true);

struct DataOptions {
  int64_t train_examples = 1000;  // sampled from the train split (all of it if fewer)
  int64_t eval_examples = 500;    // sampled from the eval split (all of it if fewer)
  uint64_t seed = 0;              // sampling seed
  double eval_fraction = 0.1;     // --data is one file: the share held out as the eval split
};

struct TaskData {
  Task task = Task::Text;
  std::vector<Example> train, eval;  // the samples, in sampled order
  std::string train_path, eval_path;
  int64_t train_available = 0, eval_available = 0;  // split sizes before sampling
};

// Loads and samples a task's examples (not "text").
// data_path a directory: the task's standard files, train split from train.tsv (sst2) or
//   train.jsonl, eval split from dev.tsv (sst2) or val.jsonl (dev.jsonl also accepted).
// data_path a file: parsed whole, permuted with sample_indices(n, n, seed, 3) and split: the
//   first max(1, round(n * eval_fraction)) examples of the permutation are the eval split, the
//   rest the train split (at least 2 examples needed).
// Sampling as MeZO's sample_subset: a seeded permutation of the split, then its first k entries
// (without replacement): train k = train_examples with stream 1, eval k = eval_examples with
// stream 2, both keyed by seed. (MeZO uses numpy's permutation; ours is Philox-based, so the same
// seed does not pick the same examples as MeZO.)
TaskData load_task(Task task, const std::string& data_path, const DataOptions& opt);

// The first k entries of a permutation of 0..n-1 that is a pure function of (seed, stream, sub):
// Fisher-Yates driven by Philox4x32-10 keyed by seed. k > n gives all n. Streams: 1 train sample,
// 2 eval sample, 3 single-file split, 4 BatchSampler epochs (sub = epoch).
std::vector<int64_t> sample_indices(int64_t n, int64_t k, uint64_t seed, uint32_t stream,
                                    uint64_t sub = 0);

// ---- tokenisation ---------------------------------------------------------------------------

struct TokenizedExample {
  std::vector<int32_t> ids;  // prompt tokens (BOS first if the tokenizer adds one), then answer
  int64_t cand_start = 0;    // ids[cand_start..] are the candidate's tokens
  bool truncated = false;    // the prompt was cut on the left to fit max_len
};

// The token sequence of prompt + candidate. As MeZO (utils.encode_prompt), the full text is
// encoded at once, so the answer's tokens are those a model sees in running text:
//   full = encode(strip_spaces(prompt + candidate), add_special_tokens = true),
//   cand_start = longest common prefix of full and encode(strip_spaces(prompt), true),
// where strip_spaces removes spaces (only ' ') at both ends, as MeZO's .strip(' '). When the
// prompt's tokens are a prefix of full (the usual case) this equals MeZO's
// option_len = len(full) - len(prompt); a token that merges across the boundary is counted as
// the answer's. Encoding the candidate alone would differ for SentencePiece-style tokenizers
// (the normalizer strips it and prepends "▁").
// Longer than max_len: the prompt is cut on the left, keeping BOS (as MeZO). zof::Error when the
// candidate alone has max_len tokens or more (names `where`, the example's FILE:LINE, or else
// example `index`), or has no tokens. max_len is the run's --seq-len.
TokenizedExample tokenize_example(const Tokenizer& tok, const std::string& prompt,
                                  const std::string& candidate, int64_t max_len, int64_t index,
                                  const std::string& where = "");

// Training sequences: each example with its correct candidate (candidates[label]).
// *truncated (if given) receives how many were cut to fit max_len; the caller warns.
std::vector<TokenizedExample> tokenize_examples(const Tokenizer& tok,
                                                const std::vector<Example>& examples,
                                                int64_t max_len, int64_t* truncated = nullptr);

// A right-padded LossBatch of examples[indices]: position t is scored against ids[t+1] exactly
// when ids[t+1] is a candidate token (t + 1 >= cand_start).
LossBatch make_loss_batch(const std::vector<TokenizedExample>& examples,
                          const std::vector<int64_t>& indices, int32_t pad_id = 0);

// MeZO's classification objective: every candidate of each example (tokenize_example of prompt +
// candidate), in candidate order. *truncated (if given): how many examples had a prompt cut.
std::vector<std::vector<TokenizedExample>> tokenize_candidates(
    const Tokenizer& tok, const std::vector<Example>& examples, int64_t max_len,
    int64_t* truncated = nullptr);
// The LossBatch of examples[indices] with all their candidates, consecutive, scored as in
// make_loss_batch, and one LossBatch::Choice per example labelled labels[i]. An example whose
// candidates differ only in one last token runs as one sequence of the shared tokens, every
// candidate scored at its last position (choice_length).
LossBatch make_choice_batch(const std::vector<std::vector<TokenizedExample>>& candidates,
                            const std::vector<int>& labels, const std::vector<int64_t>& indices,
                            int32_t pad_id = 0);
// lb right-padded to T >= lb.batch.T positions (ids pad_id; the pairs' rows at the new stride).
LossBatch pad_loss_batch(LossBatch lb, int64_t T, int32_t pad_id = 0);
// lb packed (Batch::pack: its sequences back to back, no padding; the pairs' rows moved with
// them): the training walk's layout.
LossBatch pack_loss_batch(LossBatch lb);

// The tokens an example of candidates runs as in make_choice_batch: its longest candidate, or
// one less where the candidates share all tokens but a last one.
int64_t choice_length(const std::vector<TokenizedExample>& candidates);

// "text": the whole file encoded without special tokens, cut into non-overlapping windows of
// seq_len tokens: BOS (when the tokenizer has one) then seq_len - 1 text tokens (seq_len without
// BOS), as zof/perplexity.h cuts them; a final shorter window is kept when it has 2 tokens or
// more. The last max(1, round(windows * eval_fraction)) windows are the eval split (at least 2
// windows needed).
struct TextData {
  std::vector<std::vector<int32_t>> train, eval;
  int64_t tokens = 0;  // text tokens in the file
};
TextData load_text(const std::string& path, const Tokenizer& tok, int64_t seq_len,
                   double eval_fraction = 0.1);
// Next-token LossBatch of windows[indices] (LossBatch::next_token).
LossBatch make_text_batch(const std::vector<std::vector<int32_t>>& windows,
                          const std::vector<int64_t>& indices, int32_t pad_id = 0);

// ---- sampling training batches --------------------------------------------------------------

// Deterministic training batches over n examples: the training stream is the concatenation of
// per-epoch permutations (epoch e: sample_indices(n, n, seed, 4, e)), and step s takes its
// entries [s*B, (s+1)*B). Every batch is full and batch(s) is a pure function of (seed, s), so a
// run resumed at step s sees the batches of an uninterrupted run. A batch may straddle epochs.
class BatchSampler {
 public:
  BatchSampler(int64_t n, int64_t batch_size, uint64_t seed);
  std::vector<int64_t> batch(int64_t step);  // indices into the n examples
  int64_t epoch_of(int64_t step) const;      // the epoch of the step's first entry
  int64_t size() const { return n_; }
  int64_t batch_size() const { return B_; }
  // Rank r of R gets entries [r*B/R, (r+1)*B/R) of the batch (floor divisions).
  static std::vector<int64_t> rank_slice(const std::vector<int64_t>& batch, int rank, int ranks);

 private:
  const std::vector<int64_t>& perm(int64_t epoch);  // one epoch's permutation, cached
  int64_t n_, B_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_;
};

// ---- evaluation -----------------------------------------------------------------------------

// Average log-likelihood of each candidate's tokens given the prompt: scores[i][c] = mean over
// the candidate tokens of log p(token | preceding tokens), tokenised by tokenize_example.
// batch_rows: the most tokens (summed lengths) per forward; fwd must have been built with
// max_rows at least that, and batch_rows >= max_len. Sequences go longest first into packed
// forwards (no padding, Batch::pack's layout), so on the CPU an example scores the same bits
// whatever else is evaluated with it (a forward of one token runs as two: Backend::matmul's
// one-row path has other bits). An example whose candidates differ only in one last token (SST-2's, RTE's,
// CB's verbalizers) runs as one sequence of the shared tokens, every candidate scored at its
// last position: one forward instead of one per candidate, the same log-probabilities. tokens
// (may be null): the tokens the forwards ran.
std::vector<std::vector<double>> candidate_scores(Forward& fwd, const Tokenizer& tok,
                                                  const std::vector<Example>& examples,
                                                  int64_t max_len, int64_t batch_rows,
                                                  int64_t* tokens = nullptr);
// MeZO's metric: the prediction is the argmax of candidate_scores (the first on ties); returns
// the fraction of examples whose prediction equals label. Every example needs a label.
double candidate_accuracy(Forward& fwd, const Tokenizer& tok, const std::vector<Example>& examples,
                          int64_t max_len, int64_t batch_rows,
                          std::vector<int>* predictions = nullptr);
// "jsonl": mean NLL (over all completion tokens) and perplexity of the correct candidates.
// windows counts the examples.
PerplexityResult completion_nll(Forward& fwd, const Tokenizer& tok,
                                const std::vector<Example>& examples, int64_t max_len,
                                int64_t batch_rows);
// "text": mean next-token NLL and perplexity of held-out windows (every token after the first).
PerplexityResult windows_nll(Forward& fwd, const std::vector<std::vector<int32_t>>& windows,
                             int64_t batch_rows);

// ---- a run's data ---------------------------------------------------------------------------

// What a task supplies to the loop: deterministic batches per step and an evaluation.
class TrainData {
 public:
  virtual ~TrainData() = default;
  // The step's batch split into micro-batches: a pure function of (seed, step). Data-parallel
  // replica r of R takes its share BatchSampler::rank_slice(batch, r, R) of the step's examples
  // and splits that into the micro-batches.
  virtual std::vector<LossBatch> batch(uint64_t step, int replica = 0, int replicas = 1) = 0;
  // The held-out metric at the model's current weights.
  struct Metric {
    std::string name;  // "ppl", "accuracy", "nll"
    double value = 0;
  };
  virtual Metric evaluate(Forward& fwd) = 0;
  virtual int64_t max_rows() const = 0;  // most tokens in one micro-batch or eval forward
  virtual std::string describe() const = 0;
  // What the run should be warned of (training prompts cut to fit --seq-len), or empty.
  virtual std::string warning() const { return ""; }
};
std::unique_ptr<TrainData> make_train_data(const TrainOptions& opt, const Tokenizer& tok,
                                           int64_t context);

// Input files named by a flag (--data, --text, --config): zof::Error unless `path` is a regular
// file it may read, saying what the path is instead (missing, a directory, a FIFO, a device) and
// `want`, what the flag takes. Nothing is opened, so a FIFO cannot block and a device is never
// read.
void check_input_file(const std::string& flag, const std::string& path, const std::string& want);
// --task and --data of a run: the task is known and --data is what it reads (one text file for
// text; a directory of the task's files or one file for the others). Cheap (no file is read):
// the CLI calls it with the other flag checks, before a run directory is created.
void check_task_data(Task task, const std::string& data);

}  // namespace zof
