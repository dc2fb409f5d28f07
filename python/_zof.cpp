// zof._zof: the nanobind module over the C++ library the CLI links. It mirrors tools/zof.cpp
// (same library calls, same errors); python/zof/__init__.py is the Python face around it.
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
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "zof/backend.h"
#include "zof/error.h"
#include "zof/forward.h"
#include "zof/input_file.h"
#include "zof/model.h"
#include "zof/runtime.h"
#include "zof/text.h"
#include "zof/tokenizer.h"
#include "zof/trainer.h"
#include "zof/version.h"

namespace nb = nanobind;
using json = nlohmann::json;

namespace {

// A loaded model with the host backend that runs it; the tokenizer is read on first use, so a
// model directory without tokenizer.json still gives logits.
class PyModel {
 public:
  PyModel(const std::string& path, const std::string& device, int threads) {
    // generate and eval run on the host, as on the CLI; fine-tuning takes device="cuda".
    ZOF_CHECK(device == "cpu" || device == "reference",
              "device must be cpu (or reference, the scalar oracle), not '" + device +
                  "': evaluation and generation run on the CPU; fine-tune on a GPU with "
                  "zof.finetune(device=\"cuda\")");
    zof::BackendOptions b;
    b.device = device;
    b.threads = threads;
    backend_ = zof::make_backend(b);
    zof::check_model_dir("--model", path);  // as the CLI's eval and generate
    model_ = zof::Model::load(path);
  }

  // logits (B, T, V) of right-padded rows; positions past a row's length are 0.
  nb::ndarray<nb::numpy, float, nb::ndim<3>> logits(const std::vector<std::vector<int32_t>>& rows) {
    for (const auto& r : rows) ZOF_CHECK(!r.empty(), "logits: every sequence needs a token");
    ZOF_CHECK(!rows.empty(), "logits: no sequences given");
    zof::Batch batch = zof::Batch::from_sequences(rows);
    const int64_t V = model_.config().vocab_size;
    auto* out = new float[(size_t)(batch.B * batch.T * V)];
    nb::capsule owner(out, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
      nb::gil_scoped_release release;
      std::vector<float> l;
      zof::Forward fwd(model_, *backend_, batch.B * batch.T);
      fwd.logits(batch, l);
      for (int64_t b = 0; b < batch.B; ++b)
        for (int64_t t = 0; t < batch.T; ++t) {
          float* dst = out + (b * batch.T + t) * V;
          if (t < batch.lengths[b])
            std::memcpy(dst, l.data() + (b * batch.T + t) * V, V * sizeof(float));
          else
            std::memset(dst, 0, V * sizeof(float));
        }
    }
    return {out, {(size_t)batch.B, (size_t)batch.T, (size_t)V}, owner};
  }

  // dtype: --dtype's word (auto resolved against this model's backend, as the CLI does).
  zof::WeightPlacement placement(const std::string& dtype) const {
    zof::WeightPlacement p;
    p.compute = zof::resolve_compute_dtype(dtype, *backend_);
    return p;
  }

  std::string eval(const std::string& text, const std::string& source, int64_t seq_len,
                   int64_t batch, int64_t max_windows, const std::string& dtype) {
    const zof::WeightPlacement p = placement(dtype);
    nb::gil_scoped_release release;
    return zof::evaluate_text(model_, tokenizer(), *backend_, text, source, seq_len, batch,
                              max_windows, p)
        .dump();
  }

  std::string generate(const std::string& prompt, int64_t max_new_tokens, float temperature,
                       float top_p, uint64_t seed, const std::string& dtype) {
    // The CLI's ranges for these flags (CLI11 checks them there).
    ZOF_CHECK(max_new_tokens >= 1, "--max-new-tokens must be at least 1");
    ZOF_CHECK(temperature >= 0.f && temperature <= 100.f, "--temperature must be in [0, 100]");
    ZOF_CHECK(top_p > 0.f && top_p <= 1.f, "--top-p must be in (0, 1]");
    zof::SampleOptions opt;
    opt.max_new_tokens = max_new_tokens;
    opt.temperature = temperature;
    opt.top_p = top_p;
    opt.seed = seed;
    const zof::WeightPlacement p = placement(dtype);
    nb::gil_scoped_release release;
    return zof::generate_text(model_, tokenizer(), *backend_, prompt, opt, {}, p).dump();
  }

