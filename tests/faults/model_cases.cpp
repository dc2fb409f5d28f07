// Damaged model directories: weights, config and tokenizer files a user might hand zof.
#include "faults/fault_table.h"

namespace {

using zof::faults::Case;
using zof::faults::Sandbox;

std::vector<Case> model_cases() {
  const std::string gen = "generate --model {M} --max-new-tokens 2";
  return {
      {"TruncatedWeights",
       [](Sandbox& s) { std::filesystem::resize_file(s.model() / "model.safetensors", 100000); },
       gen, 1, "model\\.safetensors.*truncated"},
      {"HeaderLengthPastEndOfFile",
       [](Sandbox& s) {
         std::string f = s.read(s.model() / "model.safetensors");
         f[5] = 0x7f;
         s.write(s.model() / "model.safetensors", f);
       },
       gen, 1, "model\\.safetensors.*header"},
      {"WrongShape",
       [](Sandbox& s) {
         s.edit_json(s.model() / "config.json", [](auto& j) { j["intermediate_size"] = 170; });
       },
       gen, 1, "model\\.safetensors.*\\[170, 64\\]"},
      {"MalformedConfig",
       [](Sandbox& s) { s.write(s.model() / "config.json", "{\"model_type\": \"llama\","); },
       gen, 1, "config\\.json.*JSON"},
      {"UnknownArchitecture",
       [](Sandbox& s) {
         s.write(s.model() / "config.json", "{\"model_type\": \"bert\", \"vocab_size\": 10}");
       },
       gen, 1, "config\\.json.*bert"},
      {"UnsupportedTokenizer",
       [](Sandbox& s) {
         std::string t = s.read(s.model() / "tokenizer.json");
         t.replace(t.find("\"type\": \"BPE\""), 13, "\"type\": \"WordPiece\"");
         s.write(s.model() / "tokenizer.json", t);
       },
       gen, 1, "tokenizer\\.json.*WordPiece"},
      {"MissingWeights",
       [](Sandbox& s) { std::filesystem::remove(s.model() / "model.safetensors"); }, gen, 1,
       "model\\.safetensors"},
      {"EvalMissingText", {}, "eval --model {M} --text {S}/nonexistent.txt", 1,
       "--text .*nonexistent\\.txt"},
      {"EvalWindowLongerThanContext", {}, "eval --model {M} --text {T} --seq-len 4096", 1,
       "--seq-len"},
      {"FinetuneOutHoldsARun", {}, "finetune {F} --out {R}", 1,
       "already holds a run.*--resume"},
  };
}

ZOF_FAULT_TABLE(ModelFaults, model_cases());

}  // namespace
