// The checkpoint's state.json and the names of checkpoint directories, as a resumed run reads
// them (run_dir.h): apart from the rest of the run directory so that the fuzz target
// (fuzz/fuzz_checkpoint_state.cpp) builds with the parsers alone.
#include <cctype>
#include <cmath>
#include <limits>

#include "train/run_dir.h"
#include "zof/error.h"

using json = nlohmann::json;

namespace zof::train {

const char* const kDamaged = "the run directory is damaged; restore the file from a copy, or start a new run";

// "checkpoint-<digits>" with no leading zeros (as save_checkpoint names them); its step or -1.
int64_t checkpoint_step(const std::string& name) {
  const std::string pre = "checkpoint-";
  if (name.rfind(pre, 0) != 0 || name.size() == pre.size() || name.size() > pre.size() + 18)
    return -1;
  int64_t step = 0;
  for (size_t i = pre.size(); i < name.size(); ++i) {
    if (!std::isdigit((unsigned char)name[i])) return -1;
    step = step * 10 + (name[i] - '0');
  }
  if (name[pre.size()] == '0' && name.size() > pre.size() + 1) return -1;
  return step;
}

RunCounters parse_state(const json& j, const std::string& file, int64_t max_steps) {
  auto fail = [&](const std::string& key, const std::string& what) {
    throw Error(file + ": \"" + key + "\" " + what + "; " + kDamaged);
  };
  if (!j.is_object())
    throw Error(file + " must hold a JSON object, not " + std::string(j.type_name()) + "; " +
                kDamaged);
  auto shown = [](const json& v) {
    const std::string d = v.dump();
    return d.size() > 40 ? d.substr(0, 40) + "..." : d;
  };
  auto integer = [&](const char* key, bool required, int64_t lo, int64_t hi,
                     const std::string& range) -> int64_t {
    auto it = j.find(key);
    if (it == j.end()) {
      if (required) fail(key, "is missing");
      return 0;
    }
    const json& v = *it;
    const bool ok = v.is_number_integer() &&
                    (!v.is_number_unsigned() || v.get<uint64_t>() <= (uint64_t)INT64_MAX) &&
                    v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    if (!ok) fail(key, "is " + shown(v) + "; it must be " + range);
    return v.get<int64_t>();
  };
  auto number = [&](const char* key) -> double {
    auto it = j.find(key);
    if (it == j.end()) return 0;
    const json& v = *it;
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      fail(key, "is " + shown(v) + "; it must be a finite number >= 0");
    return v.get<double>();
  };
  RunCounters c;
  c.step = integer("step", true, 0, max_steps,
                   "an integer from 0 to " + std::to_string(max_steps) + " (the run's --steps)");
  c.bad_run = integer("bad_run", false, 0, c.step,
                      "an integer from 0 to the step (" + std::to_string(c.step) + ")");
  c.tokens = number("tokens");
  c.train_s = number("train_s");
  const int64_t big = std::numeric_limits<int64_t>::max();
  c.metrics_bytes = integer("metrics_bytes", true, 0, big, "a size in bytes (an integer >= 0)");
  c.log_bytes = integer("log_bytes", true, 0, big, "a size in bytes (an integer >= 0)");
  // A ByteHash text; absent in checkpoints of an older zof.
  auto hash = [&](const char* key) -> std::string {
    auto h = j.find(key);
    if (h == j.end()) return "";
    const std::string pre = "fnv1a64:";
    const std::string t = h->is_string() ? h->get<std::string>() : std::string();
    bool ok = t.size() == pre.size() + 16 && t.rfind(pre, 0) == 0;
    for (size_t i = pre.size(); ok && i < t.size(); ++i)
      ok = std::isdigit((unsigned char)t[i]) || (t[i] >= 'a' && t[i] <= 'f');
    if (!ok) fail(key, "is " + shown(*h) + "; it must be \"fnv1a64:\" and 16 hex digits");
    return t;
  };
  c.log_hash = hash("log_hash");
  c.run_seal = hash("run_seal");
  if (j.contains("window_from"))  // a stop inside a rounding window (RunCounters::window_from)
    c.window_from = integer("window_from", false, 0, c.step > 0 ? c.step - 1 : 0,
                            "an integer from 0 to the step before " + std::to_string(c.step));
  auto eb = j.find("eval_before");
  if (eb != j.end() && !eb->is_null()) {
    const json& e = *eb;
    auto m = e.is_object() ? e.find("metric") : e.end();
    auto v = e.is_object() ? e.find("value") : e.end();
    // A non-finite metric (a perplexity that overflowed) is written by the JSON library as null.
    if (!e.is_object() || m == e.end() || !m->is_string() || v == e.end() ||
        !(v->is_number() || v->is_null()))
      fail("eval_before", "is " + shown(e) +
                              "; it must be null or an evaluation record with a string "
                              "\"metric\" and a number (or null) \"value\"");
    c.eval_before = e;
  }
  return c;
}

}  // namespace zof::train