  std::string config() const { return model_.config().raw.dump(); }
  int64_t num_params() const { return model_.num_params(); }
  std::string source() const { return model_.source(); }

 private:
  const zof::Tokenizer& tokenizer() {
    if (!tok_) tok_ = std::make_unique<zof::Tokenizer>(zof::Tokenizer::load(model_.source()));
    return *tok_;
  }
  std::unique_ptr<zof::Backend> backend_;
  zof::Model model_;
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

std::string finetune(zof::TrainOptions opt, nb::callable message, nb::callable step,
                     bool progress) {
  // The CLI's checks before zof::finetune (tools/zof.cpp run_finetune), word for word.
  if (opt.resume.empty()) {
    ZOF_CHECK(!opt.model.empty(), "finetune needs --model DIR (or --resume RUN_DIR)");
    ZOF_CHECK(!opt.out.empty(), "finetune needs --out DIR, the run directory to write");
    ZOF_CHECK(!opt.data.empty(), "finetune needs --data PATH, the task's data file or directory");
    zof::check_model_dir("--model", opt.model);
  }
  std::unique_ptr<zof::TrainSink> terminal = progress ? zof::make_terminal_sink() : nullptr;
  PySink sink(std::move(message), std::move(step), terminal.get());
  json summary;
  {
    nb::gil_scoped_release release;
    summary = zof::finetune(opt, &sink);
  }
  sink.rethrow();
  return summary.dump();
}

std::string replay(const std::string& model, const std::string& log, const std::string& out,
                   int threads) {
  zof::check_model_dir("--model", model);
  nb::gil_scoped_release release;
  return zof::replay(model, log, out, threads).dump();
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

  nb::class_<zof::TrainOptions> t(m, "TrainOptions");
  t.def(nb::init<>());
#define ZOF_FIELD(name) t.def_rw(#name, &zof::TrainOptions::name)
  ZOF_FIELD(model); ZOF_FIELD(task); ZOF_FIELD(objective); ZOF_FIELD(dtype); ZOF_FIELD(save_dtype); ZOF_FIELD(master); ZOF_FIELD(tf32); ZOF_FIELD(data); ZOF_FIELD(out);
  ZOF_FIELD(steps); ZOF_FIELD(lr); ZOF_FIELD(eps); ZOF_FIELD(weight_decay);
  ZOF_FIELD(batch); ZOF_FIELD(micro_batches); ZOF_FIELD(queries); ZOF_FIELD(seed);
  ZOF_FIELD(schedule); ZOF_FIELD(estimator); ZOF_FIELD(z); ZOF_FIELD(one_sided);
  ZOF_FIELD(sparsity); ZOF_FIELD(optimizer); ZOF_FIELD(beta1); ZOF_FIELD(beta2);
  ZOF_FIELD(adam_eps); ZOF_FIELD(warmup); ZOF_FIELD(eval_every); ZOF_FIELD(save_every);
  ZOF_FIELD(train_examples); ZOF_FIELD(eval_examples); ZOF_FIELD(seq_len);
  ZOF_FIELD(max_bad_steps); ZOF_FIELD(round_every); ZOF_FIELD(threads); ZOF_FIELD(resume);
  ZOF_FIELD(pipeline_stages); ZOF_FIELD(dist_timeout); ZOF_FIELD(gpu_mem);
  ZOF_FIELD(sim_device); ZOF_FIELD(device);
#undef ZOF_FIELD

  nb::class_<PyModel>(m, "Model")
      .def(nb::init<const std::string&, const std::string&, int>(), nb::arg("path"),
           nb::arg("device") = "cpu", nb::arg("threads") = 0)
      .def("logits", &PyModel::logits, nb::arg("rows"))
      .def("eval", &PyModel::eval, nb::arg("text"), nb::arg("source"), nb::arg("seq_len"),
           nb::arg("batch"), nb::arg("max_windows"), nb::arg("dtype"))
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
