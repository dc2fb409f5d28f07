// `zof report` through the binary: a real stories260K run's page as a person sees it (a headless
// Chromium screenshot, decoded and checked for curves), and bad input as one error line.
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using zof::test::run_command;

namespace {

std::string zof_cmd(const std::string& args) { return zof::test::zof_binary() + " " + args; }

// One line on stderr, "zof: error: ..." naming what, and a non-zero exit.
void expect_error_line(const zof::test::CommandResult& r, const std::string& what) {
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.err.rfind("zof: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << r.err;
}

// The page's charts: each <svg>'s title and the data-series names of its curves.
std::map<std::string, std::vector<std::string>> charts_of(const std::string& html) {
  std::map<std::string, std::vector<std::string>> out;
  for (size_t a = html.find("<svg "); a != std::string::npos; a = html.find("<svg ", a + 1)) {
    const std::string svg = html.substr(a, html.find("</svg>", a) - a);
    const size_t t = svg.find("<title>") + 7;
    auto& series = out[svg.substr(t, svg.find("</title>", t) - t)];
    const std::string key = "data-series=\"";
    for (size_t p = svg.find(key); p != std::string::npos; p = svg.find(key, p + 1))
      series.push_back(svg.substr(p + key.size(), svg.find('"', p + key.size()) - p - key.size()));
  }
  return out;
}

class ReportCli : public zof::test::ShakespeareRunTest {
 protected:
  // A short run: 30 steps, evaluations every 10 (report.html written at the end).
  fs::path finetune(const std::string& name, const std::string& extra = "") {
    const fs::path run = dir_ / name;
    auto r = run_command(zof_cmd("finetune --model " + zof::test::assets_dir() +
                                 "/models/stories260K --task text --data " +
                                 (dir_ / "text.txt").string() + " --out " + run.string() +
                                 " --steps 30 --batch 4 --seq-len 32 --lr 1e-4 --eval-examples 8 "
                                 "--eval-every 10 --threads 1 " + extra));
    EXPECT_EQ(r.code, 0) << r.err;
    return run;
  }
};

TEST_F(ReportCli, BadInputIsOneErrorLineAndWritesNothing) {
  const fs::path run = finetune("run", "--no-report");
  EXPECT_FALSE(fs::exists(run / "report.html"));
  const std::string missing = (dir_ / "missing").string();
  expect_error_line(run_command(zof_cmd("report " + missing)), missing);
  fs::create_directories(dir_ / "empty");
  expect_error_line(run_command(zof_cmd("report " + (dir_ / "empty").string())), "metrics.jsonl");
  EXPECT_FALSE(fs::exists(dir_ / "empty" / "report.html"));
  const std::string bad_out = (dir_ / "text.txt" / "r.html").string();  // under a file
  expect_error_line(run_command(zof_cmd("report " + run.string() + " --out " + bad_out)), bad_out);
  expect_error_line(run_command(zof_cmd("report " + run.string() + " " + run.string())), "--out");
  EXPECT_FALSE(fs::exists(run / "report.html"));
  auto ok = run_command(zof_cmd("report " + run.string()));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_TRUE(fs::exists(run / "report.html"));
}

// A classification run (SST-2: accuracy, MeZO's cross-entropy over the candidates) beside a
// text run (ppl, token NLL): each metric and each loss on a chart of its own, with its own title
// and axis, never one axis for two quantities; throughput, the same quantity, still compared.
TEST_F(ReportCli, RunsOfDifferentMetricsGetAChartPerMetric) {
  const std::string sst2 = zof::test::assets_dir() + "/data/sst2";
  ZOF_REQUIRE_PATH(sst2 + "/train.tsv");
  const fs::path cls = dir_ / "cls";
  auto c = run_command(zof_cmd("finetune --model " + zof::test::assets_dir() +
                               "/models/stories260K --task sst2 --objective classification "
                               "--data " + sst2 + " --out " + cls.string() +
                               " --steps 6 --batch 4 --seq-len 64 --lr 1e-3 --train-examples 32 "
                               "--eval-examples 8 --eval-every 3 --threads 1 --no-report"));
  ASSERT_EQ(c.code, 0) << c.err;
  const fs::path text = finetune("text", "--no-report");
  const fs::path page = dir_ / "mixed.html";
  auto r = run_command(zof_cmd("report " + cls.string() + " " + text.string() + " --out " +
                               page.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto charts = charts_of(zof::test::read_file(page.string()));
  // Every chart's curves end in the one quantity its title names.
  auto ends = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  const std::pair<const char*, const char*> per_metric[] = {
      {"Held-out accuracy vs steps", " accuracy"}, {"Held-out accuracy vs forward passes", " accuracy"},
      {"Held-out ppl vs steps", " ppl"}, {"Held-out ppl vs forward passes", " ppl"}};
  for (const auto& [title, tail] : per_metric) {
    ASSERT_TRUE(charts.count(title)) << "no chart titled " << title;
    ASSERT_EQ(charts.at(title).size(), 1u) << title;  // one run has the metric
    EXPECT_EQ(charts.at(title)[0].rfind(ends(tail, "accuracy") ? "cls" : "text", 0), 0u)
        << title << ": " << charts.at(title)[0];
    for (const std::string& s : charts.at(title)) EXPECT_TRUE(ends(s, tail)) << title << ": " << s;
  }
  for (const auto& [title, series] : charts) {
    if (title.find("Held-out") == std::string::npos) continue;
    const bool acc = title.find("accuracy") != std::string::npos;
    for (const std::string& s : series)
      EXPECT_FALSE(ends(s, acc ? " ppl" : " accuracy")) << title << " carries " << s;
  }
  // The two losses: the classification run's on its own chart, the text run's on another.
  std::set<std::string> loss_runs;
  for (const auto& [title, series] : charts) {
    if (title.rfind("Training loss", 0) != 0) continue;
    std::set<char> runs;
    for (const std::string& s : series) runs.insert(s[0]);
    EXPECT_EQ(runs.size(), 1u) << title << " draws the losses of both runs on one axis";
    loss_runs.insert(title.substr(0, title.find(" vs ")) + " " + std::string(1, *runs.begin()));
  }
  EXPECT_EQ(loss_runs, (std::set<std::string>{"Training loss (candidate cross-entropy) c",
                                              "Training loss (token NLL) t"}));
  ASSERT_TRUE(charts.count("Throughput"));
  EXPECT_EQ(charts.at("Throughput").size(), 2u);  // both runs, one quantity
}

// Rendered by a browser, the page of a real run shows its curves (not a blank or broken page).
TEST_F(ReportCli, ScreenshotShowsTheCurves) {
  std::string chromium;
  for (const char* c : {"chromium", "chromium-browser", "google-chrome"})
    if (run_command(std::string("command -v ") + c).code == 0) {
      chromium = c;
      break;
    }
  if (chromium.empty()) {
    if (zof::test::in_ci()) FAIL() << "chromium is not installed (scripts/setup.sh installs it)";
    GTEST_SKIP() << "chromium not installed (scripts/setup.sh installs it)";
  }
  const fs::path a = finetune("lr1e-4");
  const fs::path b = finetune("lr4e-4", "--lr 4e-4 --no-report");
  ASSERT_TRUE(fs::exists(a / "report.html"));
  const fs::path page = dir_ / "cmp.html", png = dir_ / "cmp.png";
  auto r = run_command(zof_cmd("report " + a.string() + " " + b.string() + " --out " + page.string()));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const auto& [html, shot] : {std::pair{a / "report.html", dir_ / "one.png"}, std::pair{page, png}}) {
    auto c = run_command("timeout 120 " + chromium + " --headless --no-sandbox --disable-gpu "
                         "--hide-scrollbars --user-data-dir=" + (dir_ / "chromium").string() +
                         " --window-size=1200,1500 --screenshot=" + shot.string() + " file://" +
                         fs::absolute(html).string());
    ASSERT_TRUE(fs::exists(shot)) << c.out << c.err;
    const char* env = std::getenv("ZOF_PYTHON");
    const std::string py = env && *env ? env : zof::test::binary_dir() + "/venv/bin/python";
    auto s = run_command("'" + py + "' " + zof::test::source_dir() + "/tests/model/png_ink.py " +
                         shot.string());
    ASSERT_EQ(s.code, 0) << s.err;
    const json stats = json::parse(s.out);
    EXPECT_EQ(stats["width"], 1200);
    // Text, axes and curves cover a few percent of a white page; a blank one has none, an
    // unstyled error page a sliver. The first run's colour is there: its curves were drawn.
    EXPECT_GT(stats["ink"].get<double>(), 0.02) << s.out;
    EXPECT_GT(stats["curve"].get<double>(), 0.001) << s.out;
  }
}

}  // namespace
