// --resume's rule: a resumed run continues with the options it was started with (run.json), so an
// option given with --resume that would change one of them is refused rather than ignored.
#include "train/resume_rule.h"

#include <cstdio>
#include <vector>

#include "train/run_dir.h"
#include "zof/error.h"

using json = nlohmann::json;

namespace zof::train {
namespace {

// A float as its shortest text that reads back to it: 1e-06, not 9.99999997e-07.
std::string float_text(double v) {
  char b[64];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(b, sizeof b, "%.*g", prec, v);
    if ((float)std::strtod(b, nullptr) == (float)v) break;
  }
  return b;
}

// A saved option as a flag: "--steps 3", "--one-sided", "no --one-sided".
std::string as_flag(const std::string& flag, const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? flag : "no " + flag;
  if (v.is_string()) return flag + " " + v.get<std::string>();
  if (v.is_number_float()) return flag + " " + float_text(v.get<double>());
  return flag + " " + v.dump();
}

std::string and_list(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i)
    s += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return s;
}

// The same file or directory by another name; a path that cannot be resolved is no match.
bool same_path(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  const fs::path pa = fs::weakly_canonical(a, ea), pb = fs::weakly_canonical(b, eb);
  return !ea && !eb && pa == pb;
}

}  // namespace

void check_resume_request(const TrainOptions& opt, const GivenOptions& given) {
  std::error_code ec;
  const fs::path file = fs::path(opt.resume) / "run.json";
  if (!fs::is_regular_file(file, ec)) return;  // not a regular file: a FIFO would block the read
  json run_json, saved;
  try {
    run_json = read_json(file);
    saved = parse_run_options(run_json, file.string()).to_json();
    // An edited run.json's options are not the run's to compare with: its own seal, and the
    // one its latest checkpoint records (a seal removed along with the edit).
    check_run_seal(run_json, file.string());
    if (const fs::path ckpt = latest_checkpoint(opt.resume); !ckpt.empty())
      check_recorded_seal(read_json(ckpt / "state.json"), (ckpt / "state.json").string(),
                          run_json, file.string());
  } catch (const std::exception&) {
    return;  // a damaged or edited run.json: RunDir names what is wrong with it, in its order
  }
  const json now = opt.to_json();
  std::vector<std::string> changed, kept;
  for (const OptionSpec& spec : train_options()) {  // in the order the flags are listed
    const std::string key = spec.key;
    const auto it = given.find(key);
    // Layout options are not saved (they may change); --model is RunDir's to check, naming both.
    if (it == given.end() || !spec.saved || key == "model" || saved[key] == now[key]) continue;
    const std::string& where = it->second;
    // auto is what the run resolved when it started: its dtype, its window, its saved dtype
    // (the master's), its objective (MeZO's choice for its task).
    if (key == "dtype" && now[key] == "auto") continue;
    if (key == "round_every" && now[key] == 0) continue;
    if (key == "save_dtype" && now[key] == "auto" && saved[key] == saved["master"]) continue;
    if (key == "objective" && now[key] == "auto") {
      TrainOptions run = TrainOptions::from_json(saved);
      run.objective = Objective::Auto;
      if (word(training_objective(run)) == saved[key]) continue;
    }
    // The same file or directory by another name.
    if (key == "out" && same_path(opt.out, opt.resume)) continue;
    if (key == "data" && same_path(opt.data, saved[key].get<std::string>())) continue;
    const std::string flag = spec.flag();
    changed.push_back(as_flag(flag, now[key]) + (where.empty() ? "" : " (" + where + ")"));
    kept.push_back(key == "out" ? "--out " + opt.resume : as_flag(flag, saved[key]));
  }
  ZOF_CHECK(changed.empty(),
            "--resume " + opt.resume + " continues the run with the options it was started " +
                "with, so " + and_list(changed) + " would be ignored (the run has " +
                and_list(kept) + "); drop " + (changed.size() == 1 ? "it" : "them") +
                ", or start a new run with --out DIR");
}

}  // namespace zof::train
