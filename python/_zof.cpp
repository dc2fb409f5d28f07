// zof._zof: the nanobind module over the C++ library the CLI links. It mirrors the CLI
// (tools/commands.cpp: same library calls, same errors); python/zof/__init__.py is the Python face around it.
// JSON results cross as strings (the CLI's --json text), parsed on the Python side.
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "zof/backend.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/input_file.h"
#include "zof/model.h"
#include "zof/runtime.h"
#include "zof/streaming.h"
#include "zof/text.h"
#include "zof/tokenizer.h"
#include "zof/trainer.h"
#include "zof/version.h"

namespace nb = nanobind;
using json = nlohmann::json;

namespace {

// --threads as the CLI reads it.
int read_threads(const std::string& text) {
  const zof::NumberRule& r = *zof::train_flag_rule("--threads");
  const int v = zof::read_int_text("--threads", text, r);
  zof::check_whole("--threads", v, r);
  return v;
}

// A loaded model with the host backend that runs it; the tokenizer is read on first use, so a
// model directory without tokenizer.json still gives logits.
class PyModel {
 public:
  // threads: the keyword's text, read as the CLI reads --threads.
  // host_mem: the keyword's text ("": every block in RAM), read as --host-mem is; the blocks
  // beyond it go into a scratch disk tier in offload_dir ("": the current directory).
  PyModel(const std::string& path, const std::string& device, const std::string& threads,
          const std::string& host_mem, const std::string& offload_dir) {
    // generate and eval run on the host, as on the CLI; fine-tuning takes device="cuda".
    ZOF_CHECK(device == "cpu" || device == "reference",
              "device must be cpu (or reference, the scalar oracle), not '" + device +
                  "': evaluation and generation run on the CPU; fine-tune on a GPU with "
                  "zof.finetune(device=\"cuda\")");
    zof::BackendOptions b;
    b.device = *zof::find_choice<zof::DeviceChoice>(device);
    b.threads = read_threads(threads);
    backend_ = zof::make_backend(b);
    zof::check_model_dir("--model", path);  // as the CLI's eval and generate
    ZOF_CHECK(offload_dir.empty() || !host_mem.empty(),
              "offload_dir holds the blocks that do not fit host_mem: add host_mem=SIZE, or "
              "drop offload_dir");
    const uint64_t budget = host_mem.empty() ? 0 : zof::parse_memory_size(host_mem, "host_mem");
    weights_ = zof::lay_out_text_weights(path, budget, "host_mem");
    zof::WeightPlacement p;
    zof::read_text_weights(*weights_, path, budget, offload_dir, "offload_dir", p);
    host_ = p.host;
  }

  // logits (B, T, V) of right-padded rows; positions past a row's length are 0.
  nb::ndarray<nb::numpy, float, nb::ndim<3>> logits(const std::vector<std::vector<int64_t>>& ids) {
    ZOF_CHECK(!ids.empty(), "logits: no sequences given");
    const int64_t V = model().config().vocab_size;
    std::vector<std::vector<int32_t>> rows;
    for (const auto& r : ids) {
      ZOF_CHECK(!r.empty(), "logits: every sequence needs a token");
      for (const int64_t t : r)
        ZOF_CHECK(t >= 0 && t < V, "logits: token id " + std::to_string(t) +
                                       " is outside the model's vocabulary (0 to " +
                                       std::to_string(V - 1) + ")");
      rows.emplace_back(r.begin(), r.end());
    }
    // Packed, as every walk runs: on the CPU a sequence's logits do not depend on the others.
    const zof::Batch batch = zof::Batch::from_sequences(rows).pack();
    auto* out = new float[(size_t)(batch.B * batch.T * V)];
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
      nb::gil_scoped_release release;
      std::vector<float> l;
      zof::Forward fwd(model(), *backend_, std::max<int64_t>(batch.rows(), 2));
      if (host_) fwd.set_host_blocks(host_);  // the disk tier's blocks, read as it walks
      fwd.logits(batch, l);
      for (int64_t b = 0; b < batch.B; ++b)
        for (int64_t t = 0; t < batch.T; ++t) {
          float* dst = out + (b * batch.T + t) * V;
          if (t < batch.lengths[b])
            std::memcpy(dst, l.data() + batch.row(b, t) * V, V * sizeof(float));
          else
            std::memset(dst, 0, V * sizeof(float));
        }
    }
    return {out, {(size_t)batch.B, (size_t)batch.T, (size_t)V}, owner};
  }

  // dtype: --dtype's word (auto resolved against this model's backend, as the CLI does).
  zof::WeightPlacement placement(const std::string& dtype) const {
    zof::WeightPlacement p;
    p.host = host_;
    p.compute = zof::resolve_compute_dtype(
        zof::read_choice_text<zof::ComputeChoice>("--dtype", dtype), *backend_);
    return p;
  }

