// The data and task layer: MeZO's prompts on the real SuperGLUE/GLUE files, every user error with
// its file and line, seeded sampling, the resumable sampler, and answer-only training targets.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "common.h"
#include "zof/data.h"
#include "zof/error.h"

namespace fs = std::filesystem;

namespace {

std::string data_dir(const char* task) { return zof::test::assets_dir() + "/data/" + task; }

// A scratch directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ =
        fs::temp_directory_path() / ("zof_data_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

// The zof::Error message of f(), or "" if it did not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const zof::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_AT(expr, file, line, field)                                                  \
  do {                                                                                            \
    const std::string msg_ = error_of([&] { (void)(expr); });                                     \
    ASSERT_FALSE(msg_.empty()) << #expr " did not throw zof::Error";                              \
    EXPECT_NE(msg_.find(std::string(file) + ":" + std::to_string(line) + ":"), std::string::npos) \
        << msg_;                                                                                  \
    EXPECT_NE(msg_.find(field), std::string::npos) << msg_;                                       \
    EXPECT_EQ(msg_.find('\n'), std::string::npos) << "one line: " << msg_;                        \
  } while (0)

}  // namespace

// ---- parsing the real files ---------------------------------------------------------------------

TEST(TaskParse, Sst2Dev) {
  const std::string path = data_dir("sst2") + "/dev.tsv";
  ZOF_REQUIRE_PATH(path);
  const auto ex = zof::parse_task_file(zof::Task::Sst2, path);
  ASSERT_EQ(ex.size(), 872u);
  // Line 2: "it 's a charming and often affecting journey . \t1" (trailing space stripped).
  EXPECT_EQ(ex[0].prompt, "it 's a charming and often affecting journey . It was");
  EXPECT_EQ(ex[0].candidates, (std::vector<std::string>{" terrible", " great"}));
  EXPECT_EQ(ex[0].label, 1);
  EXPECT_EQ(ex[1].prompt, "unflinchingly bleak and desperate It was");
  EXPECT_EQ(ex[1].label, 0);
}

TEST(TaskParse, RteVal) {
  const std::string path = data_dir("rte") + "/val.jsonl";
  ZOF_REQUIRE_PATH(path);
  const auto ex = zof::parse_task_file(zof::Task::Rte, path);
  ASSERT_EQ(ex.size(), 277u);
  EXPECT_EQ(ex[0].prompt,
            "Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age "
            "44, according to the Christopher Reeve Foundation.\nDoes this mean that \"Christopher "
            "Reeve had an accident.\" is true? Yes or No?\n");
  EXPECT_EQ(ex[0].candidates, (std::vector<std::string>{"Yes", "No"}));
  EXPECT_EQ(ex[0].label, 1);  // not_entailment
  EXPECT_EQ(ex[1].label, 0);  // entailment
}

TEST(TaskParse, CbVal) {
  const std::string path = data_dir("cb") + "/val.jsonl";
  ZOF_REQUIRE_PATH(path);
  const auto ex = zof::parse_task_file(zof::Task::Cb, path);
  ASSERT_EQ(ex.size(), 56u);
  EXPECT_EQ(ex[0].prompt,
            "Suppose Valence the void-brain, Valence the virtuous valet. Why couldn't the figger "
            "choose his own portion of titanic anatomy to shaft? Did he think he was helping? Can "
            "we infer that \"Valence was helping\"? Yes, No, or Maybe?\n");
  EXPECT_EQ(ex[0].candidates, (std::vector<std::string>{"Yes", "No", "Maybe"}));
  EXPECT_EQ(ex[0].label, 1);  // contradiction
  EXPECT_EQ(ex[1].label, 2);  // neutral
}

TEST(TaskParse, CopaVal) {
  const std::string path = data_dir("copa") + "/val.jsonl";
  ZOF_REQUIRE_PATH(path);
  const auto ex = zof::parse_task_file(zof::Task::Copa, path);
  ASSERT_EQ(ex.size(), 100u);
  EXPECT_EQ(ex[0].prompt, "The man turned on the faucet so ");
  EXPECT_EQ(ex[0].candidates, (std::vector<std::string>{"the toilet filled with water.",
                                                        "water flowed from the spout."}));
  EXPECT_EQ(ex[0].label, 1);
  // Line 6: a cause/effect with "I" kept upper-case and "He" lower-cased.
  EXPECT_EQ(ex[5].prompt, "I doubted the salesman's pitch so ");
  EXPECT_EQ(ex[5].candidates, (std::vector<std::string>{"I turned his offer down.",
                                                        "he persuaded me to buy the product."}));
  EXPECT_EQ(ex[5].label, 0);
  // A "cause" question.
  const auto train = zof::parse_task_file(zof::Task::Copa, data_dir("copa") + "/train.jsonl");
  ASSERT_EQ(train.size(), 400u);
  EXPECT_EQ(train[0].prompt, "My body cast a shadow over the grass because ");
  EXPECT_EQ(train[0].candidates[0], "the sun was rising.");
}

TEST(TaskParse, UnlabelledTestFiles) {
  const std::string path = data_dir("copa") + "/test.jsonl";
  ZOF_REQUIRE_PATH(path);
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Copa, path), path, 1, "label");
  const auto ex = zof::parse_task_file(zof::Task::Copa, path, /*require_labels=*/false);
  EXPECT_EQ(ex.size(), 500u);
  EXPECT_EQ(ex[0].label, -1);
  EXPECT_EQ(zof::parse_task_file(zof::Task::Cb, data_dir("cb") + "/test.jsonl", false).size(), 250u);
}

