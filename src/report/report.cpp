// The report page (report.h): the series behind each chart, the charts as SVG, the runs'
// options and summaries as tables, all in one HTML file with no scripts and no network.
#include "zof/report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <map>
#include <set>

#include "report/svg_chart.h"
#include "util/files.h"
#include "zof/error.h"
#include "zof/options.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace zof {
namespace {

using report::Chart;
using report::Series;
using report::xml_escape;

constexpr double kEmaAlpha = 0.1;  // the smoothed loss: EMA with this weight, bias-corrected
constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
// Per-step memory fields a metrics record may carry, drawn in MiB when present.
constexpr const char* kMemoryFields[] = {"peak_rss_bytes", "rss_bytes", "device_bytes",
                                         "streamed_bytes"};

std::string colour(size_t run) { return kColours[run % std::size(kColours)]; }

double num(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// EMA of the finite values, bias-corrected (the first points are not pulled toward 0).
std::vector<double> ema(const std::vector<double>& y) {
  std::vector<double> out(y.size(), NAN);
  double m = 0, w = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) continue;
    m = (1 - kEmaAlpha) * m + kEmaAlpha * y[i];
    w = (1 - kEmaAlpha) * w + kEmaAlpha;
    out[i] = m / w;
  }
  return out;
}

// A string field, or fallback where it is missing or not a string (a hand-edited record).
std::string text_of(const json& j, const char* key, const std::string& fallback) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::string eval_metric(const json& e) { return text_of(e, "metric", "metric"); }

// The held-out metrics of a run, in the order they first appear (one, unless metrics.jsonl was
// pieced together from runs of different tasks).
std::vector<std::string> run_metrics(const ReportRun& r) {
  std::vector<std::string> m;
  for (const json& e : r.evals)
    if (std::find(m.begin(), m.end(), eval_metric(e)) == m.end()) m.push_back(eval_metric(e));
  return m;
}

// What a run's training loss is, from run.json's options: MeZO's cross-entropy over a candidate
// task's answers (objective classification: about ln 2 for SST-2 at the start), or the mean NLL
// of the trained tokens (the text, or the correct answer's tokens: objective lm). Different
// quantities on different scales: never drawn on one axis.
std::string loss_quantity(const json& options) {
  TrainOptions o;
  o.task = find_choice<Task>(text_of(options, "task", "text")).value_or(Task::Text);
  // Runs from before --objective: lm.
  o.objective = find_choice<Objective>(text_of(options, "objective", "lm")).value_or(Objective::Lm);
  return training_objective(o) == Objective::Classification ? "candidate cross-entropy"
                                                            : "token NLL";
}

// The series of one run, in the order the page draws them.
void run_series(size_t index, const ReportRun& r, std::vector<ReportSeries>& out) {
  const double fp = forward_passes_per_step(r.run["options"]);
  std::vector<double> step, loss, tps, ms;
  for (const json& s : r.steps) {
    step.push_back(num(s, "step"));
    loss.push_back(num(s, "loss"));
    tps.push_back(num(s, "tokens_per_s"));
    ms.push_back(num(s, "step_s") * 1000);
  }
  std::vector<double> passes;
  for (double s : step) passes.push_back(s * fp);
  const std::vector<double> smooth = ema(loss);
  auto add = [&](const char* chart, const std::string& what, const std::string& quantity,
                 std::vector<double> x, std::vector<double> y) {
    out.push_back(
        {chart, index, what, r.label + " " + what, std::move(x), std::move(y), quantity});
  };
  const std::string lq = loss_quantity(r.run["options"]);
  add("loss_steps", "loss", lq, step, loss);
  add("loss_steps", "loss EMA", lq, step, smooth);
  add("loss_passes", "loss", lq, passes, loss);
  add("loss_passes", "loss EMA", lq, passes, smooth);
  // A series per metric: each evaluation on the chart of the metric it measured.
  for (const std::string& m : run_metrics(r)) {
    std::vector<double> es, ev, ep;
    for (const json& e : r.evals) {
      if (eval_metric(e) != m) continue;
      es.push_back(num(e, "step"));
      ev.push_back(num(e, "value"));
      ep.push_back(es.back() * fp);
    }
    add("eval_steps", m, m, es, ev);
    add("eval_passes", m, m, ep, ev);
  }
  add("tokens_per_s", "tokens/s", "tokens/s", step, tps);
  add("step_ms", "step ms", "ms per step", step, ms);
  for (const char* field : kMemoryFields) {
    std::vector<double> y;
    bool any = false;
    for (const json& s : r.steps) {
      y.push_back(num(s, field) / (1024.0 * 1024.0));
      any = any || std::isfinite(y.back());
    }
    if (any) add(field, field, "MiB", step, y);
  }
}