  // eval's numbers as text (seq_len "": the default, the context at most 512), each read and
  // checked as the CLI reads its flag, before the file is read; path: a file read as --text (a
  // FIFO, a device or a directory refused, never opened); else text is the text itself.
  std::string eval(const std::optional<std::string>& path, const std::string& text,
                   const std::string& seq_len, const std::string& batch,
                   const std::string& max_windows, const std::string& dtype) {
    const int64_t n = seq_len.empty() ? 0 : whole("--seq-len", seq_len);
    const int64_t b = whole("--batch", batch), w = whole("--max-windows", max_windows);
    const zof::WeightPlacement p = placement(dtype);
    nb::gil_scoped_release release;
    const std::string body = path ? zof::read_eval_text(*path) : text;
    return zof::evaluate_text(model(), tokenizer(), *backend_, body,
                              path ? "--text " + *path : "the text", n, b, w, p)
        .dump();
  }

  // eval(task=): a task's held-out metric as `zof eval --task`, options as finetune's keywords
  // (task, data, eval_examples, seq_len, batch, seed), each read as the CLI reads its flag.
  std::string eval_task(const std::vector<std::pair<std::string, std::string>>& options,
                        const std::string& dtype) {
    zof::TrainOptions t;
    t.model = model().source();
    for (const auto& [key, text] : options) zof::set_train_option(t, key, text);
    ZOF_CHECK(!t.data.empty(), "eval(task=" + std::string(zof::word(t.task)) +
                                   ") needs data=, the task's data file or directory");
    zof::validate_options(t);
    zof::check_task_data(t.task, t.data);
    const zof::WeightPlacement p = placement(dtype);
    const zof::Tokenizer& tok = tokenizer();
    nb::gil_scoped_release release;
    return zof::evaluate_task(model(), tok, *backend_, t, p).dump();
  }

  std::string generate(const std::string& prompt, const std::string& max_new_tokens,
                       const std::string& temperature, const std::string& top_p,
                       const std::string& seed, const std::string& dtype) {
    zof::SampleOptions opt;
    opt.max_new_tokens = whole("--max-new-tokens", max_new_tokens);
    opt.temperature = real("--temperature", temperature);
    opt.top_p = real("--top-p", top_p);
    opt.seed = zof::read_seed_text("--seed", seed);
    const zof::WeightPlacement p = placement(dtype);
    nb::gil_scoped_release release;
    return zof::generate_text(model(), tokenizer(), *backend_, prompt, opt, {}, p).dump();
  }

  static int64_t whole(const char* flag, const std::string& text) {
    const zof::NumberRule& r = *zof::text_flag_rule(flag);
    const int64_t v = zof::read_whole_text(flag, text, r);
    zof::check_whole(flag, v, r);
    return v;
  }
  static float real(const char* flag, const std::string& text) {
    const zof::NumberRule& r = *zof::text_flag_rule(flag);
    const float v = zof::read_float_text(flag, text, r);
    zof::check_real(flag, v, r);
    return v;
  }

  std::string config() const { return model().config().raw.dump(); }
  int64_t num_params() const { return model().num_params(); }
  std::string source() const { return model().source(); }

 private:
  const zof::Tokenizer& tokenizer() {
    if (!tok_) tok_ = std::make_unique<zof::Tokenizer>(zof::Tokenizer::load(model().source()));
    return *tok_;
  }
  std::unique_ptr<zof::Backend> backend_;
  zof::Model& model() const { return weights_->model; }
  std::unique_ptr<zof::TextWeights> weights_;  // the model, and its disk tier with host_mem
  zof::BlockAccess* host_ = nullptr;
  std::unique_ptr<zof::Tokenizer> tok_;
};

// The run's progress to Python: messages and per-step metrics (as JSON text) to callbacks that
// hold the GIL only while they run; a stop request from on_step ends the run with a checkpoint.
// A Python exception in a callback stops the run too and is raised once finetune returns.
class PySink : public zof::TrainSink {
 public:
  PySink(nb::callable message, nb::callable step, zof::TrainSink* terminal)
      : message_(std::move(message)), step_(std::move(step)), terminal_(terminal) {}
  void message(const std::string& line) override {
    if (terminal_) terminal_->message(line);
    nb::gil_scoped_acquire gil;
    call([&] { message_(line); });
  }
  bool on_step(const zof::StepReport& r) override {
    if (terminal_) terminal_->on_step(r);
    json m{{"step", r.step},
           {"steps", r.steps},
           {"first_step", r.first_step},
           {"evaluated", r.evaluated},
           {"recent_loss", r.recent_loss},
           {"metric", r.metric},
           {"metric_value", r.metric_value},
           {"tokens_per_s", r.tokens_per_s},
           {"elapsed_s", r.elapsed_s}};
    if (r.record) m["record"] = *r.record;
    const std::string text = m.dump();
    nb::gil_scoped_acquire gil;
    bool stop = false;
    call([&] { stop = nb::cast<bool>(step_(text)); });
    return stop || error_.has_value();
  }
  void finish() override {
    if (terminal_) terminal_->finish();
  }
  // Raises the first callback exception, if any (with the GIL held).
  void rethrow() {
    if (error_) throw std::move(*error_);
  }

