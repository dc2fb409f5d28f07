// Fuzz target: a task data file read by parse_task_file, as `zof finetune --task T --data F`
// reads it. The input's first line names the task (sst2, rte, cb, copa or jsonl, then
// " unlabelled" for require_labels = false); other first lines pick one by their first byte.
// The rest of the input is the file.
#include <string>

#include "fuzz_common.h"
#include "zof/data.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* const kTasks[] = {"sst2", "rte", "cb", "copa", "jsonl"};
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string_view first = in.substr(0, nl), file = nl == std::string_view::npos ? "" : in.substr(nl + 1);
  std::string task;
  bool require_labels = true;
  for (const char* t : kTasks) {
    if (first == t) task = t;
    if (first == std::string(t) + " unlabelled") task = t, require_labels = false;
  }
  if (task.empty()) {
    const unsigned char b = size ? data[0] : 0;
    task = kTasks[b % 5];
    require_labels = (b / 5) % 2 == 0;
  }
  const std::string path = zof::fuzz::write_file("data", file);
  ZOF_FUZZ_REFUSE_OK({
    const auto examples = zof::parse_task_file(*zof::find_choice<zof::Task>(task), path, require_labels);
    for (const auto& e : examples) {
      // What tokenize_example and the metrics rely on.
      if (e.candidates.empty()) __builtin_trap();
      if (e.label < -1 || e.label >= int(e.candidates.size())) __builtin_trap();
      if (require_labels && e.label < 0) __builtin_trap();
    }
  });
  return 0;
}