// ---- the page ---------------------------------------------------------------------------------

// One chart: the series of one chart kind (ReportSeries::chart) that measure one quantity.
struct ChartSpec {
  std::string id, quantity, title, x_label, y_label;
};

ChartSpec chart_spec(const std::string& id, const std::string& q) {
  if (id == "loss_steps") return {id, q, "Training loss (" + q + ") vs steps", "step", q};
  if (id == "loss_passes")
    return {id, q, "Training loss (" + q + ") vs forward passes", "forward passes", q};
  if (id == "eval_steps") return {id, q, "Held-out " + q + " vs steps", "step", q};
  if (id == "eval_passes") return {id, q, "Held-out " + q + " vs forward passes", "forward passes", q};
  if (id == "tokens_per_s") return {id, q, "Throughput", "step", q};
  if (id == "step_ms") return {id, q, "Step time", "step", q};
  return {id, q, id, "step", q};  // a memory field
}

// The quantities the series of the chart kinds ids measure, in the order they first appear.
std::vector<std::string> quantities(const std::vector<ReportSeries>& all,
                                    const std::vector<std::string>& ids) {
  std::vector<std::string> q;
  for (const ReportSeries& rs : all)
    if (std::find(ids.begin(), ids.end(), rs.chart) != ids.end() &&
        std::find(q.begin(), q.end(), rs.quantity) == q.end())
      q.push_back(rs.quantity);
  return q;
}

// How a series looks: a run's colour; the raw loss faint under its EMA; evaluations with dots.
// Several runs: the legend names the runs; one run: what the curves are.
Series styled(const ReportSeries& rs, const std::vector<ReportRun>& runs) {
  const bool several = runs.size() > 1;
  Series s;
  s.name = rs.name;
  s.colour = colour(rs.run);
  s.x = rs.x;
  s.y = rs.y;
  s.label = several ? runs[rs.run].label : "";
  if (rs.what == "loss") {
    s.width = 1;
    s.opacity = several ? 0.3 : 0.45;
    s.label = several ? "" : "raw";
  } else if (rs.what == "loss EMA") {
    s.width = 2.2;
    if (!several) s.label = "EMA (alpha " + fmt("%.2g", kEmaAlpha) + ", bias-corrected)";
  } else if (rs.chart.rfind("eval_", 0) == 0) {
    s.markers = true;
  } else {
    s.width = 1.5;
  }
  return s;
}

std::string chart_svg(const ChartSpec& spec, const std::vector<ReportSeries>& all,
                      const std::vector<ReportRun>& runs) {
  Chart c{spec.title, spec.x_label, spec.y_label, {}};
  for (const ReportSeries& rs : all)
    if (rs.chart == spec.id && rs.quantity == spec.quantity) c.series.push_back(styled(rs, runs));
  if (c.series.empty()) return "";
  return "<figure>" + report::svg_line_chart(c) + "</figure>";
}

std::string section(const std::string& title, const std::string& body, const std::string& caption) {
  if (body.empty()) return "";
  return "<section><h2>" + xml_escape(title) + "</h2><div class=\"charts\">" + body +
         "</div><p class=\"caption\">" + caption + "</p></section>";
}

std::string passes_caption(const std::vector<ReportRun>& runs) {
  std::string per;
  for (const ReportRun& r : runs) {
    const json& o = r.run["options"];
    per += (per.empty() ? "" : "; ") + xml_escape(r.label) + ": " +
           fmt("%g", forward_passes_per_step(o)) + " (" +
           xml_escape(o.value("estimator", std::string("spsa"))) +
           (o.value("one_sided", false) ? ", one-sided" : "") + ", q = " +
           std::to_string(o.value("queries", 1)) + ")";
  }
  return "Forward passes = step &times; forward passes per step, derived from run.json's options: "
         "two-point SPSA spends 2q, one-sided SPSA q + 1, the JVP estimator q (one forward-mode "
         "pass per direction, carrying the primal and a tangent: dearer than a plain forward in "
         "wall time). Each pass covers the step's whole batch, --micro-batches or not. Per step: " +
         per + ".";
}

