// Reading a run directory for the report (report.h): run.json and the complete lines of
// metrics.jsonl, whatever state the run is in.
#include <filesystem>
#include <fstream>
#include <sstream>

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
    const std::string type = j.value("type", "");
    if (type == "step") r.steps.push_back(std::move(j));
    if (type == "eval") r.evals.push_back(std::move(j));
  }
}

}  // namespace

ReportRun load_report_run(const std::string& dir) {
  const fs::path d(dir);
  ZOF_CHECK(fs::is_directory(d), "report: run directory " + dir +
                                     " does not exist; give a directory written by `zof finetune --out`");
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
