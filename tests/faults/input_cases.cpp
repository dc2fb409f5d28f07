// Input files that are not what they seem and messages that must name the right thing: model
// files that are FIFOs, devices, directories or too large; tokenizers whose ids the model cannot
// hold; model paths that are empty or loop; a checkpoint that cannot be written; a task example
// longer than --seq-len; run.json options out of range; bad --config lines.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>

#include "common.h"
#include "faults/fault_table.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::faults::Case;
using zof::faults::Sandbox;

const std::string kEval = "eval --model {M} --text {T}";
const std::string kGen = "generate --model {M} --max-new-tokens 2";
const std::string kNewRun = "finetune {F} --out {S}/out";  // out must not appear

// The model file `name` replaced by something else.
std::function<void(Sandbox&)> model_file(const std::string& name,
                                         const std::function<void(const fs::path&)>& make) {
  return [=](Sandbox& s) {
    const fs::path p = s.model() / name;
    fs::remove(p);
    make(p);
  };
}
void fifo(const fs::path& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0) << p; }
void dev_zero(const fs::path& p) { fs::create_symlink("/dev/zero", p); }
void directory(const fs::path& p) { fs::create_directory(p); }

// tokenizer.json edited as JSON.
std::function<void(Sandbox&)> tokenizer(const std::function<void(json&)>& edit) {
  return [=](Sandbox& s) { s.edit_json(s.model() / "tokenizer.json", edit); };
}
// The vocabulary's token with id `from` moved to id `to`.
void move_id(json& j, int from, int to) {
  for (auto& [token, id] : j["model"]["vocab"].items())
    if (id == from) {
      id = to;
      return;
    }
}

