// MeZO's tasks as files: parsing SST-2 TSV, SuperGLUE JSONL (RTE, CB, COPA) and prompt/completion
// JSONL into Examples with MeZO's prompt templates, locating a task's files and sampling them.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "hf/json_depth.h"
#include "zof/data.h"
#include "zof/error.h"
#include "zof/input_file.h"
#include "util/philox.h"

namespace zof {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Random streams of this file and of data.cpp (the `stream` argument of sample_indices).
constexpr uint32_t kStreamTrain = 1, kStreamEval = 2, kStreamSplit = 3;

std::string where(const std::string& path, int64_t line) {
  return path + ":" + std::to_string(line) + ": ";
}

std::string strip(const std::string& s, const char* chars = " \t\r\n\f\v") {
  const size_t b = s.find_first_not_of(chars);
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(chars);
  return s.substr(b, e - b + 1);
}

bool blank(const std::string& s) { return strip(s).empty(); }

// ---- MeZO's templates -----------------------------------------------------------------------
// Prompts and verbalizers as MeZO's large_models/templates.py (SST2Template, RTETemplate,
// CBTemplate, CopaTemplate with capitalization "correct"), verbatim; FIELD.md restates them.

Example sst2_example(const std::string& sentence, int label) {
  return {strip(sentence) + " It was", {" terrible", " great"}, label};
}

Example rte_example(const std::string& premise, const std::string& hypothesis, int label) {
  return {premise + "\nDoes this mean that \"" + hypothesis + "\" is true? Yes or No?\n",
          {"Yes", "No"},
          label};
}

Example cb_example(const std::string& premise, const std::string& hypothesis, int label) {
  return {"Suppose " + premise + " Can we infer that \"" + hypothesis + "\"? Yes, No, or Maybe?\n",
          {"Yes", "No", "Maybe"},
          label};
}

// MeZO's CopaTemplate.capitalize: the first space-separated word lower-cased unless it is "I".
std::string copa_choice(const std::string& c) {
  const size_t sp = c.find(' ');
  std::string first = c.substr(0, sp), rest = sp == std::string::npos ? "" : c.substr(sp);
  if (first != "I")
    for (char& ch : first) ch = (char)std::tolower((unsigned char)ch);
  return first + rest;
}

Example copa_example(const std::string& premise, bool effect, const std::string& choice1,
                     const std::string& choice2, int label) {
  std::string p = premise;
  while (!p.empty() && std::isspace((unsigned char)p.back())) p.pop_back();  // rstrip
  if (!p.empty() && p.back() == '.') p.pop_back();
  return {p + (effect ? " so " : " because "), {copa_choice(choice1), copa_choice(choice2)}, label};
}

// ---- field access with errors that say where --------------------------------------------------

struct LineCtx {
  const std::string& path;
  int64_t line;
  const char* task;
  const char* fields;  // what a line must hold, for the message
};

std::string get_string(const json& j, const char* field, const LineCtx& c) {
  ZOF_CHECK(j.contains(field), where(c.path, c.line) + "missing field \"" + field + "\" (" +
                                   c.task + " lines need " + c.fields + ")");
  ZOF_CHECK(j[field].is_string(), where(c.path, c.line) + "field \"" + field +
                                      "\" must be a string, got " + j[field].dump());
  return j[field].get<std::string>();
}

// A label given as one of `names` or as its integer index (Hugging Face datasets' class ids).
// Returns -1 for an absent label (or -1, HF's unlabelled marker) when !require.
int get_label(const json& j, const std::vector<std::string>& names, bool require,
              const LineCtx& c) {
  std::string allowed;
  for (size_t i = 0; i < names.size(); ++i)
    allowed += (i ? ", " : "") + names[i] + " (" + std::to_string(i) + ")";
  if (!j.contains("label")) {
    ZOF_CHECK(!require, where(c.path, c.line) + "missing field \"label\" (" + c.task +
                            " lines need " + c.fields + "; unlabelled test files cannot be used " +
                            "for training or evaluation)");
    return -1;
  }
  const json& l = j["label"];
  if (l.is_number_integer()) {
    const int64_t v = l.get<int64_t>();
    if (v == -1 && !require) return -1;
    if (v >= 0 && v < (int64_t)names.size()) return (int)v;
  } else if (l.is_string()) {
    for (size_t i = 0; i < names.size(); ++i)
      if (l.get<std::string>() == names[i]) return (int)i;
  }
  throw Error(where(c.path, c.line) + "field \"label\" is " + l.dump() + ", not a " + c.task +
              " label; use one of " + allowed);
}

// What --data is for each task (not "text"), for messages.
std::string data_wanted(Task task) {
  if (task == Task::Sst2)
    return "--task sst2 reads a directory (train.tsv and dev.tsv) or one TSV file";
  return std::string("--task ") + word(task) +
         " reads a directory (train.jsonl and val.jsonl) or one JSONL file";
}

std::vector<std::string> read_lines(const std::string& path, Task task) {
  check_input_file("--data", path, data_wanted(task));
  std::ifstream f(path, std::ios::binary);
  ZOF_CHECK(f.good(), path + ": cannot open for reading");
  std::vector<std::string> lines;
  std::string s;
  while (std::getline(f, s)) {
    if (!s.empty() && s.back() == '\r') s.pop_back();
    lines.push_back(std::move(s));
  }
  return lines;
}

std::vector<Example> parse_sst2(const std::string& path, bool require_labels) {
  const auto lines = read_lines(path, Task::Sst2);
  std::vector<Example> out;
  // The header names the columns (GLUE: "sentence\tlabel"; its test file "index\tsentence").
  int64_t first = 0;
  while (first < (int64_t)lines.size() && blank(lines[first])) ++first;
  ZOF_CHECK(first < (int64_t)lines.size(),
            path +
                ": no examples (the file is empty; sst2 expects a TSV with a header line "
                "\"sentence<TAB>label\" and one example per line)");
  std::vector<std::string> cols;
  {
    std::string h = lines[first];
    size_t p = 0;
    while (true) {
      const size_t t = h.find('\t', p);
      cols.push_back(strip(h.substr(p, t == std::string::npos ? std::string::npos : t - p)));
      if (t == std::string::npos) break;
      p = t + 1;
    }
  }
  auto col = [&](const char* name) {
    auto it = std::find(cols.begin(), cols.end(), name);
    return it == cols.end() ? -1 : (int)(it - cols.begin());
  };
  const int c_sent = col("sentence"), c_label = col("label");
  ZOF_CHECK(c_sent >= 0 && (c_label >= 0 || !require_labels),
            where(path, first + 1) + "header must name the columns \"sentence\" and \"label\" " +
                "separated by a tab (GLUE SST-2 format), got \"" + lines[first] + "\"");
  for (int64_t i = first + 1; i < (int64_t)lines.size(); ++i) {
    const std::string& s = lines[i];
    if (blank(s)) continue;
    std::vector<std::string> f;
    size_t p = 0;
    while (true) {
      const size_t t = s.find('\t', p);
      f.push_back(s.substr(p, t == std::string::npos ? std::string::npos : t - p));
      if (t == std::string::npos) break;
      p = t + 1;
    }
    ZOF_CHECK((int)f.size() == (int)cols.size(),
              where(path, i + 1) + "expected " + std::to_string(cols.size()) +
                  " tab-separated fields (" +
                  (cols.size() == 2 ? "sentence<TAB>label" : "as the header") + "), got " +
                  std::to_string(f.size()) + "; separate the fields with one tab");
    int label = -1;
    if (c_label >= 0) {
      const std::string l = strip(f[c_label]);
      ZOF_CHECK(l == "0" || l == "1",
                where(path, i + 1) + "field \"label\" is \"" + l +
                    "\", not an sst2 label; use 0 (negative) or 1 (positive)");
      label = l == "1" ? 1 : 0;
    }
    out.push_back(sst2_example(f[c_sent], label));
    out.back().where = path + ":" + std::to_string(i + 1);
  }
  return out;
}

std::vector<Example> parse_jsonl(Task task, const std::string& path,
                                 bool require_labels) {
  const auto lines = read_lines(path, task);
  std::vector<Example> out;
  for (int64_t i = 0; i < (int64_t)lines.size(); ++i) {
    if (blank(lines[i])) continue;
    check_json_depth(lines[i], path + ":" + std::to_string(i + 1));
    json j;
    try {
      j = json::parse(lines[i]);
    } catch (const json::exception& e) {  // parse_error, and out_of_range for a number like 1e999
      std::string what = e.what();
      const size_t colon = what.find(": ");  // drop nlohmann's "[json.exception...]" prefix
      if (colon != std::string::npos) what = what.substr(colon + 2);
      throw Error(where(path, i + 1) + "malformed JSON (" + what +
                  "); each line must be one JSON object");
    }
    ZOF_CHECK(j.is_object(), where(path, i + 1) + "expected a JSON object, got " +
                                 std::string(j.type_name()) + "; each line must be one object");
    if (task == Task::Rte) {
      const LineCtx c{path, i + 1, "rte", "premise, hypothesis, label"};
      const std::string p = get_string(j, "premise", c), h = get_string(j, "hypothesis", c);
      out.push_back(
          rte_example(p, h, get_label(j, {"entailment", "not_entailment"}, require_labels, c)));
    } else if (task == Task::Cb) {
      const LineCtx c{path, i + 1, "cb", "premise, hypothesis, label"};
      const std::string p = get_string(j, "premise", c), h = get_string(j, "hypothesis", c);
      out.push_back(cb_example(
          p, h, get_label(j, {"entailment", "contradiction", "neutral"}, require_labels, c)));
    } else if (task == Task::Copa) {
      const LineCtx c{path, i + 1, "copa", "premise, choice1, choice2, question, label"};
      const std::string p = get_string(j, "premise", c), c1 = get_string(j, "choice1", c),
                        c2 = get_string(j, "choice2", c), q = get_string(j, "question", c);
      ZOF_CHECK(q == "cause" || q == "effect", where(path, i + 1) + "field \"question\" is \"" + q +
                                                   "\"; use \"cause\" or \"effect\"");
      const int label = get_label(j, {"choice1", "choice2"}, require_labels, c);
      out.push_back(copa_example(p, q == "effect", c1, c2, label));
    } else {  // jsonl
      const LineCtx c{path, i + 1, "jsonl", "\"prompt\" and \"completion\" strings"};
      Example e{get_string(j, "prompt", c), {get_string(j, "completion", c)}, 0};
      ZOF_CHECK(!blank(e.candidates[0]),
                where(path, i + 1) +
                    "field \"completion\" is empty; every line needs an answer "
                    "to train on");
      out.push_back(std::move(e));
    }
    out.back().where = path + ":" + std::to_string(i + 1);
  }
  return out;
}

}  // namespace