std::string charts_html(const std::vector<ReportRun>& runs) {
  const std::vector<ReportSeries> all = report_series(runs);
  // The charts of the kinds ids: for each quantity, one chart per kind (a loss against steps
  // beside the same loss against forward passes). Runs of different tasks share the charts of
  // the quantities they share (throughput, step time) and have their own for the rest.
  auto charts = [&](const std::vector<std::string>& ids) {
    std::string s;
    for (const std::string& q : quantities(all, ids))
      for (const std::string& id : ids) s += chart_svg(chart_spec(id, q), all, runs);
    return s;
  };
  const std::vector<std::string> losses = quantities(all, {"loss_steps"});
  const std::vector<std::string> metrics = quantities(all, {"eval_steps"});
  std::string loss_caption =
      "Training loss of every step (SPSA: the mean of L(&theta;+&epsilon;z) and "
      "L(&theta;&minus;&epsilon;z); JVP: L(&theta;)), faint, and its exponential moving average "
      "(alpha " + fmt("%.2g", kEmaAlpha) + ", bias-corrected), solid. ";
  if (std::find(losses.begin(), losses.end(), "candidate cross-entropy") != losses.end())
    loss_caption += "Candidate cross-entropy: MeZO's classification loss, the cross-entropy of "
                    "the scores of a task's candidate answers (--objective classification); "
                    "token NLL: the mean negative log-likelihood of the trained tokens. ";
  if (losses.size() > 1)
    loss_caption += "The runs train on different losses, each drawn on charts of its own. ";
  std::vector<std::string> memory(std::begin(kMemoryFields), std::end(kMemoryFields));
  return section("Training loss", charts({"loss_steps", "loss_passes"}),
                 loss_caption + passes_caption(runs)) +
         section("Held-out metric", charts({"eval_steps", "eval_passes"}),
                 std::string("The held-out metric at every evaluation: before the first step, "
                             "every --eval-every steps, after the last. Against forward passes "
                             "as above.") +
                     (metrics.size() > 1 ? " The runs are scored by different metrics, each "
                                           "drawn on charts of its own."
                                         : "")) +
         section("Throughput", charts({"tokens_per_s", "step_ms"}),
                 "Training tokens per second and wall time of each step (evaluations excluded).") +
         section("Memory per step", charts(memory), "Per-step memory fields of metrics.jsonl, in MiB.");
}

}  // namespace

std::vector<ReportSeries> report_series(const std::vector<ReportRun>& runs) {
  std::vector<ReportSeries> out;
  for (size_t i = 0; i < runs.size(); ++i) run_series(i, runs[i], out);
  return out;
}

