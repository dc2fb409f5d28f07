// The run directory's parsers and path rules (src/train/run_dir.h): a checkpoint's state.json
// and run.json's options validated field by field, and outputs kept apart from inputs.
#include "train/run_dir.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "zof/error.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::train::check_apart;
using zof::train::parse_run_options;
using zof::train::parse_state;

const json kState = json::parse(R"({"step": 3, "bad_run": 0, "tokens": 192.0, "train_s": 0.01,
    "metrics_bytes": 900, "log_bytes": 291,
    "eval_before": {"type": "eval", "step": 0, "metric": "ppl", "value": 470.5, "when": "before"}})");

// parse_state of kState with one field changed (null: removed) fails naming the file and field.
void expect_state_error(const std::string& key, const json& value, const std::string& words) {
  json j = kState;
  if (value.is_null()) j.erase(key);
  else j[key] = value;
  try {
    parse_state(j, "run/checkpoint-3/state.json", 3);
    ADD_FAILURE() << "no error for " << j.dump();
  } catch (const zof::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("run/checkpoint-3/state.json: \"" + key + "\" ", 0), 0u) << msg;
    EXPECT_NE(msg.find(words), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(RunState, ValidStateIsRead) {
  const zof::train::RunCounters c = parse_state(kState, "state.json", 3);
  EXPECT_EQ(c.step, 3);
  EXPECT_EQ(c.log_bytes, 291);
  EXPECT_EQ(c.metrics_bytes, 900);
  EXPECT_DOUBLE_EQ(c.tokens, 192.0);
  EXPECT_EQ(c.eval_before["value"], 470.5);
  json j = kState;
  j["eval_before"] = nullptr;  // a run stopped before its first evaluation
  EXPECT_TRUE(parse_state(j, "state.json", 3).eval_before.is_null());
}

TEST(RunState, EveryFieldIsChecked) {
  expect_state_error("step", -3, "from 0 to 3");
  expect_state_error("step", 4, "from 0 to 3 (the run's --steps)");
  expect_state_error("step", 2.5, "an integer");
  expect_state_error("step", nullptr, "is missing");
  expect_state_error("step", json(uint64_t(1) << 63), "an integer");
  expect_state_error("bad_run", -1, "from 0 to the step");
  expect_state_error("bad_run", 9, "from 0 to the step (3)");
  expect_state_error("tokens", -1.0, "finite number >= 0");
  expect_state_error("tokens", "many", "finite number >= 0");
  expect_state_error("train_s", true, "finite number >= 0");
  expect_state_error("metrics_bytes", -1, "a size in bytes");
  expect_state_error("log_bytes", "291", "a size in bytes");
  expect_state_error("log_bytes", nullptr, "is missing");
  expect_state_error("eval_before", 7, "null or an evaluation record");
  expect_state_error("eval_before", json{{"metric", "ppl"}, {"value", "x"}}, "evaluation record");
  EXPECT_THROW(parse_state(json::array(), "state.json", 3), zof::Error);
}

TEST(RunJson, OptionsAreTypeChecked) {
  const json ok = {{"options", zof::TrainOptions().to_json()}, {"model_id", json::object()}};
  EXPECT_EQ(parse_run_options(ok, "run.json").steps, zof::TrainOptions().steps);
  auto expect_error = [&](const std::string& key, const json& value, const std::string& words) {
    json j = ok;
    j["options"][key] = value;
    try {
      parse_run_options(j, "r/run.json");
      ADD_FAILURE() << "no error for " << key << " = " << value.dump();
    } catch (const zof::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("r/run.json: options." + key + " is ", 0), 0u) << msg;
      EXPECT_NE(msg.find(words), std::string::npos) << msg;
    }
  };
  expect_error("steps", "x", "not an integer");
  expect_error("steps", 1.5, "not an integer");
  expect_error("lr", "1e-4", "not a finite number");
  expect_error("lr", 1e300, "not a finite number");  // beyond float
  expect_error("seed", -1, "not an integer >= 0");
  expect_error("queries", int64_t(1) << 40, "not an integer");
  expect_error("model", 3, "not a string");
  expect_error("one_sided", 1, "not true or false");
  EXPECT_THROW(parse_run_options(json::array(), "run.json"), zof::Error);
  EXPECT_THROW(parse_run_options(json{{"options", 3}}, "run.json"), zof::Error);
}

// Outputs apart from inputs, by real path: the same directory, one inside the other, through a
// symlink or "..".
TEST(RunPaths, OutputApartFromInputs) {
  const fs::path d = fs::temp_directory_path() / ("zof_run_paths_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "model");
  fs::create_directory_symlink(d / "model", d / "link");
  auto refused = [&](const fs::path& out, const std::string& words) {
    try {
      check_apart(out, "--out", d / "model", "--model");
      ADD_FAILURE() << out << " accepted";
    } catch (const zof::Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(d / "model", "is --model");
  refused(d / "model/", "is --model");
  refused(d / "link", "is --model");
  refused(d / "x" / ".." / "model", "is --model");
  refused(d / "model" / "run", "lies inside --model");
  refused(d / "link" / "a" / "b", "lies inside --model");
  refused(d, "holds --model");
  EXPECT_NO_THROW(check_apart(d / "model-run", "--out", d / "model", "--model"));  // a prefix only
  EXPECT_NO_THROW(check_apart(d / "run", "--out", d / "model", "--model"));
  fs::remove_all(d);
}

}  // namespace
