// The table of `zof finetune`'s options (zof/options.h): each entry sets its own field and no
// other, run.json's form round-trips every saved option, and a run.json without an option reads
// as the value runs from before it computed.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "zof/error.h"
#include "zof/options.h"
#include "zof/trainer.h"

namespace {

using json = nlohmann::json;

// A value the option accepts that is not its default, as text (what a flag would give).
std::string other_value(const zof::OptionSpec& s) {
  const json d = s.get(zof::TrainOptions());
  if (d.is_boolean()) return d.get<bool>() ? "false" : "true";
  if (d.is_string()) {
    for (const char* c : s.choices)
      if (d.get<std::string>() != c) return c;
    return d.get<std::string>() + "x";
  }
  const zof::NumberRule* r = s.rule();
  for (const double v : {3.0, 2.0, 1.0, 0.5, 0.25})
    if ((!r || r->accepts(v)) && v != d.get<double>())
      return v == (int)v ? std::to_string((int)v) : std::to_string(v).substr(0, 4);
  ADD_FAILURE() << s.key << ": no other value found";
  return "";
}

TEST(OptionTable, EachEntrySetsItsOwnFieldOnly) {
  std::set<std::string> keys;
  for (const zof::OptionSpec& s : zof::train_options()) {
    EXPECT_TRUE(keys.insert(s.key).second) << s.key << " is in the table twice";
    EXPECT_EQ(zof::find_option(s.key), &s);
    EXPECT_NE(std::string(s.help), "") << s.key;
    zof::TrainOptions o;
    const std::string text = other_value(s);
    SCOPED_TRACE(std::string(s.key) + " = " + text);
    zof::set_train_option(o, s.key, text);
    EXPECT_NE(s.get(o), s.get(zof::TrainOptions())) << "did not change its field";
    for (const zof::OptionSpec& t : zof::train_options())
      if (&t != &s) {
        EXPECT_EQ(t.get(o), t.get(zof::TrainOptions())) << "changed " << t.key;
      }
  }
  zof::TrainOptions o;
  EXPECT_THROW(zof::set_train_option(o, "stepz", "3"), zof::Error);
}

TEST(OptionTable, RunJsonRoundTripsEverySavedOption) {
  zof::TrainOptions o;
  for (const zof::OptionSpec& s : zof::train_options()) s.set(o, other_value(s));
  const json j = o.to_json();
  for (const zof::OptionSpec& s : zof::train_options())
    EXPECT_EQ(j.contains(s.key), s.saved) << s.key << ": run.json saves what a run computes only";
  const zof::TrainOptions back = zof::TrainOptions::from_json(j);
  EXPECT_EQ(back.to_json(), j);
  // Through text too, as json.dump and parse give it (a float's digits read back to its bits).
  EXPECT_EQ(zof::TrainOptions::from_json(json::parse(j.dump())).to_json(), j);
}

TEST(OptionTable, OptionsMissingFromAnOlderRunJsonReadAsThatRunComputed) {
  const zof::TrainOptions old = zof::TrainOptions::from_json(json::object());
  for (const zof::OptionSpec& s : zof::train_options()) {
    if (!s.saved) continue;
    const json want = s.before.is_null() ? s.get(zof::TrainOptions()) : s.before;
    EXPECT_EQ(s.get(old), want) << s.key;
  }
  // What runs from before these options computed (the history of run.json's fields).
  EXPECT_EQ(old.objective, zof::Objective::Lm);
  EXPECT_EQ(old.dtype, zof::ComputeChoice::Fp32);
  EXPECT_EQ(old.save_dtype, zof::SaveChoice::Input);
  EXPECT_EQ(old.save_format, zof::SaveFormat::Safetensors);
  EXPECT_EQ(old.round_every, 1);
  EXPECT_EQ(old.master, zof::MasterChoice::Fp32);
}

// A choice is an enum: a word outside the table's is refused as it is read (from a flag's text
// or from run.json), in the table's words, and never reaches a field.
TEST(OptionTable, ChoicesAreRefusedInTheTablesWords) {
  zof::TrainOptions o;
  try {
    zof::set_train_option(o, "z", "uniform");
    FAIL() << "accepted --z uniform";
  } catch (const zof::Error& e) {
    EXPECT_STREQ(e.what(), "--z must be gaussian or rademacher, not 'uniform'");
  }
  EXPECT_EQ(o.z, zof::ZChoice::Gaussian);
  std::vector<std::string> choices;
  for (const zof::OptionSpec& s : zof::train_options()) {
    if (s.choices.empty()) continue;
    choices.push_back(s.key);
    for (const auto& bogus : {json("bogus"), json("")}) {
      zof::TrainOptions bad;
      const json before = s.get(bad);
      for (int how = 0; how < 2; ++how) {
        try {
          if (how == 0)
            s.set(bad, bogus.get<std::string>());
          else
            s.set(bad, bogus);
          ADD_FAILURE() << s.key << ": accepted " << bogus;
        } catch (const zof::Error& e) {
          EXPECT_EQ(std::string(e.what()).rfind(s.flag() + " must be ", 0), 0u) << e.what();
        }
        EXPECT_EQ(s.get(bad), before) << s.key;
      }
    }
    // Each accepted word reads to a value whose word it is.
    for (const char* w : s.choices) {
      zof::TrainOptions t;
      s.set(t, std::string(w));
      EXPECT_EQ(s.get(t), json(w)) << s.key;
      EXPECT_NO_THROW(s.set(t, json(w))) << s.key;
    }
  }
  // Every enum of TrainOptions reaches the table as a choice.
  EXPECT_EQ(choices, (std::vector<std::string>{"task", "objective", "dtype", "save_dtype",
                                               "save_format", "master", "schedule", "estimator",
                                               "z", "optimizer", "device"}));
  // The scalar oracle is a device of the runtime, not of finetune.
  const zof::OptionSpec* device = zof::find_option("device");
  ASSERT_NE(device, nullptr);
  EXPECT_THROW(device->set(o, std::string("reference")), zof::Error);
}

// Every enum's words: distinct, read back to the value they name.
template <class E>
void expect_words_round_trip() {
  const auto words = zof::choice_words(E{});
  ASSERT_FALSE(words.empty());
  for (size_t i = 0; i < words.size(); ++i) {
    const E v = static_cast<E>(i);
    EXPECT_STREQ(zof::word(v), words[i]);
    EXPECT_EQ(zof::find_choice<E>(words[i]), v);
  }
  EXPECT_FALSE(zof::find_choice<E>("bogus").has_value());
  EXPECT_FALSE(zof::find_choice<E>("").has_value());
}

TEST(Choices, WordsReadBackToTheirValues) {
  expect_words_round_trip<zof::Task>();
  expect_words_round_trip<zof::Objective>();
  expect_words_round_trip<zof::ComputeChoice>();
  expect_words_round_trip<zof::SaveChoice>();
  expect_words_round_trip<zof::SaveFormat>();
  expect_words_round_trip<zof::MasterChoice>();
  expect_words_round_trip<zof::Schedule>();
  expect_words_round_trip<zof::EstimatorChoice>();
  expect_words_round_trip<zof::ZChoice>();
  expect_words_round_trip<zof::OptimizerChoice>();
  expect_words_round_trip<zof::DeviceChoice>();
  // In JSON a choice is its word (summary.json's compute.dtype), never the enum's number.
  EXPECT_EQ(json(zof::ComputeChoice::Bf16), json("bf16"));
  const json task_json{{"task", zof::Task::Copa}};
  EXPECT_EQ(task_json.dump(), R"({"task":"copa"})");
  EXPECT_EQ(json("rademacher").get<zof::ZChoice>(), zof::ZChoice::Rademacher);
  EXPECT_THROW(json("uniform").get<zof::ZChoice>(), zof::Error);
  EXPECT_THROW(json(1).get<zof::ZChoice>(), zof::Error);
  EXPECT_EQ(zof::read_choice_text<zof::DeviceChoice>("--device", "cuda", {"cpu", "cuda"}),
            zof::DeviceChoice::Cuda);
  try {
    zof::read_choice_text<zof::DeviceChoice>("--device", "reference", {"cpu", "cuda"});
    ADD_FAILURE() << "accepted a word outside the accepted ones";
  } catch (const zof::Error& e) {
    EXPECT_STREQ(e.what(), "--device must be cpu or cuda, not 'reference'");
  }
}

}  // namespace