TaskKind task_kind(Task task) {
  switch (task) {
    case Task::Jsonl: return TaskKind::Completion;
    case Task::Text: return TaskKind::Text;
    case Task::Sst2:
    case Task::Rte:
    case Task::Cb:
    case Task::Copa: break;
  }
  return TaskKind::Classification;
}

std::vector<Example> parse_task_file(Task task, const std::string& path,
                                     bool require_labels) {
  ZOF_CHECK(task_kind(task) != TaskKind::Text,
            "task \"text\" is read with load_text (token windows), not as examples");
  std::vector<Example> out =
      task == Task::Sst2 ? parse_sst2(path, require_labels) : parse_jsonl(task, path, require_labels);
  ZOF_CHECK(!out.empty(), path + ": no examples (the file has no data lines); --task " + word(task) +
                              " needs at least one example");
  return out;
}

std::vector<int64_t> sample_indices(int64_t n, int64_t k, uint64_t seed, uint32_t stream,
                                    uint64_t sub) {
  ZOF_ASSERT(n >= 0 && n < (int64_t(1) << 32) && k >= 0);
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  // Fisher-Yates from the top; the draw for position i is Philox(counter = (i, sub, stream)).
  // j = floor(u * (i + 1) / 2^64) for a 64-bit u: bias below 2^-32, no rejection loop.
  for (int64_t i = n - 1; i >= 1; --i) {
    const Philox4x32 r = philox4x32_10((uint32_t)i, (uint32_t)sub, (uint32_t)(sub >> 32), stream,
                                       (uint32_t)seed, (uint32_t)(seed >> 32));
    const uint64_t u = (uint64_t)r.v[0] | ((uint64_t)r.v[1] << 32);
    const int64_t j = (int64_t)(((unsigned __int128)u * (uint64_t)(i + 1)) >> 64);
    std::swap(p[i], p[j]);
  }
  p.resize(std::min(n, k));
  return p;
}

