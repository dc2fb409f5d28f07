// Reading a run directory for the report (report.h): run.json and the complete lines of
// metrics.jsonl, whatever state the run is in.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "zof/error.h"
#include "zof/report.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace zof {
namespace {

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  ZOF_CHECK(f.good(), "report: cannot read " + p.string() + " (check its permissions)");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The records of metrics.jsonl. A last line without its newline is a record still being
// written (the run is in progress, or was killed mid-line): left out.
void read_metrics(const fs::path& p, ReportRun& r) {
  const std::string text = read_all(p);
  size_t pos = 0;
  int64_t lineno = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {
      r.partial_line = true;
      break;
    }
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception&) {
      throw Error("report: " + p.string() + " line " + std::to_string(lineno) +
                  " is not valid JSON; the run directory is damaged (remove the line to report the rest)");
    }
    // What the report reads by type (the rest it reads as numbers where they are numbers).
    for (const char* key : {"type", "metric", "when"})
      ZOF_CHECK(j.is_object() && (!j.contains(key) || j[key].is_string()),
                "report: " + p.string() + " line " + std::to_string(lineno) +
                    (j.is_object() ? std::string(" has a \"") + key + "\" that is not a string"
                                   : std::string(" is not a JSON object")) +
                    "; the run directory is damaged (remove the line to report the rest)");
    const std::string type = j.value("type", "");
    if (type == "step") r.steps.push_back(std::move(j));
    if (type == "eval") r.evals.push_back(std::move(j));
  }
}

// Why dir, which is not a directory, is not a run directory: what it is, and what to give
// instead. Only stat(2) and readlink(2): a FIFO given here is never opened (which would hang).
std::string not_a_run_directory(const std::string& dir, const fs::file_status& st) {
  const std::string what = "report: run directory " + dir;
  const std::string give =
      "give the directory `zof finetune --out` wrote (it holds run.json and metrics.jsonl)";
  std::error_code ec;
  if (!fs::exists(st)) {
    // Through a link to nothing: the link exists, what it names does not.
    if (fs::is_symlink(fs::symlink_status(dir, ec)))
      return what + " is a symbolic link to " + fs::read_symlink(dir, ec).string() +
             ", which does not exist; " + give;
    return what + " does not exist; give a directory written by `zof finetune --out`";
  }
  if (fs::is_regular_file(st)) {
    // One of a run's own files (run.json, metrics.jsonl, report.html): its directory is meant.
    fs::path parent = fs::path(dir).parent_path();
    if (parent.empty()) parent = ".";
    if (fs::is_regular_file(parent / "run.json", ec) &&
        fs::is_regular_file(parent / "metrics.jsonl", ec))
      return what + " is a file in the run directory " + parent.string() +
             ", not a directory; give that directory: zof report " + parent.string();
    return what + " is a file, not a directory; " + give;
  }
  const char* kind = fs::is_fifo(st)                                  ? " is a FIFO"
                     : fs::is_socket(st)                              ? " is a socket"
                     : fs::is_block_file(st) || fs::is_character_file(st) ? " is a device"
                                                                          : "";
  return what + kind + (*kind ? ", not a directory; " : " is not a directory; ") + give;
}

}  // namespace

ReportRun load_report_run(const std::string& dir) {
  const fs::path d(dir);
  // status follows links: a link to a run directory is that run directory. Errors other than
  // "not found" (a loop of links, no permission) throw filesystem_error, which the CLI words
  // with the path.
  const fs::file_status st = fs::status(d);
  if (!fs::is_directory(st)) throw Error(not_a_run_directory(dir, st));
  ZOF_CHECK(fs::is_regular_file(d / "metrics.jsonl"),
            "report: " + dir + " holds no metrics.jsonl, so it is not a zof run directory (or its "
            "run has not started); give a directory written by `zof finetune --out`");
  ZOF_CHECK(fs::is_regular_file(d / "run.json"),
            "report: " + dir + " holds no run.json, so it is not a zof run directory; give a "
            "directory written by `zof finetune --out`");
  ReportRun r;
  r.dir = dir;
  try {
    r.run = json::parse(read_all(d / "run.json"));
  } catch (const json::exception& e) {
    throw Error("report: " + (d / "run.json").string() + " is not valid JSON (" + e.what() +
                "); the run directory is damaged");
  }
  ZOF_CHECK(r.run.is_object() && r.run.contains("options") && r.run["options"].is_object(),
            "report: " + (d / "run.json").string() + " has no \"options\" object; the run "
            "directory is damaged or not written by zof finetune");
  // The fields the report reads by type: a hand-edited run.json gets a line, not a JSON library
  // exception.
  const json& o = r.run["options"];
  const std::tuple<const char*, bool (json::*)() const noexcept, const char*> typed[] = {
      {"queries", &json::is_number, "a number"}, {"estimator", &json::is_string, "a string"},
      {"one_sided", &json::is_boolean, "true or false"}, {"task", &json::is_string, "a string"},
      {"objective", &json::is_string, "a string"}};
  for (const auto& [key, is, want] : typed)
    ZOF_CHECK(!o.contains(key) || (o[key].*is)(),
              "report: " + (d / "run.json").string() + " options." + key + " is " +
                  o[key].dump().substr(0, 40) + ", not " + want +
                  "; the run directory is damaged or not written by zof finetune");
  ZOF_CHECK(!r.run.contains("model_id") || r.run["model_id"].is_object(),
            "report: " + (d / "run.json").string() + " \"model_id\" is not an object; the run "
            "directory is damaged or not written by zof finetune");
  read_metrics(d / "metrics.jsonl", r);
  // A finished run's summary (finetune writes it as the run ends): device, memory, streaming.
  if (fs::is_regular_file(d / "summary.json")) {
    try {
      r.summary = json::parse(read_all(d / "summary.json"));
    } catch (const json::exception& e) {
      throw Error("report: " + (d / "summary.json").string() + " is not valid JSON (" + e.what() +
                  "); delete it (the report then rebuilds what it can from metrics.jsonl)");
    }
  }
  return r;
}

double forward_passes_per_step(const json& o) {
  const double q = o.value("queries", 1);
  if (o.value("estimator", std::string("spsa")) == "jvp") return q;
  return o.value("one_sided", false) ? q + 1 : 2 * q;
}

}  // namespace zof
