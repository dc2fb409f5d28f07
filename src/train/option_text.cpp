// Options as text: what the CLI's flags and Python's keywords hand the library, set here once so
// that both faces accept and refuse exactly the same values with the same words (the readers of
// number_rule.h, then the field's rule, train_flag_rule).
#include <functional>

#include "zof/error.h"
#include "zof/trainer.h"

namespace zof {

namespace {

// One settable option: its flag and how its text is read into the field.
struct Setter {
  const char* key;
  std::function<void(TrainOptions&, const std::string& flag, const std::string& text)> set;
};

template <class T>
Setter number(const char* key, T TrainOptions::*field) {
  return {key, [field](TrainOptions& o, const std::string& flag, const std::string& text) {
            const NumberRule* r = train_flag_rule(flag);
            const NumberRule rule = r ? *r : NumberRule{};
            if constexpr (std::is_same_v<T, float>)
              o.*field = read_float_text(flag, text, rule);
            else if constexpr (std::is_same_v<T, double>)
              o.*field = read_real_text(flag, text, rule);
            else if constexpr (std::is_same_v<T, int>)
              o.*field = read_int_text(flag, text, rule);
            else if constexpr (std::is_same_v<T, uint64_t>)
              o.*field = read_seed_text(flag, text);
            else
              o.*field = read_whole_text(flag, text, rule);
          }};
}

Setter word(const char* key, std::string TrainOptions::*field) {
  return {key, [field](TrainOptions& o, const std::string&, const std::string& text) {
            o.*field = text;
          }};
}

Setter flag(const char* key, bool TrainOptions::*field) {
  return {key, [field](TrainOptions& o, const std::string& flag, const std::string& text) {
            o.*field = read_switch_text(flag, text);
          }};
}

// Every field of TrainOptions a caller may set, in TrainOptions' order (the values' words are the
// validation's: validate_options).
const std::vector<Setter>& setters() {
  static const std::vector<Setter> s = {
      word("model", &TrainOptions::model),
      word("task", &TrainOptions::task),
      word("data", &TrainOptions::data),
      word("out", &TrainOptions::out),
      word("objective", &TrainOptions::objective),
      word("dtype", &TrainOptions::dtype),
      word("save_dtype", &TrainOptions::save_dtype),
      word("master", &TrainOptions::master),
      flag("tf32", &TrainOptions::tf32),
      number("steps", &TrainOptions::steps),
      number("lr", &TrainOptions::lr),
      number("eps", &TrainOptions::eps),
      number("weight_decay", &TrainOptions::weight_decay),
      number("batch", &TrainOptions::batch),
      number("micro_batches", &TrainOptions::micro_batches),
      number("queries", &TrainOptions::queries),
      number("seed", &TrainOptions::seed),
      word("schedule", &TrainOptions::schedule),
      word("estimator", &TrainOptions::estimator),
      word("z", &TrainOptions::z),
      flag("one_sided", &TrainOptions::one_sided),
      number("sparsity", &TrainOptions::sparsity),
      word("optimizer", &TrainOptions::optimizer),
      number("beta1", &TrainOptions::beta1),
      number("beta2", &TrainOptions::beta2),
      number("adam_eps", &TrainOptions::adam_eps),
      number("warmup", &TrainOptions::warmup),
      number("eval_every", &TrainOptions::eval_every),
      number("save_every", &TrainOptions::save_every),
      number("train_examples", &TrainOptions::train_examples),
      number("eval_examples", &TrainOptions::eval_examples),
      number("seq_len", &TrainOptions::seq_len),
      number("max_bad_steps", &TrainOptions::max_bad_steps),
      number("round_every", &TrainOptions::round_every),
      number("threads", &TrainOptions::threads),
      flag("json", &TrainOptions::json),
      flag("no_report", &TrainOptions::no_report),
      word("resume", &TrainOptions::resume),
      number("pipeline_stages", &TrainOptions::pipeline_stages),
      number("dist_timeout", &TrainOptions::dist_timeout),
      word("gpu_mem", &TrainOptions::gpu_mem),
      flag("sim_device", &TrainOptions::sim_device),
      word("device", &TrainOptions::device),
  };
  return s;
}

}  // namespace

std::string option_flag(const std::string& key) {
  std::string f = "--" + key;
  for (auto& c : f) c = c == '_' ? '-' : c;
  return f;
}

std::vector<std::string> train_option_keys() {
  std::vector<std::string> keys;
  for (const Setter& s : setters()) keys.push_back(s.key);
  return keys;
}

void set_train_option(TrainOptions& o, const std::string& key, const std::string& text) {
  for (const Setter& s : setters())
    if (key == s.key) return s.set(o, option_flag(key), text);
  throw Error("'" + key + "' is not an option of zof finetune");
}

}  // namespace zof