// (Here beside the task readers, which the fuzz build compiles alone, rather than in data.cpp.)
void check_input_file(const std::string& flag, const std::string& path, const std::string& want) {
  ZOF_CHECK(!path.empty(), flag + " is empty; " + want);
  check_regular_file(flag + " " + path, path, want);
}

void check_task_data(Task task, const std::string& data) {
  if (task_kind(task) == TaskKind::Text) {
    check_input_file("--data", data, "--task text reads one plain-text file");
    return;
  }
  struct stat st;
  // A directory holds the task's files (load_task names a missing one); anything else is one file.
  if (::stat(data.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return;
  check_input_file("--data", data, data_wanted(task));
}

TaskData load_task(Task task, const std::string& data_path, const DataOptions& opt) {
  ZOF_CHECK(task_kind(task) != TaskKind::Text,
            "task \"text\" is read with load_text (token windows), not load_task");
  ZOF_CHECK(opt.train_examples >= 1, "--train-examples must be at least 1");
  ZOF_CHECK(opt.eval_examples >= 1, "--eval-examples must be at least 1");
  ZOF_CHECK(fs::exists(data_path), data_path + ": no such file or directory (check --data)");
  TaskData d;
  d.task = task;
  std::vector<Example> train, eval;
  if (fs::is_directory(data_path)) {
    const bool tsv = task == Task::Sst2;
    const std::string train_name = tsv ? "train.tsv" : "train.jsonl";
    const std::vector<std::string> eval_names =
        tsv ? std::vector<std::string>{"dev.tsv"}
            : std::vector<std::string>{"val.jsonl", "dev.jsonl"};
    const std::string expect = std::string("--task ") + word(task) + " expects " + train_name + " and " +
                               eval_names[0] + " in the --data directory";
    // Present in any form (a FIFO, a directory, a loop): a regular file, or refused as what it is.
    auto present = [](const fs::path& p) {
      std::error_code ec;
      return fs::exists(p, ec) || bool(ec);  // ec: there but unreachable (a symlink loop)
    };
    d.train_path = (fs::path(data_path) / train_name).string();
    ZOF_CHECK(present(d.train_path), data_path + ": no " + train_name + " (" + expect + ")");
    check_input_file("--data", d.train_path, expect);
    for (const auto& n : eval_names)
      if (d.eval_path.empty() && present(fs::path(data_path) / n))
        d.eval_path = (fs::path(data_path) / n).string();
    ZOF_CHECK(!d.eval_path.empty(), data_path + ": no " + eval_names[0] + " (" + expect + ")");
    check_input_file("--data", d.eval_path, expect);
    train = parse_task_file(task, d.train_path);
    eval = parse_task_file(task, d.eval_path);
  } else {
    d.train_path = d.eval_path = data_path;
    std::vector<Example> all = parse_task_file(task, data_path);
    const int64_t n = (int64_t)all.size();
    ZOF_CHECK(n >= 2, data_path +
                          ": only one example; a single --data file is split into train "
                          "and eval, which needs at least 2 (or pass a directory)");
    ZOF_CHECK(opt.eval_fraction > 0 && opt.eval_fraction < 1,
              "the eval fraction must be between 0 and 1");
    const int64_t n_eval =
        std::clamp<int64_t>((int64_t)std::llround(n * opt.eval_fraction), 1, n - 1);
    const auto perm = sample_indices(n, n, opt.seed, kStreamSplit);
    for (int64_t i = 0; i < n; ++i) (i < n_eval ? eval : train).push_back(all[perm[i]]);
  }
  d.train_available = (int64_t)train.size();
  d.eval_available = (int64_t)eval.size();
  for (int64_t i : sample_indices(d.train_available, opt.train_examples, opt.seed, kStreamTrain))
    d.train.push_back(train[i]);
  for (int64_t i : sample_indices(d.eval_available, opt.eval_examples, opt.seed, kStreamEval))
    d.eval.push_back(eval[i]);
  return d;
}

}  // namespace zof