TEST(TaskParse, GenericJsonl) {
  TempDir d;
  const std::string p = d.write("mine.jsonl",
                                "{\"prompt\": \"Q: 2+2?\\nA:\", \"completion\": \" 4\"}\n\n"
                                "{\"prompt\": \"Hi\", \"completion\": \" there\", \"extra\": 1}\n");
  const auto ex = zof::parse_task_file(zof::Task::Jsonl, p);
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_EQ(ex[0].prompt, "Q: 2+2?\nA:");
  EXPECT_EQ(ex[0].candidates, (std::vector<std::string>{" 4"}));
  EXPECT_EQ(ex[0].label, 0);
}

TEST(TaskParse, IntegerLabelsAsHuggingFaceDatasets) {
  TempDir d;
  const std::string p =
      d.write("cb.jsonl", "{\"premise\": \"P.\", \"hypothesis\": \"H\", \"label\": 2}\n");
  EXPECT_EQ(zof::parse_task_file(zof::Task::Cb, p)[0].label, 2);
}

// ---- loading a task directory or file ------------------------------------------------------

TEST(DataLoad, DirectorySplitsAndSampleSizes) {
  ZOF_REQUIRE_PATH(data_dir("cb"));
  zof::DataOptions opt;  // 1000 train, 500 eval
  const auto d = zof::load_task(zof::Task::Cb, data_dir("cb"), opt);
  EXPECT_EQ(d.train_available, 250);
  EXPECT_EQ(d.eval_available, 56);
  EXPECT_EQ(d.train.size(), 250u);  // all, when fewer than asked
  EXPECT_EQ(d.eval.size(), 56u);
  EXPECT_EQ(fs::path(d.eval_path).filename(), "val.jsonl");
  opt.train_examples = 16;
  opt.eval_examples = 8;
  const auto s = zof::load_task(zof::Task::Sst2, data_dir("sst2"), opt);
  EXPECT_EQ(s.train_available, 67349);
  EXPECT_EQ(s.eval_available, 872);
  EXPECT_EQ(s.train.size(), 16u);
  EXPECT_EQ(s.eval.size(), 8u);
}

TEST(DataLoad, SamplingIsSeeded) {
  ZOF_REQUIRE_PATH(data_dir("rte"));
  zof::DataOptions opt;
  opt.train_examples = 50;
  opt.eval_examples = 20;
  auto prompts = [](const std::vector<zof::Example>& v) {
    std::vector<std::string> p;
    for (auto& e : v) p.push_back(e.prompt);
    return p;
  };
  const auto a = zof::load_task(zof::Task::Rte, data_dir("rte"), opt);
  const auto b = zof::load_task(zof::Task::Rte, data_dir("rte"), opt);
  opt.seed = 1;
  const auto c = zof::load_task(zof::Task::Rte, data_dir("rte"), opt);
  EXPECT_EQ(prompts(a.train), prompts(b.train));
  EXPECT_EQ(prompts(a.eval), prompts(b.eval));
  EXPECT_NE(prompts(a.train), prompts(c.train));
  EXPECT_NE(prompts(a.eval), prompts(c.eval));
  // Without replacement: the 50 prompts are 50 distinct lines.
  const auto ids = zof::sample_indices(2490, 50, 0, 1);
  EXPECT_EQ(std::set<int64_t>(ids.begin(), ids.end()).size(), 50u);
}

