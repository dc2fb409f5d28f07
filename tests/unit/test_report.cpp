// `zof report` without a model: the numbers behind the curves against metrics.jsonl, the SVG
// paths drawn from them, several runs overlaid, a run in progress, and bad input.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "report/svg_chart.h"
#include "zof/error.h"
#include "zof/report.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The (x, y) pixel points of one "M x y L x y ..." path.
std::vector<std::pair<double, double>> path_points(const std::string& d) {
  std::vector<std::pair<double, double>> pts;
  std::istringstream in(d);
  std::string cmd;
  double x, y;
  while (in >> cmd >> y) {  // "Mx" glued: the command letter starts the x token
    x = std::stod(cmd.substr(1));
    pts.push_back({x, y});
  }
  return pts;
}

// The d attribute of the path whose data-series is name (empty when absent), and how many.
std::vector<std::string> paths_named(const std::string& html, const std::string& name) {
  std::vector<std::string> out;
  const std::string key = "data-series=\"" + name + "\" d=\"";
  for (size_t p = html.find(key); p != std::string::npos; p = html.find(key, p + 1)) {
    const size_t a = p + key.size();
    out.push_back(html.substr(a, html.find('"', a) - a));
  }
  return out;
}

class Report : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("zof_report_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A run directory with steps step records (loss 5 - 0.1 step, step 3 not finite) and an
  // evaluation before, every 4 steps and after; extra fields go into every step record.
  fs::path make_run(const std::string& name, const json& options, int steps,
                    const json& extra = json::object(), const std::string& tail = "") {
    const fs::path run = dir_ / name;
    fs::create_directories(run);
    json o = options;
    o["steps"] = steps;
    std::ofstream(run / "run.json")
        << json{{"options", o},
                {"model_id", {{"config", {{"model_type", "llama"}, {"torch_dtype", "float32"}}},
                              {"num_params", 260000}}},
                {"zof_version", "test"}}
               .dump(1);
    std::ofstream m(run / "metrics.jsonl");
    m << json{{"type", "eval"}, {"step", 0}, {"metric", "ppl"}, {"value", 40.0}, {"when", "before"}}.dump() << "\n";
    for (int s = 0; s < steps; ++s) {
      json r{{"type", "step"}, {"step", s}, {"loss", s == 3 ? json() : json(5 - 0.1 * s)},
             {"tokens", 256}, {"step_s", 0.01 * (1 + s % 3)}, {"tokens_per_s", 256 / (0.01 * (1 + s % 3))}};
      r.update(extra);
      m << r.dump() << "\n";
      if ((s + 1) % 4 == 0 || s + 1 == steps)
        m << json{{"type", "eval"}, {"step", s + 1}, {"metric", "ppl"}, {"value", 40.0 - s},
                  {"when", s + 1 == steps ? "after" : "during"}}.dump() << "\n";
    }
    m << tail;
    return run;
  }
  fs::path dir_;
};

const ::zof::ReportSeries& find(const std::vector<zof::ReportSeries>& all, const std::string& chart,
                                const std::string& what, size_t run = 0) {
  for (const auto& s : all)
    if (s.chart == chart && s.what == what && s.run == run) return s;
  ADD_FAILURE() << "no series " << chart << " / " << what;
  static zof::ReportSeries none;
  return none;
}

TEST_F(Report, SeriesAreTheNumbersOfMetricsJsonl) {
  const fs::path run = make_run("a", {{"queries", 2}, {"estimator", "spsa"}}, 10);
  zof::ReportRun r = zof::load_report_run(run.string());
  r.label = "a";
  ASSERT_EQ(r.steps.size(), 10u);
  ASSERT_EQ(r.evals.size(), 4u);  // before, after 4 and 8 steps, after the last
  const auto all = zof::report_series({r});
  const auto& loss = find(all, "loss_steps", "loss");
  const auto& passes = find(all, "loss_passes", "loss");
  ASSERT_EQ(loss.x.size(), 10u);
  for (int s = 0; s < 10; ++s) {
    EXPECT_EQ(loss.x[s], s);
    EXPECT_EQ(passes.x[s], 4.0 * s);  // two-point SPSA, q = 2: 4 forward passes a step
    if (s == 3) EXPECT_TRUE(std::isnan(loss.y[s]));
    else EXPECT_DOUBLE_EQ(loss.y[s], r.steps[s]["loss"].get<double>());
    EXPECT_DOUBLE_EQ(find(all, "step_ms", "step ms").y[s], 1000 * r.steps[s]["step_s"].get<double>());
    EXPECT_DOUBLE_EQ(find(all, "tokens_per_s", "tokens/s").y[s], r.steps[s]["tokens_per_s"].get<double>());
  }
  // The EMA (alpha 0.1, bias-corrected) starts at the first loss and skips the missing one.
  const auto& ema = find(all, "loss_steps", "loss EMA");
  EXPECT_DOUBLE_EQ(ema.y[0], 5.0);
  EXPECT_TRUE(std::isnan(ema.y[3]));
  EXPECT_GT(ema.y[9], loss.y[9]);  // a falling loss: the average lags behind
  const auto& ev = find(all, "eval_passes", "ppl");
  ASSERT_EQ(ev.x.size(), 4u);
  EXPECT_EQ(ev.x[1], 16.0);
  EXPECT_EQ(ev.y[1], 37.0);
  // No per-step memory field in these records: no memory series.
  for (const auto& s : all) EXPECT_EQ(s.chart.find("bytes"), std::string::npos) << s.chart;
}

