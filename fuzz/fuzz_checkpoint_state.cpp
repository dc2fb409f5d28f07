// Fuzz target: a checkpoint's state.json as `zof finetune --resume` reads it (parse_state, after
// the depth check and the JSON parse read_json makes), and the names of checkpoint directories
// (checkpoint_step). The input's first line is a directory name; the rest is state.json, for a
// run of 1000 steps.
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "hf/json_depth.h"
#include "train/run_dir.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string name(in.substr(0, nl));
  const std::string_view text = nl == std::string_view::npos ? "" : in.substr(nl + 1);
  const int64_t step = zof::train::checkpoint_step(name);
  // A name it accepts is what save_checkpoint writes for that step.
  if (step >= 0 && name != "checkpoint-" + std::to_string(step)) __builtin_trap();
  ZOF_FUZZ_REFUSE_OK({
    zof::check_json_depth(text, "state.json");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception&) {
      return 0;  // read_json's refusal: not JSON
    }
    const zof::train::RunCounters c = zof::train::parse_state(j, "state.json", 1000);
    // What the loop and the logs rely on.
    if (c.step < 0 || c.step > 1000 || c.bad_run < 0 || c.bad_run > c.step ||
        !std::isfinite(c.tokens) || c.tokens < 0 || !std::isfinite(c.train_s) ||
        c.train_s < 0 || c.metrics_bytes < 0 || c.log_bytes < 0)
      __builtin_trap();
  });
  return 0;
}