TEST(DataLoad, SampleIndicesIsAPermutationPrefix) {
  const auto all = zof::sample_indices(1000, 1000, 7, 1);
  std::vector<int64_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  const auto head = zof::sample_indices(1000, 10, 7, 1);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), all.begin()));
  EXPECT_NE(zof::sample_indices(1000, 10, 7, 2), head);  // another stream
  EXPECT_NE(zof::sample_indices(1000, 10, 8, 1), head);  // another seed
}

TEST(DataLoad, SingleFileIsSplitBySeed) {
  TempDir d;
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += "{\"prompt\": \"p" + std::to_string(i) + "\", \"completion\": \" c\"}\n";
  const std::string p = d.write("all.jsonl", text);
  zof::DataOptions opt;
  const auto a = zof::load_task(zof::Task::Jsonl, p, opt);
  EXPECT_EQ(a.eval_available, 4);  // 10%
  EXPECT_EQ(a.train_available, 36);
  std::set<std::string> seen;
  for (auto& e : a.train) seen.insert(e.prompt);
  for (auto& e : a.eval) seen.insert(e.prompt);
  EXPECT_EQ(seen.size(), 40u);  // disjoint and complete
  opt.seed = 3;
  const auto b = zof::load_task(zof::Task::Jsonl, p, opt);
  std::set<std::string> ea, eb;
  for (auto& e : a.eval) ea.insert(e.prompt);
  for (auto& e : b.eval) eb.insert(e.prompt);
  EXPECT_NE(ea, eb);
}

// ---- errors ----------------------------------------------------------------------------------

