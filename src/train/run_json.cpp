// run.json as the run directory reads and writes it (run_dir.h): read_json (any of the run's JSON
// files), the data's fingerprint, the saved options (parse_run_options) and the seal.
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <vector>

#include "hf/json_depth.h"
#include "train/run_dir.h"
#include "zof/error.h"
#include "zof/input_file.h"

using json = nlohmann::json;

namespace zof::train {

json read_json(const fs::path& p) {
  // A regular file of sane size (a FIFO would block, /dev/zero would be read for ever).
  const std::string text =
      read_input_file(p.string(), p.string(), "the run directory is damaged", kMaxModelJsonBytes);
  check_json_depth(text, p.string());  // a deep nest would overflow the stack when copied
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(p.string() + " is not valid JSON (" + e.what() + "); the run directory is damaged");
  }
}

// ---- the data's fingerprint ----------------------------------------------------------------------

std::string data_fingerprint(const TrainOptions& opt) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(opt.data, ec) && opt.task != Task::Text) {
    // As load_task picks them: the train split's file and the first eval file present.
    const bool tsv = opt.task == Task::Sst2;
    files.push_back(fs::path(opt.data) / (tsv ? "train.tsv" : "train.jsonl"));
    for (const char* n : tsv ? std::vector<const char*>{"dev.tsv"}
                             : std::vector<const char*>{"val.jsonl", "dev.jsonl"}) {
      if (fs::is_regular_file(fs::path(opt.data) / n, ec)) {
        files.push_back(fs::path(opt.data) / n);
        break;
      }
    }
  } else {
    files.push_back(opt.data);
  }
  ByteHash h;
  std::vector<char> buf(1 << 20);
  for (const fs::path& f : files) {
    // Not a regular file (a FIFO would block the open): no fingerprint; loading refuses it.
    if (!fs::is_regular_file(f, ec)) return "";
    std::ifstream in(f, std::ios::binary);
    if (!in) return "";
    const std::string head = f.filename().string() + "\n" +
                             std::to_string(fs::file_size(f, ec)) + "\n";
    h.add(head);
    while (in) {
      in.read(buf.data(), (std::streamsize)buf.size());
      h.add(buf.data(), (size_t)in.gcount());
    }
    if (in.bad()) return "";
  }
  return "files-" + h.text();
}

// ---- run.json's options ----------------------------------------------------------------------

TrainOptions parse_run_options(const json& run_json, const std::string& file) {
  ZOF_CHECK(run_json.is_object(), file + " must hold a JSON object, not " +
                                      std::string(run_json.type_name()) + "; " + kDamaged);
  auto it = run_json.find("options");
  ZOF_CHECK(it != run_json.end() && it->is_object(),
            file + ": \"options\" is missing or not an object; " + kDamaged);
  const json& o = *it;
  // Each option's type as the defaults write it.
  const json proto = TrainOptions().to_json();
  for (auto f = o.begin(); f != o.end(); ++f) {
    auto p = proto.find(f.key());
    if (p == proto.end()) continue;  // a field from another version: ignored, as from_json does
    const json& v = f.value();
    std::string want;
    if (p->is_string() && !v.is_string()) want = "a string";
    else if (p->is_boolean() && !v.is_boolean()) want = "true or false";
    else if (p->is_number_integer()) {
      const bool is_unsigned_field = f.key() == "seed";
      const bool ok = v.is_number_integer() &&
                      (is_unsigned_field ? v.is_number_unsigned() || v.get<int64_t>() >= 0
                       : f.key() == "queries"
                           ? !v.is_number_unsigned() || v.get<uint64_t>() <= (uint64_t)INT32_MAX
                           : !v.is_number_unsigned() || v.get<uint64_t>() <= (uint64_t)INT64_MAX);
      const bool fits_int = f.key() != "queries" || !ok ||
                            (v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX);
      if (!ok || !fits_int) want = is_unsigned_field ? "an integer >= 0" : "an integer";
    } else if (p->is_number_float()) {
      if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > FLT_MAX)
        want = "a finite number";
    }
    if (!want.empty()) {
      const std::string d = v.dump();
      throw Error(file + ": options." + f.key() + " is " +
                  (d.size() > 40 ? d.substr(0, 40) + "..." : d) + ", not " + want + "; " +
                  kDamaged);
    }
  }
  // The saved options pass the checks a new run's flags do, blamed on this file (and before a
  // checkpoint's state.json is read against them): "--steps must be ..." is options.steps. A
  // choice's word is refused as it is read ("--z must be gaussian or rademacher, not ..."), the
  // other checks after.
  TrainOptions t;
  try {
    try {
      t = TrainOptions::from_json(o);
    } catch (const json::exception& e) {
      throw Error(file + ": \"options\" cannot be read (" + e.what() + "); " + kDamaged);
    }
    validate_options(t, /*new_run=*/false);
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(file + ": ", 0) == 0) throw;
    const std::string what = e.what();
    std::string key = what.rfind("--", 0) == 0 ? what.substr(2, what.find_first_of(" ,;:") - 2) : "";
    for (char& ch : key) ch = ch == '-' ? '_' : ch;
    throw Error(file + ": " + (o.contains(key) ? "options." + key + " is out of range: " : "") +
                what + "; " + kDamaged);
  }
  return t;
}

