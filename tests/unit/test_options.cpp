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
      if (&t != &s) EXPECT_EQ(t.get(o), t.get(zof::TrainOptions())) << "changed " << t.key;
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
  EXPECT_EQ(old.objective, "lm");
  EXPECT_EQ(old.dtype, "fp32");
  EXPECT_EQ(old.save_dtype, "input");
  EXPECT_EQ(old.round_every, 1);
  EXPECT_EQ(old.master, "fp32");
}

TEST(OptionTable, ChoicesAreRefusedInTheTablesWords) {
  zof::TrainOptions o;
  o.z = "uniform";
  try {
    zof::validate_options(o);
    FAIL() << "accepted --z uniform";
  } catch (const zof::Error& e) {
    EXPECT_STREQ(e.what(), "--z must be gaussian or rademacher, not 'uniform'");
  }
  for (const zof::OptionSpec& s : zof::train_options()) {
    if (s.choices.empty()) continue;
    zof::TrainOptions bad;
    s.set(bad, std::string("bogus"));
    try {
      zof::validate_options(bad);
      ADD_FAILURE() << s.key << ": accepted 'bogus'";
    } catch (const zof::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(s.flag() + " must be ", 0), 0u) << e.what();
    }
  }
}

}  // namespace
