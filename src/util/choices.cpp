// The words of each choice (zof/choices.h), in its enum's order.
#include "zof/choices.h"

#include "zof/error.h"

namespace zof {

namespace {
constexpr const char* kTask[] = {"sst2", "rte", "cb", "copa", "jsonl", "text"};
constexpr const char* kObjective[] = {"auto", "lm", "classification"};
constexpr const char* kCompute[] = {"auto", "bf16", "fp32"};
constexpr const char* kSave[] = {"auto", "fp32", "bf16", "f16", "input"};
constexpr const char* kSaveFormat[] = {"safetensors", "gguf"};
constexpr const char* kMaster[] = {"fp32", "bf16"};
constexpr const char* kSchedule[] = {"constant", "linear", "cosine"};
constexpr const char* kEstimator[] = {"spsa", "jvp"};
constexpr const char* kZ[] = {"gaussian", "rademacher"};
constexpr const char* kOptimizer[] = {"sgd", "momentum", "adam"};
constexpr const char* kDevice[] = {"cpu", "cuda", "reference"};
}  // namespace

std::span<const char* const> choice_words(Task) { return kTask; }
std::span<const char* const> choice_words(Objective) { return kObjective; }
std::span<const char* const> choice_words(ComputeChoice) { return kCompute; }
std::span<const char* const> choice_words(SaveChoice) { return kSave; }
std::span<const char* const> choice_words(SaveFormat) { return kSaveFormat; }
std::span<const char* const> choice_words(MasterChoice) { return kMaster; }
std::span<const char* const> choice_words(Schedule) { return kSchedule; }
std::span<const char* const> choice_words(EstimatorChoice) { return kEstimator; }
std::span<const char* const> choice_words(ZChoice) { return kZ; }
std::span<const char* const> choice_words(OptimizerChoice) { return kOptimizer; }
std::span<const char* const> choice_words(DeviceChoice) { return kDevice; }

std::string choice_list(const std::vector<const char*>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return s;
}

void throw_choice_refusal(const std::string& flag, const std::vector<const char*>& accepted,
                          const std::string& text) {
  throw Error(flag + " must be " + choice_list(accepted) + ", not '" + text + "'");
}

}  // namespace zof
