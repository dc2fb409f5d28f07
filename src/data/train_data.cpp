// TrainData for each task, on top of the data layer (zof/data.h): deterministic per-step batches
// split into micro-batches, and the task's held-out metric.
#include <algorithm>
#include <cstdio>

#include "zof/data.h"
#include "zof/error.h"
#include "zof/tokenizer.h"

namespace zof {
namespace {

// The micro-batches of the step: its examples (replica r of R: its rank_slice of them) split
// into `micro` parts of near-equal size, each packed (pack_loss_batch): every sequence runs at
// its own length, its tokens only, so each is computed exactly as in any other layout (only the
// number of rows differs) and R replicas reproduce the single-process losses and weights bit
// for bit, with micro-batches too (tests/mpi).
template <class Make>
std::vector<LossBatch> step_micro_batches(BatchSampler& sampler, uint64_t step, int replica,
                                          int replicas, int64_t micro, Make make) {
  const std::vector<int64_t> all = sampler.batch((int64_t)step);
  const std::vector<int64_t> idx =
      replicas == 1 ? all : BatchSampler::rank_slice(all, replica, replicas);
  std::vector<LossBatch> out;
  const int64_t B = (int64_t)idx.size();
  for (int64_t m = 0; m < micro; ++m) {
    const int64_t lo = B * m / micro, hi = B * (m + 1) / micro;
    out.push_back(pack_loss_batch(make(std::vector<int64_t>(idx.begin() + lo, idx.begin() + hi))));
  }
  return out;
}

int64_t micro_rows(const TrainOptions& o, int64_t longest) {
  return (o.batch + o.micro_batches - 1) / o.micro_batches * longest;
}

// Plain-text language modelling on BOS-prefixed windows; held-out perplexity.
class TextTask : public TrainData {
 public:
  TextTask(const TrainOptions& o, const Tokenizer& tok, int64_t context)
      : opt_(o), data_(load_text(o.data, tok, o.seq_len)),
        sampler_((int64_t)data_.train.size(), o.batch, o.seed) {
    ZOF_CHECK(o.seq_len <= context, "--seq-len " + std::to_string(o.seq_len) +
                                        " exceeds the model's context of " +
                                        std::to_string(context) + " tokens");
    if ((int64_t)data_.eval.size() > o.eval_examples) data_.eval.resize(o.eval_examples);
  }
  std::vector<LossBatch> batch(uint64_t step, int replica, int replicas) override {
    return step_micro_batches(
        sampler_, step, replica, replicas, opt_.micro_batches,
        [&](const std::vector<int64_t>& i) { return make_text_batch(data_.train, i); });
  }
  Metric evaluate(Forward& fwd) override {
    return {"ppl", windows_nll(fwd, data_.eval, max_rows()).ppl};
  }
  int64_t max_rows() const override { return std::max<int64_t>(micro_rows(opt_, opt_.seq_len), opt_.seq_len); }
  std::string describe() const override {
    return "text " + opt_.data + ": " + std::to_string(data_.tokens) + " tokens, " +
           std::to_string(data_.train.size()) + " training and " +
           std::to_string(data_.eval.size()) + " held-out windows of " +
           std::to_string(opt_.seq_len) + " tokens";
  }

 private:
  TrainOptions opt_;
  TextData data_;
  BatchSampler sampler_;
};

// MeZO's classification / multiple-choice tasks (teacher forcing on the correct answer, or the
// cross-entropy over the candidates with --objective classification; accuracy by candidate
// scoring) and users' prompt/completion JSONL (perplexity of completions).
class ExampleTask : public TrainData {
 public:
  ExampleTask(const TrainOptions& o, const Tokenizer& tok, int64_t context)
      : opt_(o), tok_(tok), kind_(task_kind(o.task)),
        classify_(training_objective(o) == Objective::Classification),
        data_(load_task(o.task, o.data, DataOptions{o.train_examples, o.eval_examples, o.seed})),
        sampler_((int64_t)data_.train.size(), o.batch, o.seed) {
    max_len_ = std::min<int64_t>(o.seq_len, context);
    int64_t cut = 0;
    if (classify_) {
      cands_ = tokenize_candidates(tok, data_.train, max_len_, &cut);
      for (const Example& e : data_.train) labels_.push_back(e.label);
      for (const auto& c : cands_) {
        width_ = std::max<int64_t>(width_, (int64_t)c.size());
        for (const auto& t : c) longest_ = std::max<int64_t>(longest_, (int64_t)t.ids.size());
      }
    } else {
      train_ = tokenize_examples(tok, data_.train, max_len_, &cut);
      for (auto& t : train_) longest_ = std::max<int64_t>(longest_, (int64_t)t.ids.size());
    }
    if (cut > 0)
      warning_ = std::to_string(cut) + " of " + std::to_string(data_.train.size()) +
                 " training examples are longer than --seq-len " + std::to_string(max_len_) +
                 "; their prompts were cut on the left";
  }
  std::vector<LossBatch> batch(uint64_t step, int replica, int replicas) override {
    const int32_t pad = std::max(0, tok_.pad_id());
    if (classify_)
      return step_micro_batches(
          sampler_, step, replica, replicas, opt_.micro_batches,
          [&](const std::vector<int64_t>& i) { return make_choice_batch(cands_, labels_, i, pad); });
    return step_micro_batches(
        sampler_, step, replica, replicas, opt_.micro_batches,
        [&](const std::vector<int64_t>& i) { return make_loss_batch(train_, i, pad); });
  }
  Metric evaluate(Forward& fwd) override {
    if (kind_ == TaskKind::Completion)
      return {"ppl", completion_nll(fwd, tok_, data_.eval, max_len_, max_rows()).ppl};
    return {"accuracy", candidate_accuracy(fwd, tok_, data_.eval, max_len_, max_rows())};
  }
  int64_t max_rows() const override {
    // With choices every example brings all its candidates (at most width_ of them).
    return std::max(micro_rows(opt_, longest_) * width_, 4 * max_len_);
  }
  std::string warning() const override { return warning_; }
  std::string describe() const override {
    return word(opt_.task) + (" " + opt_.data) + ": " + std::to_string(data_.train.size()) + " of " +
           std::to_string(data_.train_available) + " training and " +
           std::to_string(data_.eval.size()) + " of " + std::to_string(data_.eval_available) +
           " evaluation examples" + (classify_ ? ", objective classification" : "");
  }

 private:
  TrainOptions opt_;
  const Tokenizer& tok_;
  std::string warning_;
  TaskKind kind_;
  bool classify_;
  TaskData data_;
  BatchSampler sampler_;
  std::vector<TokenizedExample> train_;                 // lm: the correct candidates
  std::vector<std::vector<TokenizedExample>> cands_;    // classification: every candidate
  std::vector<int> labels_;
  int64_t max_len_ = 0, longest_ = 1, width_ = 1;
};

}  // namespace

std::unique_ptr<TrainData> make_train_data(const TrainOptions& opt, const Tokenizer& tok,
                                           int64_t context) {
  if (task_kind(opt.task) == TaskKind::Text) return std::make_unique<TextTask>(opt, tok, context);
  return std::make_unique<ExampleTask>(opt, tok, context);
}

}  // namespace zof
