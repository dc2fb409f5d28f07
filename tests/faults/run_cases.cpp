// Damaged and hostile run directories and the runs' outputs: checkpoints' state.json, run.json,
// `latest`, logs that do not match their checkpoint, a second writer, an --out that would
// overwrite an input, runs that go non-finite, replay from other weights, and model files a run
// starts from (sizes beyond the weights, NaN weights, duplicate tensor names).
#include <cstring>

#include "faults/fault_table.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::faults::Case;
using zof::faults::hold_lock;
using zof::faults::release_lock;
using zof::faults::Sandbox;

// The header of a safetensors file: its JSON and the data section's offset.
json header_of(const std::string& bytes, uint64_t* data_at) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  *data_at = 8 + n;
  return json::parse(bytes.substr(8, n));
}

// Element `index` of F32 tensor `name` in a safetensors file set to v.
void poke(Sandbox& s, const fs::path& file, const std::string& name, int64_t index, float v) {
  std::string b = s.read(file);
  uint64_t data_at = 0;
  const json h = header_of(b, &data_at);
  const uint64_t at = data_at + h.at(name).at("data_offsets")[0].get<uint64_t>() + 4 * index;
  std::memcpy(&b[at], &v, 4);
  s.write(file, b);
}

// The header with a second entry for `name` (the same bytes), written before the first.
void duplicate_entry(Sandbox& s, const fs::path& file, const std::string& name) {
  const std::string b = s.read(file);
  uint64_t data_at = 0;
  const json h = header_of(b, &data_at);
  const std::string old_text = b.substr(8, data_at - 8);
  // Built piece by piece: GCC 12 warns (-Wrestrict, a false positive) on a chain of operator+.
  std::string text = "{";
  text += json(name).dump();
  text += ':';
  text += h.at(name).dump();
  text += ',';
  text += old_text.substr(1);
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  s.write(file, out + text + b.substr(data_at));
}

// A state.json field of the run's checkpoint set (or removed, with a null json and erase).
std::function<void(Sandbox&)> state(const std::string& key, const json& value, bool erase = false) {
  return [=](Sandbox& s) {
    s.edit_json(s.run() / "checkpoint-3" / "state.json", [&](json& j) {
      if (erase) j.erase(key);
      else j[key] = value;
    });
  };
}
std::function<void(Sandbox&)> option(const std::string& key, const json& value) {
  return [=](Sandbox& s) {
    s.edit_json(s.run() / "run.json", [&](json& j) { j["options"][key] = value; });
  };
}
std::function<void(Sandbox&)> config(const std::string& key, const json& value) {
  return [=](Sandbox& s) {
    s.edit_json(s.model() / "config.json", [&](json& j) {
      if (value.is_null()) j.erase(key);
      else j[key] = value;
    });
  };
}

const std::string kResume = "finetune --resume {R}";
const std::string kEval = "eval --model {M} --text {T}";

