// `zof report`: a run directory (or several, overlaid) as one self-contained HTML page of inline
// SVG charts: training loss raw and smoothed, the held-out metric, against steps and against
// forward passes; throughput and step time; memory where recorded; the options and the summary.
// A run in progress can be reported: the complete lines of metrics.jsonl are what it has.
// Runs of different tasks can be overlaid: each quantity (a held-out metric, a kind of training
// loss) has charts of its own, so no axis ever carries two.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zof {

// One run directory as the report reads it.
struct ReportRun {
  std::string dir;                        // as given
  std::string label;                      // legend entry (set by write_report for several runs)
  nlohmann::json run;                     // run.json
  std::vector<nlohmann::json> steps;      // metrics.jsonl records of type "step", in order
  std::vector<nlohmann::json> evals;      // ... of type "eval"
  nlohmann::json summary;                 // finetune()'s summary when it writes the report; null
  bool partial_line = false;              // metrics.jsonl ended in an incomplete line (a run in progress)
};

// Reads run.json and the complete lines of metrics.jsonl. Throws zof::Error naming the path and
// the fix: a missing directory, a path that is not a directory (saying what it is: a file, one
// of a run's files, a FIFO, a link to nothing), no run.json or metrics.jsonl, a damaged complete
// line. A symbolic link to a run directory is that run directory.
ReportRun load_report_run(const std::string& dir);

// One series the page draws: what a test compares with metrics.jsonl.
struct ReportSeries {
  std::string chart;  // "loss_steps", "loss_passes", "eval_steps", "eval_passes",
                      // "tokens_per_s", "step_ms", or a memory field's name
  size_t run = 0;     // index into the runs
  std::string what;   // "loss", "loss EMA", the metric's name, "tokens/s", "step ms", ...
  std::string name;   // the curve's data-series attribute: "<label> <what>"
  std::vector<double> x, y;  // x: steps or forward passes; non-finite y: no point
  // What y measures: the metric's name ("accuracy", "ppl", ...) for eval_*, the kind of
  // training loss ("token NLL", "candidate cross-entropy") for loss_*, the unit otherwise. The
  // page draws one chart per (chart, quantity): never two quantities on one axis.
  std::string quantity;
};

// Forward passes per step from run.json's options: 2q (two-point SPSA), q + 1 (one-sided), q
// (JVP: one forward-mode pass per direction, its primal and tangent together).
double forward_passes_per_step(const nlohmann::json& options);

// Every series of the page, chart by chart, for runs (labels set).
std::vector<ReportSeries> report_series(const std::vector<ReportRun>& runs);

// The page.
std::string render_report(const std::vector<ReportRun>& runs);

// Refuses (zof::Error naming flag, "--out", and out; "report: cannot write OUT" when flag is
// empty) an out that a report must not replace: a path inside one of the run directories other
// than its report.html, a directory, a symbolic link, a device or FIFO, or a file that is not
// an earlier zof report (which begins as every page does). A new file passes.
void check_report_out(const std::vector<std::string>& dirs, const std::string& out,
                      const std::string& flag);

// Loads every directory, labels the runs (their names, and the options that differ between
// them), and writes the page to out atomically. Nothing is written when any input is bad.
// summary: finetune()'s summary of a single run that just ended (null otherwise).
void write_report(const std::vector<std::string>& dirs, const std::string& out,
                  const nlohmann::json& summary = nullptr);

}  // namespace zof