TEST_F(Report, ForwardPassesPerStepFollowTheEstimator) {
  EXPECT_EQ(zof::forward_passes_per_step({{"queries", 3}}), 6);
  EXPECT_EQ(zof::forward_passes_per_step({{"queries", 3}, {"one_sided", true}}), 4);
  EXPECT_EQ(zof::forward_passes_per_step({{"queries", 3}, {"estimator", "jvp"}}), 3);
}

// The drawn path, mapped back through the chart's frame, is the data.
TEST_F(Report, SvgPathMapsBackToTheData) {
  zof::report::Chart c{"t", "step", "loss", {}};
  zof::report::Series s;
  s.name = "curve";
  s.colour = "#000";
  s.x = {0, 1, 2, 5, 9};
  s.y = {3.2, 2.9, NAN, 2.1, 1.7};
  c.series.push_back(s);
  const std::string svg = zof::report::svg_line_chart(c, 560, 330);
  const auto d = paths_named(svg, "curve");
  ASSERT_EQ(d.size(), 1u);
  const auto pts = path_points(d[0]);
  ASSERT_EQ(pts.size(), 4u);  // the non-finite point is a gap
  EXPECT_NE(d[0].find(" M"), std::string::npos);  // the pen lifts over the gap
  const zof::report::ChartFrame f = zof::report::chart_frame(c, 560, 330);
  const size_t idx[] = {0, 1, 3, 4};
  for (size_t i = 0; i < pts.size(); ++i) {
    const double x = f.x0 + (pts[i].first - f.left) / (f.right - f.left) * (f.x1 - f.x0);
    const double y = f.y0 + (f.bottom - pts[i].second) / (f.bottom - f.top) * (f.y1 - f.y0);
    EXPECT_NEAR(x, s.x[idx[i]], 0.01 * (f.x1 - f.x0) / (f.right - f.left) + 1e-9);
    EXPECT_NEAR(y, s.y[idx[i]], 0.01 * (f.y1 - f.y0) / (f.bottom - f.top) + 1e-9);
  }
  // Ticks with labels on both axes.
  std::regex tick("class=\"tick\"");
  EXPECT_GE(std::distance(std::sregex_iterator(svg.begin(), svg.end(), tick), std::sregex_iterator()), 6);
}

TEST_F(Report, NiceTicksAreOneTwoFive) {
  EXPECT_EQ(zof::report::nice_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  const auto t = zof::report::nice_ticks(0.3, 1.1, 4);
  const std::vector<double> want{0.4, 0.6, 0.8, 1.0};
  ASSERT_EQ(t.size(), want.size());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_NEAR(t[i], want[i], 1e-12);
}

// In the page, every point of a curve is in its path, in proportion to the file's numbers.
TEST_F(Report, PagePathsHoldTheFileNumbers) {
  const fs::path run = make_run("a", {{"queries", 1}}, 12);
  const fs::path out = dir_ / "r.html";
  zof::write_report({run.string()}, out.string());
  const std::string html = slurp(out);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);  // nothing fetched
  const auto d = paths_named(html, "a loss");
  ASSERT_EQ(d.size(), 2u);  // against steps and against forward passes
  const auto pts = path_points(d[0]);
  ASSERT_EQ(pts.size(), 11u);  // 12 steps, one loss not finite
  // Pixel positions are an affine map of (step, loss): compare ratios with the data.
  const double sx = (pts.back().first - pts.front().first) / 11.0;
  const double sy = (pts.back().second - pts.front().second) / (-0.1 * 11);
  int i = 0;
  for (int s = 0; s < 12; ++s) {
    if (s == 3) continue;
    EXPECT_NEAR(pts[i].first - pts.front().first, sx * s, 0.02);
    EXPECT_NEAR(pts[i].second - pts.front().second, sy * (-0.1 * s), 0.02);
    ++i;
  }
  EXPECT_NE(html.find("EMA (alpha 0.1, bias-corrected)"), std::string::npos);
  EXPECT_NE(html.find("2q"), std::string::npos);  // the forward-pass caption
  EXPECT_EQ(html.find("Memory"), std::string::npos);  // nothing recorded: no memory panel
}