// ---- run.json's seal ---------------------------------------------------------------------------

namespace {

// The fix every "run.json was edited" message ends with.
const char* const kEditedFix =
    "so it no longer says how the run was made; restore run.json as the run wrote it, or start "
    "a new run with the new options (zof finetune --out NEW_DIR)";

bool hash_text(const json& v) {
  const std::string pre = "fnv1a64:";
  if (!v.is_string()) return false;
  const std::string& t = v.get_ref<const std::string&>();
  bool ok = t.size() == pre.size() + 16 && t.rfind(pre, 0) == 0;
  for (size_t i = pre.size(); ok && i < t.size(); ++i)
    ok = std::isdigit((unsigned char)t[i]) || (t[i] >= 'a' && t[i] <= 'f');
  return ok;
}

std::string shown(const json& v) {
  const std::string d = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return d.size() > 40 ? d.substr(0, 40) + "..." : d;
}

}  // namespace

std::string run_json_seal(const json& run_json) {
  json j = run_json;
  if (j.is_object()) {
    j.erase("seal");
    // Where the inputs and the run are, not what they are: base_fingerprint and
    // data_fingerprint say that (and a resumed run's --out is where it is found).
    if (auto o = j.find("options"); o != j.end() && o->is_object())
      for (const char* where : {"model", "data", "out"}) o->erase(where);
  }
  // Objects keep their keys sorted, and a number is written as the shortest text that reads
  // back to it: the dump of run.json as parsed is the dump of what the run wrote.
  ByteHash h;
  h.add(j.dump(-1, ' ', false, json::error_handler_t::replace));
  return h.text();
}

int run_json_format(const TrainOptions& o) { return o.low_rank > 0 ? 3 : kRunJsonFormat; }

void check_run_seal(const json& run_json, const std::string& file) {
  if (!run_json.is_object()) return;  // parse_run_options says so
  const auto format = run_json.find("format");
  const auto seal = run_json.find("seal");
  if (format == run_json.end() && seal == run_json.end()) return;  // an older zof's
  if (format != run_json.end()) {
    const json& f = *format;
    ZOF_CHECK(!f.is_number_integer() ||
                  (f.is_number_unsigned() ? f.get<uint64_t>() <= (uint64_t)kRunJsonFormatNewest
                                          : f.get<int64_t>() <= kRunJsonFormatNewest),
              file + " is \"format\" " + f.dump() + ", newer than this zof reads (" +
                  std::to_string(kRunJsonFormatNewest) + "): the run was written by a newer zof; "
                  "resume or replay it with that zof");
    ZOF_CHECK(f.is_number_integer() && f.get<int64_t>() >= kRunJsonFormat,
              file + ": \"format\" is " + shown(f) + ", not " + std::to_string(kRunJsonFormat) +
                  " to " + std::to_string(kRunJsonFormatNewest) + "; " + kDamaged);
  }
  ZOF_CHECK(seal != run_json.end(),
            file + " was edited after the run started: its \"seal\" was removed (a run.json of "
            "\"format\" " + std::to_string(kRunJsonFormat) + " is sealed), " + kEditedFix);
  ZOF_CHECK(hash_text(*seal), file + ": \"seal\" is " + shown(*seal) +
                                  "; it must be \"fnv1a64:\" and 16 hex digits; " + kDamaged);
  const std::string now = run_json_seal(run_json);
  ZOF_CHECK(now == seal->get<std::string>(),
            file + " was edited after the run started: its fields hash to " + now +
                ", not to its \"seal\" " + seal->get<std::string>() + ", " + kEditedFix);
}

void check_recorded_seal(const json& state, const std::string& state_file, const json& run_json,
                         const std::string& file) {
  if (!state.is_object()) return;  // parse_state says so
  const auto r = state.find("run_seal");
  if (r == state.end() || !hash_text(*r)) return;  // none (an older zof), or parse_state's
  const std::string now = run_json_seal(run_json);
  ZOF_CHECK(now == r->get<std::string>(),
            file + " was edited after the run started: its fields hash to " + now +
                ", not to the " + r->get<std::string>() + " that " + state_file +
                " records of it (run_seal), " + kEditedFix);
}

}  // namespace zof::train
