// `zof report` given a path that is not a run directory: the line says what the path is (a
// file, one of a run's own files, a FIFO, a link to nothing) and what to give instead, where it
// said the path "does not exist". A FIFO is never opened (no hang). The plain test at the end
// checks the other side: a symbolic link to a run directory is that run directory.
#include <sys/stat.h>

#include <fstream>

#include "common.h"
#include "faults/fault_table.h"

namespace {

namespace fs = std::filesystem;
using zof::faults::Case;
using zof::faults::Sandbox;
using zof::faults::shell_quoted;

const std::string kGiveARun =
    R"(give the directory `zof finetune --out` wrote \(it holds run\.json and metrics\.jsonl\)$)";

std::vector<Case> hostile3_report_cases() {
  return {
      {"RunIsAFile", {}, "report {T}", 1,
       R"(^report: run directory .*/text\.txt is a file, not a directory; )" + kGiveARun},
      {"RunIsAFileWithOut", {}, "report {T} --out {S}/page.html", 1,
       R"(^report: run directory .*/text\.txt is a file, not a directory; )" + kGiveARun},
      {"SecondRunIsAFile", {}, "report {R} {T} --out {S}/page.html", 1,
       R"(^report: run directory .*/text\.txt is a file, not a directory; )" + kGiveARun},
      {"RunIsTheRunsMetricsFile", {}, "report {R}/metrics.jsonl --out {S}/page.html", 1,
       R"(^report: run directory .*/run/metrics\.jsonl is a file in the run directory .*/run, not a directory; give that directory: zof report .*/run$)"},
      {"RunIsTheRunsRunJson", {}, "report {R}/run.json", 1,
       R"(^report: run directory .*/run/run\.json is a file in the run directory .*/run, not a directory; give that directory)"},
      {"RunIsAFifo",
       [](Sandbox& s) { ASSERT_EQ(::mkfifo((s.root() / "pipe").c_str(), 0600), 0); },
       "report {S}/pipe", 1,
       R"(^report: run directory .*/pipe is a FIFO, not a directory; )" + kGiveARun, {}, {}, 20},
      {"RunIsADanglingLink",
       [](Sandbox& s) { fs::create_symlink("gone", s.root() / "link"); },
       "report {S}/link --out {S}/page.html", 1,
       R"(^report: run directory .*/link is a symbolic link to gone, which does not exist; give the directory `zof finetune --out` wrote)"},
      // ---- hand-edited records: a line naming the field, not a JSON library exception ------
      {"MetricsLineIsNotAnObject",
       [](Sandbox& s) { std::ofstream(s.run() / "metrics.jsonl", std::ios::app) << "5\n"; },
       "report {R} --out {S}/page.html", 1,
       R"(^report: .*/run/metrics\.jsonl line \d+ is not a JSON object; the run directory is damaged \(remove the line to report the rest\)$)"},
      {"MetricsTypeIsNotAString",
       [](Sandbox& s) { std::ofstream(s.run() / "metrics.jsonl", std::ios::app) << "{\"type\": 5}\n"; },
       "report {R} --out {S}/page.html", 1,
       R"(^report: .*/run/metrics\.jsonl line \d+ has a "type" that is not a string; the run directory is damaged)"},
      {"RunJsonQueriesIsAString",
       [](Sandbox& s) { s.edit_json(s.run() / "run.json", [](nlohmann::json& j) { j["options"]["queries"] = "2"; }); },
       "report {R} --out {S}/page.html", 1,
       R"(^report: .*/run/run\.json options\.queries is "2", not a number; the run directory is damaged or not written by zof finetune$)"},
      {"RunIsALinkToAFile",
       [](Sandbox& s) { fs::create_symlink(s.text(), s.root() / "link"); },
       "report {S}/link --out {S}/page.html", 1,
       R"(^report: run directory .*/link is a file, not a directory; )" + kGiveARun},
  };
}

}  // namespace

ZOF_FAULT_TABLE(Hostile3Report, hostile3_report_cases());

namespace {

using zof::test::run_command;

// A link to a run directory reports that run: the page goes into the run directory (through
// the link), as for the directory itself.
TEST(Hostile3ReportRules, SymlinkToARunDirectoryIsThatRun) {
  ZOF_REQUIRE_PATH(zof::faults::assets_dir() + "/models/stories260K");
  Sandbox s("Hostile3ReportSymlink");
  const fs::path run = s.run();
  fs::create_directory_symlink(run, s.root() / "link");
  auto r = run_command(zof::faults::zof_binary() + " report " + shell_quoted(s.root() / "link"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_regular_file(run / "report.html"));
  EXPECT_TRUE(fs::is_symlink(s.root() / "link"));
  auto two = run_command(zof::faults::zof_binary() + " report " + shell_quoted(run) + " " +
                         shell_quoted(s.root() / "link") + " --out " +
                         shell_quoted(s.root() / "both.html"));
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_TRUE(fs::is_regular_file(s.root() / "both.html"));
}

}  // namespace