namespace {

// ---- tables -----------------------------------------------------------------------------------

std::string value_text(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt("%.6g", v.get<double>());
  return v.dump();
}

using Rows = std::vector<std::pair<std::string, std::vector<std::string>>>;

// A table with a column per run; rows where the runs differ are marked.
std::string table(const std::vector<ReportRun>& runs, const Rows& rows) {
  std::string s = "<table><tr><th></th>";
  for (const ReportRun& r : runs) s += "<th>" + xml_escape(r.label) + "</th>";
  s += "</tr>";
  for (const auto& [key, values] : rows) {
    const bool differs = std::set<std::string>(values.begin(), values.end()).size() > 1;
    s += std::string("<tr") + (differs ? " class=\"differs\"" : "") + "><td>" + xml_escape(key) +
         "</td>";
    for (const std::string& v : values) s += "<td>" + xml_escape(v) + "</td>";
    s += "</tr>";
  }
  return s + "</table>";
}

// Adds key's value for every run (a row only when some run has one).
void add_row(Rows& rows, const std::string& key, const std::vector<std::string>& values) {
  for (const std::string& v : values)
    if (!v.empty()) {
      rows.push_back({key, values});
      return;
    }
}

template <class F>
void add_row(Rows& rows, const std::string& key, const std::vector<ReportRun>& runs, F f) {
  std::vector<std::string> v;
  for (const ReportRun& r : runs) v.push_back(f(r));
  add_row(rows, key, v);
}

std::string run_table(const std::vector<ReportRun>& runs) {
  Rows rows;
  add_row(rows, "run directory", runs, [](const ReportRun& r) { return r.dir; });
  add_row(rows, "zof version", runs, [](const ReportRun& r) { return value_text(r.run.value("zof_version", json())); });
  auto config = [](const ReportRun& r) {
    const json c = r.run.value("model_id", json::object()).value("config", json::object());
    return c.is_object() ? c : json::object();  // a hand-edited one: no rows, not an exception
  };
  add_row(rows, "architecture", runs, [&](const ReportRun& r) {
    const json c = config(r);
    return c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty()
               ? value_text(c["architectures"][0]) : value_text(c.value("model_type", json()));
  });
  add_row(rows, "parameters", runs, [](const ReportRun& r) {
    return value_text(r.run.value("model_id", json::object()).value("num_params", json()));
  });
  add_row(rows, "dtype", runs, [&](const ReportRun& r) {
    const json c = config(r);
    return value_text(c.contains("torch_dtype") ? c["torch_dtype"] : c.value("dtype", json()));
  });
  // Where the run ran: known to finetune() when it writes the report, not kept in run.json.
  add_row(rows, "device", runs, [](const ReportRun& r) { return value_text(r.summary.is_object() ? r.summary.value("device", json()) : json()); });
  std::set<std::string> keys;
  for (const ReportRun& r : runs)
    for (const auto& [k, v] : r.run["options"].items()) keys.insert(k);
  for (const std::string& k : keys)
    add_row(rows, k, runs, [&](const ReportRun& r) { return value_text(r.run["options"].value(k, json())); });
  return table(runs, rows);
}

// What the run's records say: the summary finetune prints, rebuilt from metrics.jsonl so that a
// run in progress (or a past one) has it too.
Rows derived_summary(const std::vector<ReportRun>& runs) {
  Rows rows;
  add_row(rows, "status", runs, [](const ReportRun& r) {
    const bool done = std::any_of(r.evals.begin(), r.evals.end(), [](const json& e) { return e.value("when", "") == "after"; });
    if (r.summary.is_object() && r.summary.value("interrupted", json()) == true) return std::string("interrupted (resumable)");
    return std::string(done ? "finished" : "in progress or interrupted") + (r.partial_line ? "; last line of metrics.jsonl incomplete, left out" : "");
  });
  add_row(rows, "steps", runs, [](const ReportRun& r) {
    const double last = r.steps.empty() ? 0 : num(r.steps.back(), "step") + 1;
    return fmt("%.0f", last) + " of " + value_text(r.run["options"].value("steps", json()));
  });
  add_row(rows, "training loss (mean of the last 50 finite steps)", runs, [](const ReportRun& r) {
    double sum = 0;
    int n = 0;
    for (auto it = r.steps.rbegin(); it != r.steps.rend() && n < 50; ++it)
      if (std::isfinite(num(*it, "loss"))) sum += num(*it, "loss"), ++n;
    return n ? fmt("%.6g", sum / n) : std::string();
  });
  add_row(rows, "held-out metric, first and last", runs, [](const ReportRun& r) {
    if (r.evals.empty()) return std::string();
    const std::string first = eval_metric(r.evals.front()), last = eval_metric(r.evals.back());
    return first + " " + fmt("%.6g", num(r.evals.front(), "value")) + " -> " +
           (last == first ? "" : last + " ") + fmt("%.6g", num(r.evals.back(), "value")) +
           " (step " + fmt("%.0f", num(r.evals.back(), "step")) + ")";
  });
  add_row(rows, "tokens/s (all steps)", runs, [](const ReportRun& r) {
    double tok = 0, sec = 0;
    for (const json& s : r.steps) tok += num(s, "tokens"), sec += num(s, "step_s");
    return sec > 0 ? fmt("%.1f", tok / sec) + " (" + fmt("%.2f", sec) + " s of steps)" : std::string();
  });
  add_row(rows, "forward passes", runs, [](const ReportRun& r) {
    const double n = r.steps.empty() ? 0 : num(r.steps.back(), "step") + 1;
    return fmt("%.0f", n * forward_passes_per_step(r.run["options"]));
  });
  return rows;
}

void flatten(const json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (!j.is_object()) {
    out[prefix] = value_text(j);
    return;
  }
  for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
}

std::string summary_table(const std::vector<ReportRun>& runs) {
  Rows rows = derived_summary(runs);
  // finetune()'s own summary, where it wrote the report as the run ended.
  std::map<std::string, std::map<std::string, std::string>> flat;
  std::set<std::string> keys;
  for (const ReportRun& r : runs) {
    if (!r.summary.is_object()) continue;
    flatten(r.summary, "", flat[r.dir]);
    for (const auto& [k, v] : flat[r.dir]) keys.insert(k);
  }
  for (const std::string& k : keys)
    add_row(rows, "finetune: " + k, runs, [&](const ReportRun& r) {
      const auto it = flat[r.dir].find(k);
      return it == flat[r.dir].end() ? std::string() : it->second;
    });
  return table(runs, rows);
}

// ---- the page ---------------------------------------------------------------------------------

constexpr const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:22px 0 6px;border-bottom:1px solid #ddd;padding-bottom:3px}
.meta{color:#555;font-size:13px;margin:0 0 10px}
.charts{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}
.caption{color:#555;font-size:12.5px;max-width:1140px;margin:6px 0 0}
svg.chart{background:#fff;font-family:inherit}
.chart-title{font-size:14px;font-weight:600;fill:#222}.tick{font-size:11px;fill:#444}
.axis-label{font-size:12px;fill:#333}.legend-label{font-size:11px;fill:#222}
.grid{stroke:#e6e6e6;stroke-width:1}.frame{fill:none;stroke:#999;stroke-width:1}
table{border-collapse:collapse;font-size:12.5px;margin-top:4px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}tr.differs td{background:#fff7d6}
.runs{display:flex;flex-wrap:wrap;gap:16px;font-size:13px;margin:6px 0}
.swatch{display:inline-block;width:18px;height:4px;margin-right:6px;vertical-align:middle}
)";

std::string header_html(const std::vector<ReportRun>& runs) {
  std::string s = "<h1>zof report: " +
                  xml_escape(runs.size() == 1 ? runs[0].label : std::to_string(runs.size()) + " runs") +
                  "</h1><p class=\"meta\">";
  for (const ReportRun& r : runs)
    s += xml_escape(r.dir) + ": " + std::to_string(r.steps.size()) + " steps, " +
         std::to_string(r.evals.size()) + " evaluations in metrics.jsonl. ";
  s += "</p>";
  if (runs.size() > 1) {
    s += "<div class=\"runs\">";
    for (size_t i = 0; i < runs.size(); ++i)
      s += "<span><span class=\"swatch\" style=\"background:" + colour(i) + "\"></span>" +
           xml_escape(runs[i].label) + "</span>";
    s += "</div>";
  }
  return s;
}

// Memory the process that ran the run saw, known only to finetune() writing the report.
std::string memory_table(const std::vector<ReportRun>& runs) {
  Rows rows;
  auto mib = [](double b) { return std::isfinite(b) ? fmt("%.1f MiB", b / (1024.0 * 1024.0)) : std::string(); };
  auto field = [](const ReportRun& r, const char* a, const char* b) {
    if (!r.summary.is_object()) return (double)NAN;
    const json& j = b ? r.summary.value(a, json::object()) : r.summary;
    return num(j, b ? b : a);
  };
  add_row(rows, "peak RSS of the run's process", runs, [&](const ReportRun& r) { return mib(field(r, "peak_rss_bytes", nullptr)); });
  add_row(rows, "device bytes (streaming)", runs, [&](const ReportRun& r) { return mib(field(r, "streaming", "device_bytes")); });
  add_row(rows, "streamed bytes per step", runs, [&](const ReportRun& r) {
    const double steps = field(r, "steps", nullptr);
    return steps > 0 ? mib(field(r, "streaming", "bytes_uploaded") / steps) : std::string();
  });
  return rows.empty() ? "" : "<section><h2>Memory</h2>" + table(runs, rows) + "</section>";
}

}  // namespace

// How every page begins: also how an earlier report is recognised, the one file besides a new
// one that a report may replace.
const char* const kPageHead =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>zof report</title>";

std::string render_report(const std::vector<ReportRun>& runs) {
  ZOF_CHECK(!runs.empty(), "report: no run directory given");
  return std::string(kPageHead) + "<style>" + std::string(kStyle) + "</style></head><body>" + header_html(runs) + charts_html(runs) +
         memory_table(runs) + "<section><h2>Summary</h2>" + summary_table(runs) +
         "</section><section><h2>Run</h2>" + run_table(runs) + "</section></body></html>\n";
}

}  // namespace zof

namespace zof {
namespace {

std::string option_text(const json& v) {
  return v.is_number_float() ? fmt("%g", v.get<double>()) : value_text(v);
}

// Each run's legend entry: its directory's name and, for several, the options that differ.
void label_runs(std::vector<ReportRun>& runs) {
  std::vector<std::string> names;
  for (const ReportRun& r : runs) {
    fs::path p = fs::path(r.dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    names.push_back(p.filename().string());
  }
  const bool unique = std::set<std::string>(names.begin(), names.end()).size() == names.size();
  std::vector<std::string> differ;
  if (runs.size() > 1)
    for (const auto& [k, v] : runs[0].run["options"].items()) {
      if (k == "out") continue;
      for (const ReportRun& r : runs)
        if (r.run["options"].value(k, json()) != v) {
          differ.push_back(k);
          break;
        }
    }
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string extra;
    for (size_t k = 0; k < differ.size() && k < 3; ++k) {
      const json v = runs[i].run["options"].value(differ[k], json());
      if (!v.is_null()) extra += (extra.empty() ? "" : ", ") + differ[k] + " " + option_text(v);
    }
    runs[i].label = (unique ? names[i] : runs[i].dir) + (extra.empty() ? "" : " (" + extra + ")");
  }
}

// Refuses an --out that cannot be written before anything is: no directory to hold it, a
// directory in its place, no permission.
void check_writable(const fs::path& out) {
  const fs::path parent = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  ZOF_CHECK(fs::is_directory(parent), "report: cannot write " + out.string() + ": " +
                                          parent.string() + " is not a directory; create it or choose another --out");
  ZOF_CHECK(!fs::is_directory(out), "report: cannot write " + out.string() +
                                        ": it is a directory; give a file name such as " +
                                        (out / "report.html").string());
  ZOF_CHECK(::access(parent.c_str(), W_OK) == 0,
            "report: cannot write " + out.string() + ": " + parent.string() +
                " is not writable; choose a writable --out");
}

// p made absolute with its symlinks resolved as far as it exists.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p, ec).lexically_normal() : r;
}

// Whether inner is outer or lies inside it (both resolved).
bool inside(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

void check_report_out(const std::vector<std::string>& dirs, const std::string& out,
                      const std::string& flag) {
  const std::string what = flag.empty() ? "report: cannot write " + out : flag + " " + out;
  const std::string fix = flag.empty() ? "give --out a new file name"
                                       : "choose a new file name for " + flag;
  // Inside a run directory only its report.html: anything else there is the run's.
  const fs::path o = resolved(out);
  for (const std::string& d : dirs) {
    const fs::path r = resolved(d);
    if (!inside(o, r) || o == r / "report.html") continue;
    throw Error(what + " lies inside the run directory " + d + ", where a report may only be " +
                (fs::path(d) / "report.html").string() + " (the other files are the run's); " +
                "choose that or a file outside the run");
  }
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(out, ec);
  if (!fs::exists(st)) return;  // a new file
  ZOF_CHECK(!fs::is_directory(st), what + " is a directory; give a file name such as " +
                                       (fs::path(out) / "report.html").string());
  ZOF_CHECK(!fs::is_symlink(st), what + " is a symbolic link: a report replaces only an earlier "
                                        "zof report, never what a link points to; " + fix);
  ZOF_CHECK(fs::is_regular_file(st), what + " exists and is not a regular file (a device, FIFO "
                                            "or socket): a report is never written there; " + fix);
  std::ifstream f(out, std::ios::binary);
  const size_t n = std::strlen(kPageHead);
  std::string head(n, '\0');
  f.read(head.data(), (std::streamsize)n);
  ZOF_CHECK(f.gcount() == (std::streamsize)n && head == kPageHead,
            what + " exists and is not a zof report: a report replaces only an earlier page "
                   "written by zof report, so that no other file is lost; " + fix);
}

void write_report(const std::vector<std::string>& dirs, const std::string& out,
                  const json& summary) {
  ZOF_CHECK(!dirs.empty(), "report: no run directory given; usage: zof report RUN_DIR [RUN_DIR ...]");
  std::vector<ReportRun> runs;
  for (const std::string& d : dirs) runs.push_back(load_report_run(d));
  if (summary.is_object() && runs.size() == 1) {
    runs[0].summary = summary;
    // The run's process is this one: its peak resident memory so far.
    rusage ru{};
    if (!summary.contains("peak_rss_bytes") && ::getrusage(RUSAGE_SELF, &ru) == 0)
      runs[0].summary["peak_rss_bytes"] = (double)ru.ru_maxrss * 1024.0;  // Linux: KiB
  }
  label_runs(runs);
  const std::string page = render_report(runs);
  check_report_out(dirs, out, "");
  check_writable(out);
  try {
    write_file_atomic(out, page);
  } catch (const Error& e) {
    throw Error("report: cannot write " + out + " (" + e.what() + "); choose a writable --out");
  }
}

}  // namespace zof