TEST_F(Report, SeveralRunsOnePathPerCurveEachAndALegend) {
  const fs::path a = make_run("lr1", {{"lr", 1e-4}, {"estimator", "spsa"}}, 8);
  const fs::path b = make_run("lr2", {{"lr", 2e-4}, {"estimator", "jvp"}}, 8);
  const fs::path out = dir_ / "cmp.html";
  zof::write_report({a.string(), b.string()}, out.string());
  const std::string html = slurp(out);
  // Labels carry what differs between the runs.
  const std::string la = "lr1 (estimator spsa, lr 0.0001)", lb = "lr2 (estimator jvp, lr 0.0002)";
  std::vector<zof::ReportRun> runs{zof::load_report_run(a.string()), zof::load_report_run(b.string())};
  runs[0].label = la;
  runs[1].label = lb;
  const auto all = zof::report_series(runs);
  for (const auto& s : all) {
    const std::string esc = std::regex_replace(s.name, std::regex("&"), "&amp;");
    EXPECT_EQ(paths_named(html, esc).size(),
              (size_t)std::count_if(all.begin(), all.end(), [&](const auto& o) { return o.name == s.name; }))
        << s.name;
  }
  size_t curves = 0;
  for (size_t p = html.find("class=\"curve\""); p != std::string::npos; p = html.find("class=\"curve\"", p + 1)) ++curves;
  EXPECT_EQ(curves, all.size());
  EXPECT_EQ(all.size(), 2 * 8u);  // per run: loss raw+EMA twice, eval twice, tokens/s, step time
  EXPECT_NE(html.find("class=\"legend\""), std::string::npos);
  EXPECT_NE(html.find(">" + la + "</text>"), std::string::npos);
  EXPECT_NE(html.find(">" + lb + "</text>"), std::string::npos);
  EXPECT_NE(html.find("stroke=\"#1f77b4\""), std::string::npos);
  EXPECT_NE(html.find("stroke=\"#d62728\""), std::string::npos);
  // The JVP run's forward passes: q per step.
  const auto& ev = find(all, "loss_passes", "loss", 1);
  EXPECT_EQ(ev.x[5], 5.0);
}

TEST_F(Report, RunInProgressIgnoresAPartialLastLine) {
  const fs::path run = make_run("live", {{"queries", 1}}, 5, json::object(),
                                "{\"type\":\"step\",\"step\":5,\"lo");
  const zof::ReportRun r = zof::load_report_run(run.string());
  EXPECT_EQ(r.steps.size(), 5u);
  EXPECT_TRUE(r.partial_line);
  zof::write_report({run.string()}, (dir_ / "r.html").string());
  EXPECT_NE(slurp(dir_ / "r.html").find("incomplete"), std::string::npos);
}

TEST_F(Report, MemoryFieldsAreDrawnWhenRecorded) {
  const fs::path run = make_run("m", {{"queries", 1}}, 4, {{"device_bytes", 3 << 20}});
  zof::write_report({run.string()}, (dir_ / "r.html").string());
  const std::string html = slurp(dir_ / "r.html");
  EXPECT_NE(html.find("Memory per step"), std::string::npos);
  const auto d = paths_named(html, "m device_bytes");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(path_points(d[0]).size(), 4u);
}

TEST_F(Report, BadInputNamesThePathAndWritesNothing) {
  auto error_of = [](auto f) {
    try {
      f();
    } catch (const zof::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string missing = (dir_ / "nope").string();
  EXPECT_NE(error_of([&] { zof::load_report_run(missing); }).find(missing + " does not exist"),
            std::string::npos);
  fs::create_directories(dir_ / "empty");
  EXPECT_NE(error_of([&] { zof::load_report_run((dir_ / "empty").string()); }).find("no metrics.jsonl"),
            std::string::npos);
  const fs::path run = make_run("a", {{"queries", 1}}, 3);
  std::ofstream(dir_ / "file") << "x";
  const std::string out = (dir_ / "file" / "r.html").string();
  EXPECT_NE(error_of([&] { zof::write_report({run.string()}, out); }).find("not a directory"),
            std::string::npos);
  const std::string e = error_of([&] { zof::write_report({run.string(), missing}, (dir_ / "x.html").string()); });
  EXPECT_NE(e.find(missing), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "x.html"));
  // A damaged complete line names its line.
  std::ofstream(run / "metrics.jsonl", std::ios::app) << "{not json\n";
  EXPECT_NE(error_of([&] { zof::load_report_run(run.string()); }).find("line"), std::string::npos);
}

}  // namespace