std::vector<Case> input_cases() {
  return {
      // ---- a model directory's files must be regular files (P3) ------------------------------
      {"ConfigIsDevZero", model_file("config.json", dev_zero), kEval, 1,
       R"(model/config\.json is a device, not a file; config\.json must be a regular file)", {},
       {}, 20},
      {"ConfigIsFifo", model_file("config.json", fifo), kEval, 1,
       R"(model/config\.json is a FIFO \(named pipe\), not a file)", {}, {}, 20},
      {"ConfigIsDirectory", model_file("config.json", directory), kEval, 1,
       R"(model/config\.json is a directory; config\.json must be a regular file)"},
      // A sparse file beside the sandbox (the snapshot would read it whole), linked in.
      {"ConfigTooLarge",
       [](Sandbox& s) {
         const fs::path big = s.root().string() + ".big.json";
         s.write(big, "");
         fs::resize_file(big, uint64_t(300) << 20);
         fs::remove(s.model() / "config.json");
         fs::create_symlink(big, s.model() / "config.json");
       },
       kEval, 1, R"(model/config\.json is 314572800 bytes, more than the 256 MiB zof reads)", {},
       [](Sandbox& s) { fs::remove(s.root().string() + ".big.json"); }},
      {"TokenizerIsFifo", model_file("tokenizer.json", fifo), kGen, 1,
       R"(model/tokenizer\.json is a FIFO)", {}, {}, 20},
      {"TokenizerConfigIsDirectory", model_file("tokenizer_config.json", directory), kGen, 1,
       R"(model/tokenizer_config\.json is a directory)"},
      {"WeightsAreFifo", model_file("model.safetensors", fifo), kGen, 1,
       R"(model/model\.safetensors is a FIFO)", {}, {}, 20},
      {"WeightsIndexIsDevZero",
       [](Sandbox& s) {
         fs::remove(s.model() / "model.safetensors");
         dev_zero(s.model() / "model.safetensors.index.json");
       },
       kGen, 1, R"(model/model\.safetensors\.index\.json is a device)", {}, {}, 20},
      // Copied into the run's output at the end: refused before --out is made.
      {"GenerationConfigIsDevZero", model_file("generation_config.json", dev_zero), kNewRun, 1,
       R"(model/generation_config\.json is a device, not a file)", {}, {}, 20},
      {"TokenizerSymlinkLoop",
       [](Sandbox& s) {
         const fs::path t = s.model() / "tokenizer.json";
         fs::remove(t);
         fs::create_symlink("tokenizer.json", t);
       },
       kGen, 1, R"(model/tokenizer\.json cannot be reached \(Too many levels of symbolic links\))"},
      // ---- token ids against the model's vocabulary (P4) ---------------------------------------
      {"TokenizerIdBeyondVocabFinetune", tokenizer([](json& j) { move_id(j, 300, 99999); }),
       kNewRun, 1,
       R"(model/tokenizer\.json: token "▁ha" has id 99999, which is beyond the model's vocabulary of 512 ids \(config\.json vocab_size.*use the tokenizer\.json that came with the model)"},
      {"TokenizerIdBeyondVocabEval", tokenizer([](json& j) { move_id(j, 300, 99999); }), kEval, 1,
       R"(tokenizer\.json: token "▁ha" has id 99999)"},
      {"TokenizerIdBeyondVocabGenerate", tokenizer([](json& j) { move_id(j, 300, 512); }), kGen,
       1, R"(tokenizer\.json: token "▁ha" has id 512, which is beyond .* 0 to 511)"},
      // An added token past the vocabulary loads (transformers allows it: Gemma 3's
      // <image_soft_token>); text that holds it is refused before the forward reads the table.
      {"AddedTokenIdBeyondVocabInTheText",
       [](Sandbox& s) {
         tokenizer([](json& j) {
           j["added_tokens"].push_back({{"id", 600}, {"content", "<extra>"}, {"special", true}});
         })(s);
         s.write(s.root() / "extra.txt", "Once upon a time <extra> there was a cat.\n");
       },
       "eval --model {M} --text {S}/extra.txt", 1, R"(token id 600 is outside the model's vocabulary of 512)"},
      {"PostProcessorIdBeyondVocab",
       tokenizer([](json& j) { j["post_processor"]["special_tokens"]["<s>"]["ids"] = {700}; }),
       kEval, 1, R"(tokenizer\.json: post_processor adds special token id 700, which is beyond)"},
      {"TokenizerDuplicateIds", tokenizer([](json& j) { move_id(j, 301, 300); }), kEval, 1,
       R"(tokenizer\.json: model\.vocab: tokens "▁S" and "▁ha" both have id 300)"},
      // ---- task files in a --data directory ---------------------------------------------------
      {"TaskEvalFileIsDirectory",
       [](Sandbox& s) {
         fs::create_directories(s.root() / "copa" / "val.jsonl");
         fs::copy_file(fs::path(zof::faults::assets_dir()) / "data/copa/train.jsonl",
                       s.root() / "copa" / "train.jsonl");
       },
       "finetune --model {M} --task copa --data copa --steps 2 --batch 2 --out {S}/out", 1,
       R"(^--data copa/val\.jsonl is a directory; --task copa expects)"},
      // ---- --model paths (P7 a, f) -------------------------------------------------------------
      {"ModelSymlinkLoop",
       [](Sandbox& s) {
         fs::create_symlink("loop2", s.root() / "loop1");
         fs::create_symlink("loop1", s.root() / "loop2");
       },
       "eval --model loop1 --text {T}", 1,
       R"(^--model loop1 cannot be reached \(Too many levels of symbolic links\); give a Hugging Face model directory)"},
      {"ModelEmpty", {}, "eval --model '' --text {T}", 1,
       R"(^--model is empty; give a Hugging Face model directory)"},
      {"ModelMissing", {}, "generate --model nowhere", 1,
       R"(^--model nowhere does not exist; give)"},
      {"ModelIsAFile", {}, "eval --model {T} --text {T}", 1, R"(^--model .*text\.txt is not a directory)"},
      {"FinetuneModelLoop",
       [](Sandbox& s) { fs::create_symlink("loop", s.root() / "loop"); },
       "finetune --model loop --task text --data {T} --out {S}/out", 1,
       R"(^--model loop cannot be reached)"},
      // ---- filesystem errors at the CLI boundary (P7 a) ---------------------------------------
      {"ReportRunSymlinkLoop", [](Sandbox& s) {
         fs::create_directory(s.root() / "r");
         fs::create_symlink("metrics.jsonl", s.root() / "r" / "metrics.jsonl");
       },
       "report r --out {S}/page.html", 1,
       R"(^r/metrics\.jsonl cannot be reached \(Too many levels of symbolic links\); check the path)"},
      {"ResumeRunJsonIsFifo",
       [](Sandbox& s) {
         fs::remove(s.run() / "run.json");
         fifo(s.run() / "run.json");
       },
       "finetune --resume {R}", 1, R"(--resume .*run)", {}, {}, 20},
      // ---- task examples longer than --seq-len (P7 c) ------------------------------------------
      {"CopaAnswerLongerThanSeqLen", {},
       "finetune --model {M} --task copa --data {A}/data/copa --seq-len 8 --steps 2 --batch 2 "
       "--out {S}/out",
       1,
       R"(copa/train\.jsonl:[0-9]+: the answer alone is [0-9]+ tokens, which leaves no room for the prompt in --seq-len 8; raise --seq-len or shorten the answer)"},
      // ---- run.json options out of range (P7 d) ------------------------------------------------
      {"RunJsonNegativeSteps",
       [](Sandbox& s) { s.edit_json(s.run() / "run.json", [](json& j) { j["options"]["steps"] = -1; }); },
       "finetune --resume {R}", 1,
       R"(^.*run/run\.json: options\.steps is out of range: --steps must be .*not -1.*the run directory is damaged)"},
      {"RunJsonUnknownChoiceWord",
       [](Sandbox& s) { s.edit_json(s.run() / "run.json", [](json& j) { j["options"]["z"] = "uniform"; }); },
       "finetune --resume {R}", 1,
       R"(^.*run/run\.json: options\.z is out of range: --z must be gaussian or rademacher, not 'uniform'; the run directory is damaged)"},
      {"RunJsonHugeBatch",
       [](Sandbox& s) {
         s.edit_json(s.run() / "run.json", [](json& j) { j["options"]["batch"] = 100000000; });
       },
       "finetune --resume {R}", 1,
       R"(^.*run/run\.json: options\.batch is out of range: --batch must be)"},
      // ---- --config files (P7 e) ---------------------------------------------------------------
      {"ConfigFileBadValue",
       [](Sandbox& s) { s.write(s.root() / "c.toml", "# run\nlr = 1e39\n"); },
       "finetune --config c.toml {F} --out {S}/out", 1,
       R"(^--lr \(--config c\.toml line 2\) must be a finite number)"},
      {"ConfigFileBadWhole",
       [](Sandbox& s) { s.write(s.root() / "c.toml", "save_every = often\n"); },
       "finetune --config c.toml {F} --out {S}/out", 1,
       R"(^--save-every \(--config c\.toml line 1\) must be)"},
      {"ConfigFileNulByte",
       [](Sandbox& s) {
         const char text[] = "steps = 3\ntask = te\0xt\n";
         s.write(s.root() / "c.toml", std::string(text, sizeof text - 1));
       },
       "finetune --config c.toml {F} --out {S}/out", 1,
       R"(^--config c\.toml line 2: the line holds a NUL byte; --config takes a text file)"},
  };
}