std::vector<Case> run_cases() {
  return {
      // ---- a checkpoint's state.json ----------------------------------------------------------
      {"RunStateNegativeStep", state("step", -3), kResume, 1,
       R"(checkpoint-3/state\.json: "step" is -3; it must be an integer from 0 to 3)"},
      {"RunStateStepBeyondSteps", state("step", 99), kResume, 1,
       R"(state\.json: "step" is 99; .*from 0 to 3 \(the run's --steps\))"},
      {"RunStateStepNotAnInteger", state("step", "3"), kResume, 1,
       R"(state\.json: "step" is "3"; it must be an integer)"},
      {"RunStateStepNotTheCheckpoints", state("step", 2), kResume, 1,
       R"(state\.json: "step" is 2 but the checkpoint is checkpoint-3)"},
      {"RunStateNegativeBadRun", state("bad_run", -1), kResume, 1,
       R"(state\.json: "bad_run" is -1)"},
      {"RunStateNegativeTokens", state("tokens", -5.0), kResume, 1,
       R"(state\.json: "tokens" is -5.0; it must be a finite number >= 0)"},
      {"RunStateTrainSecondsNotANumber", state("train_s", "fast"), kResume, 1,
       R"(state\.json: "train_s" is "fast")"},
      {"RunStateMissingLogBytes", state("log_bytes", nullptr, true), kResume, 1,
       R"(state\.json: "log_bytes" is missing)"},
      {"RunStateNegativeMetricsBytes", state("metrics_bytes", -1), kResume, 1,
       R"(state\.json: "metrics_bytes" is -1; it must be a size in bytes)"},
      {"RunStateLogBytesBeyondTheLog", state("log_bytes", 1000000000), kResume, 1,
       R"(zo_log\.jsonl holds [0-9]+ bytes, fewer than the 1000000000 that .*state\.json records \(log_bytes\))"},
      {"RunStateEvalBeforeNotARecord", state("eval_before", 7), kResume, 1,
       R"(state\.json: "eval_before" is 7; it must be null or an evaluation record)"},
      {"RunStateEvalBeforeWithoutValue", state("eval_before", json{{"metric", "ppl"}}), kResume,
       1, R"(state\.json: "eval_before" .*"value")"},
      {"RunStateNotAnObject",
       [](Sandbox& s) { s.write(s.run() / "checkpoint-3" / "state.json", "[1, 2]"); }, kResume,
       1, R"(state\.json must hold a JSON object, not array)"},
      {"RunStateNotJson",
       [](Sandbox& s) { s.write(s.run() / "checkpoint-3" / "state.json", "{\"step\": 3,"); },
       kResume, 1, R"(state\.json is not valid JSON.*the run directory is damaged)"},
      // ---- run.json -------------------------------------------------------------------------
      {"RunJsonNotJson", [](Sandbox& s) { s.write(s.run() / "run.json", "not json"); }, kResume,
       1, R"(run\.json is not valid JSON)"},
      {"RunJsonStepsNotAnInteger", option("steps", "many"), kResume, 1,
       R"(run\.json: options\.steps is "many", not an integer)"},
      {"RunJsonLrNotANumber", option("lr", json::array({1})), kResume, 1,
       R"(run\.json: options\.lr is \[1\], not a finite number)"},
      {"RunJsonNegativeSeed", option("seed", -1), kResume, 1,
       R"(run\.json: options\.seed is -1, not an integer >= 0)"},
      {"RunJsonModelNotAString", option("model", 5), kResume, 1,
       R"(run\.json: options\.model is 5, not a string)"},
      {"RunJsonNoOptions",
       [](Sandbox& s) { s.edit_json(s.run() / "run.json", [](json& j) { j.erase("options"); }); },
       kResume, 1, R"(run\.json: "options" is missing or not an object)"},
      {"RunJsonNoModelId",
       [](Sandbox& s) { s.edit_json(s.run() / "run.json", [](json& j) { j.erase("model_id"); }); },
       kResume, 1, R"(run\.json: "model_id" is missing)"},
      // ---- `latest` and the checkpoint it names -----------------------------------------------
      {"RunLatestNamesAMissingCheckpoint",
       [](Sandbox& s) { s.write(s.run() / "latest", "checkpoint-9\n"); }, kResume, 1,
       R"(latest names checkpoint-9, which is not in .*run)"},
      {"RunLatestNamesAPath", [](Sandbox& s) { s.write(s.run() / "latest", "../../etc\n"); },
       kResume, 1, R"(latest should name one checkpoint \(checkpoint-<step>\), not '\.\./\.\./etc')"},
      // Without `latest` a complete checkpoint is resumed from (Finetune.ResumeWithoutLatest...);
      // an incomplete one is damage.
      {"RunLatestMissingAndCheckpointIncomplete",
       [](Sandbox& s) {
         fs::remove(s.run() / "latest");
         fs::remove(s.run() / "checkpoint-3" / "state.json");
       },
       kResume, 1,
       R"(run directory .*run holds checkpoint-3 without state\.json and model\.safetensors and no 'latest' file)"},
      {"RunCheckpointIncomplete",
       [](Sandbox& s) { fs::remove(s.run() / "checkpoint-3" / "state.json"); }, kResume, 1,
       R"(checkpoint 'checkpoint-3' .* incomplete)"},
      {"RunCheckpointConfigOtherShape",
       [](Sandbox& s) {
         s.edit_json(s.run() / "checkpoint-3" / "config.json",
                     [](json& j) { j["num_hidden_layers"] = 4; });
       },
       kResume, 1, R"(checkpoint-3/config\.json: num_hidden_layers is 4 but .*holds 5 layers)"},
      {"RunCheckpointWeightsOtherModel",
       [](Sandbox& s) {
         // A checkpoint replaced by a consistent model of another shape (one layer fewer).
         const fs::path c = s.run() / "checkpoint-3";
         s.edit_json(c / "config.json", [](json& j) { j["num_hidden_layers"] = 4; });
         std::string b = s.read(c / "model.safetensors");
         uint64_t data_at = 0;
         json h = header_of(b, &data_at);
         for (auto it = h.begin(); it != h.end();)
           it = it.key().rfind("model.layers.4.", 0) == 0 ? h.erase(it) : std::next(it);
         std::string text = h.dump();
         text.append((8 - text.size() % 8) % 8, ' ');
         std::string out(8, '\0');
         const uint64_t n = text.size();
         std::memcpy(out.data(), &n, 8);
         s.write(c / "model.safetensors", out + text + b.substr(data_at));
       },
       kResume, 1, R"(checkpoint .*checkpoint-3 does not match the model's layout)"},
      {"RunCheckpointNaNWeight",
       [](Sandbox& s) {
         poke(s, s.run() / "checkpoint-3" / "model.safetensors", "model.norm.weight", 3, NAN);
       },
       kResume, 1,
       R"(tensor model\.norm\.weight in .*checkpoint-3/model\.safetensors holds NaN at element 3)"},
      {"RunResumeNotARunDirectory", {}, "finetune --resume {S}/nothing", 1,
       R"(--resume .*nothing: no such run directory)"},
      // ---- the logs against the checkpoint ----------------------------------------------------
      {"RunZoLogTruncated",
       [](Sandbox& s) { fs::resize_file(s.run() / "zo_log.jsonl", 100); }, kResume, 1,
       R"(zo_log\.jsonl holds 100 bytes, fewer than the [0-9]+ that .*state\.json records \(log_bytes\): the log was truncated; zof does not append)"},
      {"RunZoLogMissing", [](Sandbox& s) { fs::remove(s.run() / "zo_log.jsonl"); }, kResume, 1,
       R"(zo_log\.jsonl is missing, but .*state\.json records [0-9]+ bytes of it)"},
      {"RunZoLogCutMidLine",
       [](Sandbox& s) {
         std::string log = s.read(s.run() / "zo_log.jsonl");
         log.back() = ' ';  // the recorded prefix now ends inside a line
         s.write(s.run() / "zo_log.jsonl", log + "\n");
       },
       kResume, 1, R"(zo_log\.jsonl: the [0-9]+ bytes .* do not end at a line boundary)"},
      {"RunZoLogStepRenumbered",
       [](Sandbox& s) {
         std::string log = s.read(s.run() / "zo_log.jsonl");
         log.replace(log.find("\"step\":1"), 8, "\"step\":7");
         s.write(s.run() / "zo_log.jsonl", log);
       },
       kResume, 1, R"(zo_log\.jsonl line 2 is not the record of step 1)"},
      {"RunMetricsTruncated",
       [](Sandbox& s) { fs::resize_file(s.run() / "metrics.jsonl", 10); }, kResume, 1,
       R"(metrics\.jsonl holds 10 bytes, fewer than .* \(metrics_bytes\))"},
      // ---- one writer per run directory ------------------------------------------------------
      {"RunResumeWhileAnotherHoldsTheLock",
       [](Sandbox& s) { hold_lock(s, s.run() / ".lock"); }, kResume, 1,
       R"(--resume .*run is in use by another process \(pid [0-9]+\) that holds .*run/\.lock; wait for it)",
       {}, release_lock},
      {"RunNewRunIntoALockedOut",
       [](Sandbox& s) {
         fs::create_directories(s.root() / "busy");
         hold_lock(s, s.root() / "busy" / ".lock");
       },
       "finetune {F} --out {S}/busy", 1,
       R"(--out .*busy is in use by another process \(pid [0-9]+\))", {}, release_lock},
      // ---- outputs apart from inputs (real paths) --------------------------------------------
      {"RunOutIsTheModel", {}, "finetune {F} --out {M}", 1,
       R"(--out .*model is --model .*model \(both are .*\): writing there would overwrite the input)"},
      {"RunOutInsideTheModel", {}, "finetune {F} --out {M}/run", 1,
       R"(--out .*model/run lies inside --model)"},
      {"RunOutHoldsTheModel", {}, "finetune {F} --out {S}", 1, R"(--out .* holds --model)"},
      {"RunOutSymlinkToTheModel",
       [](Sandbox& s) { fs::create_directory_symlink(s.model(), s.root() / "link"); },
       "finetune {F} --out {S}/link", 1, R"(--out .*link is --model)"},
      {"RunOutIsTheData", {}, "finetune {F} --out {T}", 1, R"(--out .*text\.txt is --data)"},
      {"RunReplayOutIsTheModel", {}, "replay --model {M} --log {R} --out {M}", 1,
       R"(--out .*model is --model)"},
      {"RunReplayOutIsTheLog", {}, "replay --model {M} --log {R} --out {R}", 1,
       R"(--out .*run is --log)"},
      {"RunReplayOutInsideTheLog", {}, "replay --model {M} --log {R} --out {R}/rebuilt", 1,
       R"(--out .*run/rebuilt lies inside --log)"},
      {"RunOutUnderAFile", [](Sandbox& s) { s.write(s.root() / "afile", "x"); },
       "finetune {F} --out {S}/afile/sub", 1,
       R"(--out .*afile/sub: cannot create the directory \(.*afile is not a directory\))"},
      {"RunOutCannotBeCreated", {}, "finetune {F} --out /proc/zof_fault_run", 1,
       R"(^--out /proc/zof_fault_run: cannot create the directory)"},
      // An error found after the options (here: the data) leaves no --out behind.
      {"RunBadDataLeavesNoOut", {},
       "finetune --model {M} --task text --data {S}/missing.txt --steps 3 --out {S}/new/run", 1,
       R"(^--data .*/missing\.txt: no such file \(--task text reads one plain-text file\)$)"},
      // (Runs that go non-finite fail after their progress lines, more than the one line this
      // table asserts: tests/model/test_trainer.cpp, Finetune.DivergingRun*.)
      // ---- the base model's fingerprint -----------------------------------------------------
      {"RunReplayFromOtherWeights",
       [](Sandbox& s) {
         s.run();
         poke(s, s.model() / "model.safetensors", "model.norm.weight", 0, 1.5f);
       },
       "replay --model {M} --log {R} --out {S}/rebuilt", 1,
       R"(--model .* is not the base model of the run in .*: its weights' fingerprint is storage-f32-mix64:[0-9a-f]{16}, the run recorded storage-f32-mix64:[0-9a-f]{16})"},
      {"RunResumeFromOtherWeights",
       [](Sandbox& s) {
         s.run();
         poke(s, s.model() / "model.safetensors", "model.norm.weight", 0, 1.5f);
       },
       kResume, 1, R"(the weights in .*model \(fingerprint .*\) are not the ones this run started from)"},
      {"RunReplayWithoutAStepLog", [](Sandbox& s) { fs::remove(s.run() / "zo_log.jsonl"); },
       "replay --model {M} --log {R} --out {S}/rebuilt", 1,
       R"(--log .*run: not a zof run directory \(needs run\.json and zo_log\.jsonl\))"},
      {"RunReplayDamagedStepRecord",
       [](Sandbox& s) {
         std::string log = s.read(s.run() / "zo_log.jsonl");
         log.replace(log.find("\"skipped\":false"), 15, "\"skipped\":\"no\"");
         s.write(s.run() / "zo_log.jsonl", log);
       },
       "replay --model {M} --log {R} --out {S}/rebuilt", 1,
       R"(zo_log\.jsonl line 1 is not a step record)"},
      // ---- the weights a command starts from -------------------------------------------------
      {"RunEvalNaNWeight",
       [](Sandbox& s) {
         poke(s, s.model() / "model.safetensors", "model.embed_tokens.weight", 5, NAN);
       },
       kEval, 1,
       R"(tensor model\.embed_tokens\.weight in .*model\.safetensors holds NaN at element 5 \(of 32768\))"},
      // Through the disk tier the weights are read once --out exists: a damaged one still
      // leaves nothing behind, and an --out that existed empty stays as it was (its offload/
      // and lock gone with the run).
      {"RunFinetuneNaNWeightThroughTheDiskTier",
       [](Sandbox& s) {
         poke(s, s.model() / "model.safetensors", "model.embed_tokens.weight", 5, NAN);
       },
       "finetune {F} --out {S}/out --host-mem 600KiB", 1,
       R"(tensor model\.embed_tokens\.weight in .*model\.safetensors holds NaN at element 5 \(of 32768\))"},
      {"RunFinetuneNaNWeightThroughTheDiskTierIntoAnEmptyOut",
       [](Sandbox& s) {
         poke(s, s.model() / "model.safetensors", "model.embed_tokens.weight", 5, NAN);
         fs::create_directories(s.root() / "out");
       },
       "finetune {F} --out {S}/out --host-mem 600KiB", 1,
       R"(tensor model\.embed_tokens\.weight in .*model\.safetensors holds NaN at element 5 \(of 32768\))"},
      {"RunGenerateInfWeight",
       [](Sandbox& s) {
         poke(s, s.model() / "model.safetensors", "model.norm.weight", 2, -INFINITY);
       },
       "generate --model {M} --max-new-tokens 2", 1,
       R"(tensor model\.norm\.weight .* holds -Inf at element 2)"},
      {"RunFinetuneNaNWeight",
       [](Sandbox& s) {
         poke(s, s.model() / "model.safetensors", "model.layers.2.mlp.up_proj.weight", 0, NAN);
       },
       "finetune {F} --out {S}/o", 1, R"(tensor model\.layers\.2\.mlp\.up_proj\.weight .* NaN)"},
      {"RunDuplicateTensorName",
       [](Sandbox& s) { duplicate_entry(s, s.model() / "model.safetensors", "model.norm.weight"); },
       kEval, 1, R"(model\.safetensors, tensor model\.norm\.weight: the header names this tensor twice)"},
      {"RunShardIndexNamesATensorTwice",
       [](Sandbox& s) {
         const fs::path m = s.model();
         const std::string shard = "model-00001-of-00001.safetensors";
         fs::rename(m / "model.safetensors", m / shard);
         uint64_t data_at = 0;
         const json h = header_of(s.read(m / shard), &data_at);
         std::string wm;
         for (auto it = h.begin(); it != h.end(); ++it)
           if (it.key() != "__metadata__") wm += json(it.key()).dump() + ": \"" + shard + "\", ";
         wm += "\"model.norm.weight\": \"" + shard + "\"";
         s.write(m / "model.safetensors.index.json", "{\"weight_map\": {" + wm + "}}");
       },
       kEval, 1, R"(model\.safetensors\.index\.json: weight_map names tensor model\.norm\.weight twice)"},
      // ---- config.json sizes against the weights ---------------------------------------------
      {"RunConfigMoreLayersThanTheWeights", config("num_hidden_layers", 1000), kEval, 1,
       R"(config\.json: num_hidden_layers is 1000 but .*model\.safetensors holds 5 layers)"},
      {"RunConfigFewerLayersThanTheWeights", config("num_hidden_layers", 3), kEval, 1,
       R"(config\.json: num_hidden_layers is 3 but .*model\.safetensors holds 5 layers)"},
      {"RunConfigBillionLayers", config("num_hidden_layers", 1000000000), kEval, 1,
       R"(config\.json: field "num_hidden_layers" is 1000000000, more than zof accepts \(at most 16384\))",
       {}, {}, 20},
      {"RunConfigHugeHidden", config("hidden_size", 1000000000000), kEval, 1,
       R"(config\.json: field "hidden_size" is 1000000000000, more than zof accepts)", {}, {}, 20},
      {"RunConfigHugeIntermediate", config("intermediate_size", 1000000000000), kEval, 1,
       R"(config\.json: field "intermediate_size" is 1000000000000)", {}, {}, 20},
      {"RunConfigVocabBeyondTheWeights", config("vocab_size", 1000), kEval, 1,
       R"(config\.json: vocab_size is 1000 but tensor model\.embed_tokens\.weight in .* has shape \[512, 64\], not \[1000, 64\])"},
      {"RunConfigHiddenBeyondTheWeights", config("hidden_size", 128), kEval, 1,
       R"(config\.json: hidden_size is 128 but tensor model\.embed_tokens\.weight .* has shape \[512, 64\], not \[512, 128\])"},
      {"RunConfigHeadsBeyondTheWeights", config("num_attention_heads", 4), kEval, 1,
       R"(config\.json: num_attention_heads \* head_dim is 32 but tensor model\.layers\.0\.self_attn\.q_proj\.weight .* has shape \[64, 64\], not \[32, 64\])"},
      {"RunConfigZeroHeads", config("num_attention_heads", 0), kEval, 1,
       R"(config\.json: field "num_attention_heads" must be positive, got 0)"},
      {"RunConfigNegativeLayers", config("num_hidden_layers", -5), kEval, 1,
       R"(config\.json: field "num_hidden_layers" must be positive, got -5)"},
      {"RunConfigHeadsDoNotDivideHidden",
       [](Sandbox& s) {
         s.edit_json(s.model() / "config.json", [](json& j) {
           j.erase("head_dim");
           j["num_attention_heads"] = 7;
           j["num_key_value_heads"] = 7;
         });
       },
       kEval, 1, R"(config\.json: field "hidden_size" \(64\) is not divisible by num_attention_heads \(7\))"},
  };
}

ZOF_FAULT_TABLE(RunFaults, run_cases());

}  // namespace