 private:
  template <class F>
  void call(F f) {
    if (error_) return;
    try {
      f();
    } catch (nb::python_error& e) {
      error_.emplace(std::move(e));
    }
  }
  nb::callable message_, step_;
  zof::TrainSink* terminal_;
  std::optional<nb::python_error> error_;
};

// options: each keyword's text, set as the CLI sets its flag (zof::set_train_option); the keys
// given are what --resume's rule checks.
std::string finetune(const std::vector<std::pair<std::string, std::string>>& options,
                     nb::callable message, nb::callable step, bool progress) {
  zof::TrainOptions opt;
  zof::GivenOptions given;
  for (const auto& [key, text] : options) {
    zof::set_train_option(opt, key, text);
    given[key] = "";
  }
  // The CLI's checks before zof::finetune (tools/commands.cpp run_finetune), word for word.
  if (opt.resume.empty()) {
    ZOF_CHECK(!opt.model.empty(), "finetune needs --model DIR (or --resume RUN_DIR)");
    ZOF_CHECK(!opt.out.empty(), "finetune needs --out DIR, the run directory to write");
    ZOF_CHECK(!opt.data.empty(), "finetune needs --data PATH, the task's data file or directory");
    zof::validate_options(opt);
    zof::check_model_dir("--model", opt.model);
    zof::check_task_data(opt.task, opt.data);
  }
  std::unique_ptr<zof::TrainSink> terminal = progress ? zof::make_terminal_sink() : nullptr;
  PySink sink(std::move(message), std::move(step), terminal.get());
  json summary;
  {
    nb::gil_scoped_release release;
    summary = zof::finetune(opt, &sink, &given);
  }
  sink.rethrow();
  return summary.dump();
}

std::string replay(const std::string& model, const std::string& log, const std::string& out,
                   const std::string& threads) {
  const int t = read_threads(threads);
  zof::check_model_dir("--model", model);
  nb::gil_scoped_release release;
  return zof::replay(model, log, out, t).dump();
}

}  // namespace

NB_MODULE(_zof, m) {
  m.doc() = "zof's C++ library (the one the CLI uses); see the zof package for the API";
  // zof.Error: what the CLI prints after "zof: error: ", as a ValueError.
  static nb::exception<zof::Error> error(m, "Error", PyExc_ValueError);
  // The CLI's message for running out of memory, as the same exception.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::bad_alloc&) {
      PyErr_SetString(error.ptr(), "out of memory (try a smaller --batch or --seq-len)");
    }
  });
  m.def("version", [] { return std::string(zof::version()); });

  // The table of finetune's options (zof/options.h) as JSON: key, flag, help, kind ("text",
  // "switch", "number"), choices, saved, default, and a number's rule in words.
  m.def("train_options", [] {
    json all = json::array();
    const zof::TrainOptions defaults;
    for (const zof::OptionSpec& s : zof::train_options()) {
      const json d = s.get(defaults);
      json e{{"key", s.key},
             {"flag", s.flag()},
             {"help", s.help},
             {"kind", d.is_string() ? "text" : d.is_boolean() ? "switch" : "number"},
             {"choices", json::array()},
             {"saved", s.saved},
             {"default", d}};
      for (const char* c : s.choices) e["choices"].push_back(c);
      if (const zof::NumberRule* r = s.rule()) e["accepts"] = r->words();
      all.push_back(e);
    }
    return all.dump();
  });

  nb::class_<PyModel>(m, "Model")
      .def(nb::init<const std::string&, const std::string&, const std::string&,
                    const std::string&, const std::string&>(),
           nb::arg("path"), nb::arg("device"), nb::arg("threads"), nb::arg("host_mem"),
           nb::arg("offload_dir"))
      .def("logits", &PyModel::logits, nb::arg("rows"))
      .def("eval", &PyModel::eval, nb::arg("path").none(), nb::arg("text"), nb::arg("seq_len"),
           nb::arg("batch"), nb::arg("max_windows"), nb::arg("dtype"))
      .def("eval_task", &PyModel::eval_task, nb::arg("options"), nb::arg("dtype"))
      .def("generate", &PyModel::generate, nb::arg("prompt"), nb::arg("max_new_tokens"),
           nb::arg("temperature"), nb::arg("top_p"), nb::arg("seed"), nb::arg("dtype"))
      .def("config", &PyModel::config)
      .def("num_params", &PyModel::num_params)
      .def("source", &PyModel::source);

  m.def("finetune", &finetune, nb::arg("options"), nb::arg("message"), nb::arg("on_step"),
        nb::arg("progress"));
  m.def("replay", &replay, nb::arg("model"), nb::arg("log"), nb::arg("out"),
        nb::arg("threads"));
}