TEST(DataErrors, MalformedJsonLine) {
  TempDir d;
  const std::string p =
      d.write("val.jsonl",
              "{\"premise\": \"P.\", \"hypothesis\": \"H\", \"label\": \"neutral\"}\n"
              "{\"premise\": \"P.\", \"hypothesis\": \n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Cb, p), p, 2, "malformed JSON");
}

TEST(DataErrors, MissingField) {
  TempDir d;
  const std::string p =
      d.write("val.jsonl", "\n{\"premise\": \"P.\", \"label\": \"entailment\"}\n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Rte, p), p, 2, "\"hypothesis\"");
  const std::string q = d.write("mine.jsonl", "{\"prompt\": \"x\"}\n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Jsonl, q), q, 1, "\"completion\"");
}

TEST(DataErrors, LabelNotInTheTaskLabelSet) {
  TempDir d;
  const std::string p =
      d.write("val.jsonl", "{\"premise\": \"P.\", \"hypothesis\": \"H\", \"label\": \"maybe\"}\n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Cb, p), p, 1, "\"label\"");
  EXPECT_NE(error_of([&] { zof::parse_task_file(zof::Task::Cb, p); }).find("neutral"), std::string::npos);
  const std::string q = d.write("copa.jsonl",
                                "{\"premise\": \"P.\", \"choice1\": \"A\", \"choice2\": \"B\", "
                                "\"question\": \"effect\", \"label\": 2}\n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Copa, q), q, 1, "\"label\"");
  const std::string r = d.write("copa2.jsonl",
                                "{\"premise\": \"P.\", \"choice1\": \"A\", \"choice2\": \"B\", "
                                "\"question\": \"why\", \"label\": 1}\n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Copa, r), r, 1, "\"question\"");
}

TEST(DataErrors, Sst2LabelAndTab) {
  TempDir d;
  const std::string p = d.write("dev.tsv", "sentence\tlabel\ngood film\t1\nbad film\tpositive\n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Sst2, p), p, 3, "\"label\"");
  const std::string q = d.write("dev2.tsv", "sentence\tlabel\ngood film\t1\nbad film 0\n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Sst2, q), q, 3, "tab");
  const std::string r = d.write("dev3.tsv", "text,label\ngood film,1\n");
  EXPECT_ERROR_AT(zof::parse_task_file(zof::Task::Sst2, r), r, 1, "header");
}

TEST(DataErrors, EmptyDataset) {
  TempDir d;
  const std::string p = d.write("dev.tsv", "sentence\tlabel\n");
  const std::string m = error_of([&] { zof::parse_task_file(zof::Task::Sst2, p); });
  EXPECT_NE(m.find(p), std::string::npos) << m;
  EXPECT_NE(m.find("no examples"), std::string::npos) << m;
  const std::string q = d.write("val.jsonl", "\n\n");
  EXPECT_NE(error_of([&] { zof::parse_task_file(zof::Task::Rte, q); }).find("no examples"),
            std::string::npos);
}

TEST(DataErrors, MissingFilesInDirectory) {
  TempDir d;
  d.write("train.jsonl", "{\"premise\": \"P.\", \"hypothesis\": \"H\", \"label\": \"neutral\"}\n");
  const std::string m = error_of([&] { zof::load_task(zof::Task::Cb, d.str(), {}); });
  EXPECT_NE(m.find(d.str()), std::string::npos) << m;
  EXPECT_NE(m.find("val.jsonl"), std::string::npos) << m;
  TempDir e;
  const std::string n = error_of([&] { zof::load_task(zof::Task::Sst2, e.str() + "/", {}); });
  EXPECT_NE(n.find("train.tsv"), std::string::npos) << n;
  EXPECT_NE(error_of([&] { zof::load_task(zof::Task::Cb, e.str() + "/nope", {}); }).find("nope"),
            std::string::npos);
}

TEST(DataErrors, UnknownTask) {
  zof::TrainOptions o;
  const std::string m = error_of([&] { zof::set_train_option(o, "task", "mnli"); });
  EXPECT_EQ(m.rfind("--task must be ", 0), 0u) << m;
  EXPECT_NE(m.find("mnli"), std::string::npos) << m;
  for (const char* t : {"sst2", "rte", "cb", "copa", "jsonl", "text"})
    EXPECT_NE(m.find(t), std::string::npos) << m;
  EXPECT_EQ(zof::task_kind(zof::Task::Copa), zof::TaskKind::Classification);
  EXPECT_EQ(zof::task_kind(zof::Task::Jsonl), zof::TaskKind::Completion);
  EXPECT_EQ(zof::task_kind(zof::Task::Text), zof::TaskKind::Text);
}

// ---- the sampler ----------------------------------------------------------------------------

TEST(Sampler, ResumeGivesTheSameBatch) {
  zof::BatchSampler run(37, 16, 42);
  std::vector<std::vector<int64_t>> seen;
  for (int s = 0; s < 12; ++s) seen.push_back(run.batch(s));
  for (int s : {0, 3, 7, 11, 5}) {
    zof::BatchSampler resumed(37, 16, 42);  // a fresh process, jumping straight to step s
    EXPECT_EQ(resumed.batch(s), seen[s]) << "step " << s;
  }
  zof::BatchSampler other(37, 16, 43);
  EXPECT_NE(other.batch(0), seen[0]);
}

TEST(Sampler, EachEpochVisitsEveryExampleOnce) {
  const int64_t n = 40, B = 8;
  zof::BatchSampler s(n, B, 1);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> all;
    for (int64_t st = epoch * n / B; st < (epoch + 1) * n / B; ++st) {
      EXPECT_EQ(s.epoch_of(st), epoch);
      auto b = s.batch(st);
      all.insert(all.end(), b.begin(), b.end());
    }
    std::sort(all.begin(), all.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(all[i], i);
  }
  // Epochs are shuffled differently.
  EXPECT_NE(s.batch(0), s.batch(n / B));
  // A batch that straddles epochs is still full.
  zof::BatchSampler t(10, 4, 1);
  EXPECT_EQ(t.batch(2).size(), 4u);
}

TEST(Sampler, RankSplitCoversTheBatchOnce) {
  zof::BatchSampler s(100, 16, 5);
  const auto batch = s.batch(3);
  for (int R : {1, 2, 3, 4, 5, 16}) {
    std::vector<int64_t> joined;
    for (int r = 0; r < R; ++r) {
      const auto part = zof::BatchSampler::rank_slice(batch, r, R);
      EXPECT_EQ((int64_t)part.size(), (r + 1) * 16 / R - r * 16 / R);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    EXPECT_EQ(joined, batch) << R << " ranks";
  }
}

// ---- tokenisation ------------------------------------------------------------------------------

TEST(DataTokenize, CandidateTokensAreTheTailOfTheFullText) {
  const std::string dir = zof::test::assets_dir() + "/models/stories260K";
  ZOF_REQUIRE_PATH(dir + "/tokenizer.json");
  const auto tok = zof::Tokenizer::load(dir);
  struct Case {
    std::string prompt, candidate;
  };
  for (const Case& c : {Case{"Once upon a", " time"}, Case{"The film It was", " great"},
                        Case{"The man turned on the faucet so ", "water flowed from the spout."},
                        Case{"P.\nDoes this mean that \"H\" is true? Yes or No?\n", "Yes"}}) {
    const auto t = zof::tokenize_example(tok, c.prompt, c.candidate, 512, 0);
    const auto full = tok.encode(c.prompt + c.candidate, true);
    EXPECT_EQ(t.ids, full) << c.prompt;
    const auto p = tok.encode(c.prompt, true);
    // Here the prompt's tokens are a prefix of the full text's, so the answer is the rest
    // (MeZO's option_len = len(full) - len(prompt)).
    ASSERT_TRUE(std::equal(p.begin(), p.end(), full.begin())) << c.prompt;
    EXPECT_EQ(t.cand_start, (int64_t)p.size());
    EXPECT_FALSE(t.truncated);
  }
  // " time" after "Once upon a" is the single token "▁time"; RTE's "Yes" after the newline keeps
  // the newline byte (the normalizer strips it from the prompt alone), as MeZO counts it.
  auto t = zof::tokenize_example(tok, "Once upon a", " time", 512, 0);
  ASSERT_EQ(t.ids.size() - t.cand_start, 1u);
  EXPECT_EQ(tok.id_to_token(t.ids.back()), "▁time");
  t = zof::tokenize_example(tok, "Is it?\n", "Yes", 512, 0);
  EXPECT_EQ(tok.id_to_token(t.ids[t.cand_start]), "<0x0A>");
}

TEST(DataTokenize, GPT2CandidateEqualsItsOwnEncoding) {
  const std::string dir = zof::test::assets_dir() + "/tokenizers/gpt2";
  ZOF_REQUIRE_PATH(dir + "/tokenizer.json");
  const auto tok = zof::Tokenizer::load(dir);
  const auto t = zof::tokenize_example(tok, "a charming journey . It was", " great", 512, 0);
  const std::vector<int32_t> alone = tok.encode(" great", false);
  EXPECT_EQ(std::vector<int32_t>(t.ids.begin() + t.cand_start, t.ids.end()), alone);
  // COPA's prompt ends in a space that belongs to the answer's first token (" water").
  const auto c =
      zof::tokenize_example(tok, "The man turned on the faucet so ", "water flowed.", 512, 0);
  EXPECT_EQ(std::vector<int32_t>(c.ids.begin() + c.cand_start, c.ids.end()),
            tok.encode(" water flowed.", false));
}

TEST(DataTokenize, TargetsScoreExactlyTheCandidate) {
  const std::string dir = zof::test::assets_dir() + "/models/stories260K";
  ZOF_REQUIRE_PATH(dir + "/tokenizer.json");
  const auto tok = zof::Tokenizer::load(dir);
  const std::vector<zof::Example> ex = {
      {"Once upon a", {" banana", " time"}, 1},
      {"The cat sat on the", {" mat and slept all day"}, 0},
  };
  const auto t = zof::tokenize_examples(tok, ex, 64);
  const auto lb = zof::make_loss_batch(t, {1, 0});
  ASSERT_EQ(lb.batch.B, 2);
  const int64_t T = lb.batch.T;
  const std::vector<int32_t> targets = lb.position_targets();
  for (int64_t r = 0; r < 2; ++r) {
    const auto& e = t[r == 0 ? 1 : 0];
    std::vector<int32_t> scored;
    for (int64_t p = 0; p < T; ++p) {
      const int32_t tgt = targets[r * T + p];
      if (tgt < 0) continue;
      EXPECT_EQ(tgt, lb.batch.ids[r * T + p + 1]);  // next token, never padding
      EXPECT_GE(p + 1, e.cand_start);
      scored.push_back(tgt);
    }
    EXPECT_EQ(scored, std::vector<int32_t>(e.ids.begin() + e.cand_start, e.ids.end()));
  }
  EXPECT_EQ(tok.decode(std::vector<int32_t>(t[1].ids.begin() + t[1].cand_start, t[1].ids.end())),
            "mat and slept all day");
  EXPECT_EQ(lb.scored(), (int64_t)(t[0].ids.size() - t[0].cand_start) +
                             (int64_t)(t[1].ids.size() - t[1].cand_start));
}

TEST(DataTokenize, LeftTruncationKeepsBosAndTheAnswer) {
  const std::string dir = zof::test::assets_dir() + "/models/stories260K";
  ZOF_REQUIRE_PATH(dir + "/tokenizer.json");
  const auto tok = zof::Tokenizer::load(dir);
  const std::string prompt = "Once upon a time there was a little girl named Lily and she";
  const auto full = zof::tokenize_example(tok, prompt, " loved to play", 512, 0);
  const int64_t n_cand = (int64_t)full.ids.size() - full.cand_start;
  const int64_t max_len = n_cand + 4;
  const auto cut = zof::tokenize_example(tok, prompt, " loved to play", max_len, 0);
  EXPECT_TRUE(cut.truncated);
  ASSERT_EQ((int64_t)cut.ids.size(), max_len);
  EXPECT_EQ(cut.ids[0], tok.bos_id());
  EXPECT_EQ(cut.cand_start, max_len - n_cand);
  EXPECT_TRUE(std::equal(cut.ids.begin() + 1, cut.ids.end(), full.ids.end() - (max_len - 1)));
  int64_t truncated = -1;
  zof::tokenize_examples(tok, {{prompt, {" loved to play"}, 0}, {"Hi", {" there"}, 0}}, max_len,
                         &truncated);
  EXPECT_EQ(truncated, 1);
  // The answer alone does not fit: an error naming the example.
  const std::string m = error_of([&] {
    zof::tokenize_examples(tok, {{"Hi", {" there"}, 0}, {prompt, {" loved to play"}, 0}}, n_cand);
  });
  EXPECT_NE(m.find("example 1"), std::string::npos) << m;
  EXPECT_NE(m.find("--max-len"), std::string::npos) << m;
}

TEST(DataText, WindowsAndHeldOut) {
  const std::string dir = zof::test::assets_dir() + "/models/stories260K";
  ZOF_REQUIRE_PATH(dir + "/tokenizer.json");
  const auto tok = zof::Tokenizer::load(dir);
  TempDir d;
  std::string text;
  for (int i = 0; i < 30; ++i) text += "Once upon a time, there was a little girl named Lily.\n";
  const std::string p = d.write("t.txt", text);
  const auto td = zof::load_text(p, tok, 32, 0.1);
  const auto all = tok.encode(text, false);
  EXPECT_EQ(td.tokens, (int64_t)all.size());
  const int64_t nw = (int64_t)(td.train.size() + td.eval.size());
  EXPECT_EQ(nw, ((int64_t)all.size() + 30) / 31);  // last partial window kept (>= 2 tokens)
  EXPECT_GE(td.eval.size(), 1u);
  EXPECT_EQ((int64_t)td.eval.size(), std::max<int64_t>(1, std::llround(nw * 0.1)));
  std::vector<int32_t> joined;
  for (const auto* part : {&td.train, &td.eval})
    for (const auto& w : *part) {
      EXPECT_EQ(w[0], tok.bos_id());
      EXPECT_LE(w.size(), 32u);
      joined.insert(joined.end(), w.begin() + 1, w.end());
    }
  EXPECT_EQ(joined, all);  // windows tile the text in order, eval last
  const auto lb = zof::make_text_batch(td.train, {1, 0});
  EXPECT_EQ(lb.score_rows[0], 0);
  EXPECT_EQ(lb.score_targets[0], td.train[1][1]);
  EXPECT_EQ(lb.scored(), (int64_t)(td.train[0].size() + td.train[1].size() - 2));
  const std::string m = error_of([&] { zof::load_text(d.write("s.txt", "Hi"), tok, 32); });
  EXPECT_NE(m.find("s.txt"), std::string::npos) << m;
}
