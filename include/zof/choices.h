// The words a flag chooses among (--task sst2, --z rademacher, --device cuda), each an enum with
// its words in one table: the code compares enums, and only reading and writing text (flags,
// --config, run.json, Python's keywords, messages) meets the words.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zof {

// --task: the task a run trains and evaluates on (data.h reads each).
enum class Task : uint8_t { Sst2, Rte, Cb, Copa, Jsonl, Text };
// --objective: what a candidate task trains on (training_objective resolves auto).
enum class Objective : uint8_t { Auto, Lm, Classification };
// --dtype: the type of the matrix products (resolve_compute_dtype resolves auto).
enum class ComputeChoice : uint8_t { Auto, Bf16, Fp32 };
// --save-dtype: the saved model's tensors.
enum class SaveChoice : uint8_t { Auto, Fp32, Bf16, F16, Input };
// --save-format: the fine-tuned model's file: a Hugging Face directory (config.json,
// model.safetensors) or one GGUF file llama.cpp loads (model.gguf).
enum class SaveFormat : uint8_t { Safetensors, Gguf };
// --master: the master weights' type.
enum class MasterChoice : uint8_t { Fp32, Bf16 };
// --schedule: the learning rate over the run.
enum class Schedule : uint8_t { Constant, Linear, Cosine };
// --estimator: two-point SPSA (MeZO) or the forward gradient (jvp.h).
enum class EstimatorChoice : uint8_t { Spsa, Jvp };
// --z: the directions' distribution.
enum class ZChoice : uint8_t { Gaussian, Rademacher };
// --optimizer: ZO-SGD, with momentum, or ZO-Adam.
enum class OptimizerChoice : uint8_t { Sgd, Momentum, Adam };
// --device: where the work runs (reference: the scalar oracle; no flag offers it to finetune).
enum class DeviceChoice : uint8_t { Cpu, Cuda, Reference };

// Each enum's words, in its order.
std::span<const char* const> choice_words(Task);
std::span<const char* const> choice_words(Objective);
std::span<const char* const> choice_words(ComputeChoice);
std::span<const char* const> choice_words(SaveChoice);
std::span<const char* const> choice_words(SaveFormat);
std::span<const char* const> choice_words(MasterChoice);
std::span<const char* const> choice_words(Schedule);
std::span<const char* const> choice_words(EstimatorChoice);
std::span<const char* const> choice_words(ZChoice);
std::span<const char* const> choice_words(OptimizerChoice);
std::span<const char* const> choice_words(DeviceChoice);

// A value's word: word(Task::Sst2) is "sst2".
template <class E>
const char* word(E v) {
  return choice_words(E{})[static_cast<size_t>(v)];
}

// The value a word names, or nullopt.
template <class E>
std::optional<E> find_choice(std::string_view w) {
  const auto words = choice_words(E{});
  for (size_t i = 0; i < words.size(); ++i)
    if (w == words[i]) return static_cast<E>(i);
  return std::nullopt;
}

// "a, b or c".
std::string choice_list(const std::vector<const char*>& words);
// zof::Error "FLAG must be a, b or c, not 'x'": the refusal of a word outside `accepted`.
[[noreturn]] void throw_choice_refusal(const std::string& flag,
                                       const std::vector<const char*>& accepted,
                                       const std::string& text);

// The value of flag's text among the accepted words (empty: all of E's); zof::Error with
// choice_refusal for any other text.
template <class E>
E read_choice_text(const std::string& flag, const std::string& text,
                   const std::vector<const char*>& accepted = {}) {
  const auto all = choice_words(E{});
  const std::vector<const char*> ok = accepted.empty()
                                          ? std::vector<const char*>(all.begin(), all.end())
                                          : accepted;
  for (const char* w : ok)
    if (text == w) return *find_choice<E>(text);
  throw_choice_refusal(flag, ok, text);
}

// JSON (nlohmann's to_json/from_json, found by ADL): a choice is its word, never the enum's
// number, so run.json, summary.json and the step records read as the flags do. A word outside
// the enum's, or a value that is not a string, throws zof::Error.
template <class E>
E choice_from_word(const std::string& w) {
  if (const std::optional<E> v = find_choice<E>(w)) return *v;
  const auto all = choice_words(E{});
  throw_choice_refusal("the option", std::vector<const char*>(all.begin(), all.end()), w);
}
#define ZOF_CHOICE_JSON(E)                                                          \
  template <class J>                                                                \
  void to_json(J& j, const E& v) {                                                  \
    j = word(v);                                                                    \
  }                                                                                 \
  template <class J>                                                                \
  void from_json(const J& j, E& v) {                                                \
    v = choice_from_word<E>(j.is_string() ? j.template get<std::string>() : j.dump()); \
  }
ZOF_CHOICE_JSON(Task)
ZOF_CHOICE_JSON(Objective)
ZOF_CHOICE_JSON(ComputeChoice)
ZOF_CHOICE_JSON(SaveChoice)
ZOF_CHOICE_JSON(SaveFormat)
ZOF_CHOICE_JSON(MasterChoice)
ZOF_CHOICE_JSON(Schedule)
ZOF_CHOICE_JSON(EstimatorChoice)
ZOF_CHOICE_JSON(ZChoice)
ZOF_CHOICE_JSON(OptimizerChoice)
ZOF_CHOICE_JSON(DeviceChoice)
#undef ZOF_CHOICE_JSON

}  // namespace zof