ZOF_FAULT_TABLE(InputFaults, input_cases());

// A checkpoint that cannot be written mid-run (P7 b): the run resumed at step 3 of 5 cannot
// create checkpoint-4.tmp (ZOF_FAULT_EACCES_IN_CHECKPOINT). Its progress lines come first (more than
// the table's one line), then exactly one error line naming the checkpoint; exit 1; the earlier
// checkpoint stays the run's latest.
TEST(InputFaultsMidRun, CheckpointWriteFails) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("CheckpointWriteFails");
  const fs::path r = s.run();
  s.edit_json(r / "run.json", [](json& j) { j["options"]["steps"] = 5; });
  zof::faults::reseal_run(r);  // as a run started with --steps 5 would be
  // The checkpoint directory of step 4 cannot be created (the hook throws what
  // create_directories throws on a directory without write permission).
  const fs::path err = s.root() / "stderr.txt";
  const std::string cmd = "ZOF_FAULT_EACCES_IN_CHECKPOINT=4 timeout -k 5 120 " +
                          zof::faults::zof_binary() + " finetune --resume '" + r.string() +
                          "' >/dev/null 2>'" + err.string() + "' </dev/null";
  const int st = std::system(cmd.c_str());
  const std::string se = s.read(err);
  SCOPED_TRACE("stderr: " + se);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1);
  ASSERT_FALSE(se.empty());
  ASSERT_EQ(se.back(), '\n');
  const size_t start = se.rfind('\n', se.size() - 2);
  const std::string last = se.substr(start == std::string::npos ? 0 : start + 1);
  EXPECT_TRUE(std::regex_search(
      last, std::regex(R"(^zof: error: cannot write checkpoint-4 in .*run: (Permission denied|)"
                       R"(Operation not permitted) \(.*checkpoint-4\.tmp.*\); the run stopped at )"
                       R"(step 4 .*--resume .*run\n$)")));
  EXPECT_EQ(se.find("zof: error:"), se.rfind("zof: error:")) << "more than one error line";
  EXPECT_EQ(se.find("filesystem error"), std::string::npos);
  EXPECT_EQ(s.read(r / "latest"), "checkpoint-3\n");
  EXPECT_TRUE(fs::exists(r / "checkpoint-3" / "state.json"));
}

}  // namespace
