// `loom report` as a user meets it: run directories in, one self-contained HTML page out, with
// a chart per metric whose points sit where the axes say, runs overlaid, every text escaped, and
// bad input refused (exit code 2) before anything is written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "loom/obs/line_chart_svg.hpp"
#include "loom/obs/run_metrics.hpp"
#include "loom/obs/run_report_html.hpp"
#include "test_support.hpp"
#include "trainer_fixture.hpp"

namespace loom::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct CommandResult {
  int exit_code;
  std::string output;
};

CommandResult run_loom(const std::string& args) {
  const std::string command = std::string(LOOM_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer{};
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// Single quotes keep a path with <, >, & or " one shell word (no test path holds a ').
std::string quoted(const std::string& path) { return "'" + path + "'"; }

size_t count_of(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++count;
  return count;
}

// The <figure> of one chart, from its opening tag to its end; "" when the page has none.
std::string chart_figure(const std::string& html, const std::string& id) {
  const size_t begin = html.find("<figure class=\"chart\" id=\"chart-" + id + "\"");
  if (begin == std::string::npos) return "";
  return html.substr(begin, html.find("</figure>", begin) - begin);
}

// The d attribute of every line drawn in `color` within `svg`.
std::vector<std::string> paths_in(const std::string& svg, const std::string& color) {
  std::vector<std::string> out;
  const std::regex path("<path fill=\"none\" stroke=\"" + color + "\"[^>]* d=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), path); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

std::string jsonl(const std::vector<nlohmann::json>& records) {
  std::string text;
  for (const auto& r : records) text += r.dump() + "\n";
  return text;
}

// A metrics.jsonl with every field the trainer logs, values chosen for easy arithmetic:
// steps 1-5, train loss 5, 4, 3, 2, 1; step 3 skipped.
std::vector<nlohmann::json> full_records() {
  std::vector<nlohmann::json> records;
  for (int step = 1; step <= 5; ++step) {
    nlohmann::json r = {{"kind", "train"},
                        {"step", step},
                        {"total_steps", 5},
                        {"loss", 6 - step},
                        {"lr", 1e-3 * step},
                        {"grad_norm", 0.5 * step},
                        {"step_ms", 100.0},
                        {"tokens_per_s", 1280.0},
                        {"mfu", 0.25},
                        {"memory_bytes", 3 << 20},
                        {"memory_peak_bytes", {{"parameters", 1 << 20}, {"gradients", 2 << 20}, {"workspace", 0}}},
                        {"comm", {{"all_reduce", {{"calls", 2}, {"bytes_sent", 4096 * step}, {"bytes_received", 4096}}}}},
                        {"comm_tp", {{"all_reduce", {{"calls", 8}, {"bytes_sent", 12288}, {"bytes_received", 12288}}}}},
                        {"cp_exposed_comm_ms", 1.5},
                        {"moe_aux_loss", 0.01 * step},
                        {"skipped_steps", step >= 3 ? 1 : 0}};
    if (step == 3) {
      r["skipped"] = true;
      r["bad_step"] = "loss spike";
    }
    if (step % 2 == 0)
      r["rank_compute_ms"] = {{"min", 10.0}, {"median", 11.0}, {"max", 15.0}, {"slowest_rank", 1}};
    records.push_back(r);
  }
  records.push_back({{"kind", "val"}, {"step", 5}, {"val_loss", 1.5}});
  return records;
}

void write_run(const std::filesystem::path& dir, const std::vector<nlohmann::json>& records) {
  std::filesystem::create_directories(dir);
  write_text_file(dir / "metrics.jsonl", jsonl(records));
}

TEST(Report, OneChartPerMetricAndNothingFromOutsideThePage) {
  TempDir tmp("loom_report_charts");
  write_run(tmp.path() / "run", full_records());
  const CommandResult r = run_loom("report " + tmp.file("run") + " -o " + tmp.file("report.html"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("11 charts"));
  const std::string html = read_text_file(tmp.file("report.html"));
  for (const char* id : {"loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "mfu", "memory", "comm_bytes",
                         "comm_ms", "rank_compute_ms", "field_moe_aux_loss"}) {
    const std::string figure = chart_figure(html, id);
    ASSERT_FALSE(figure.empty()) << "no chart " << id;
    EXPECT_EQ(count_of(figure, "<svg"), 1u) << id;
    EXPECT_EQ(count_of(figure, "</svg>"), 1u) << id;
    EXPECT_GE(count_of(figure, "<path fill=\"none\""), 1u) << id;
  }
  EXPECT_EQ(count_of(html, "<figure class=\"chart\""), 11u);
  // Memory: the two non-zero categories and the total; the all-zero workspace is left out.
  const std::string memory = chart_figure(html, "memory");
  EXPECT_THAT(memory, HasSubstr("parameters (last 1.00 MiB)"));
  EXPECT_THAT(memory, HasSubstr("gradients (last 2.00 MiB)"));
  EXPECT_THAT(memory, HasSubstr("total (last 3.00 MiB)"));
  EXPECT_THAT(memory, HasSubstr("peak bytes (MiB)"));
  EXPECT_THAT(memory, Not(HasSubstr("workspace")));
  EXPECT_THAT(chart_figure(html, "comm_bytes"), HasSubstr("dp replicas (last 20.0 KiB)"));
  EXPECT_THAT(chart_figure(html, "comm_bytes"), HasSubstr("tp (last 12.0 KiB)"));
  EXPECT_THAT(chart_figure(html, "mfu"), HasSubstr("MFU (last 25)"));
  // The skipped step: a mark on the loss and gradient-norm charts, and in the run's header.
  EXPECT_EQ(count_of(chart_figure(html, "loss"), "step 3 skipped (loss spike)"), 1u);
  EXPECT_EQ(count_of(chart_figure(html, "grad_norm"), "step 3 skipped (loss spike)"), 1u);
  EXPECT_EQ(count_of(chart_figure(html, "lr"), "skipped ("), 0u);
  EXPECT_THAT(html, HasSubstr("<td>1: step 3 (loss spike)</td>"));
  EXPECT_THAT(html, HasSubstr("<td>128 (from tokens/s x step time)</td>"));
  // Self-contained: no scripts, stylesheets, fonts or images from anywhere else.
  for (const char* external : {"http://", "https://", "<script", "<link", "@import", "url(", "src=\"//", "xlink:href"})
    EXPECT_THAT(html, Not(HasSubstr(external))) << external;
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
}

TEST(Report, PointsLandWhereTheAxesPutThem) {
  TempDir tmp("loom_report_points");
  write_run(tmp.path() / "run", full_records());
  ASSERT_EQ(run_loom("report " + tmp.file("run") + " -o " + tmp.file("r.html")).exit_code, 0);
  const std::string html = read_text_file(tmp.file("r.html"));
  // Plot area of a 640 x 360 chart: x in [78, 616], y in [48, 302].
  const double left = kLineChartMarginLeft, right = kReportChartWidth - kLineChartMarginRight;
  const double top = kLineChartMarginTop, bottom = kReportChartHeight - kLineChartMarginBottom;
  ASSERT_EQ(left, 78.0);
  ASSERT_EQ(right, 616.0);
  ASSERT_EQ(top, 48.0);
  ASSERT_EQ(bottom, 302.0);
  // Loss: steps 1-5 round to an axis [1, 5] (step 0.5), losses 1-5 (val 1.5) to [1, 5]. Step 3
  // was skipped, so the line goes 1, 2, 4, 5: x = 78 + (s - 1) / 4 x 538, y = 302 - (v - 1) / 4 x 254.
  EXPECT_EQ(paths_in(chart_figure(html, "loss"), kChartPalette[0]),
            std::vector<std::string>{"M78.0 48.0 L212.5 111.5 L481.5 238.5 L616.0 302.0"});
  // Val loss 1.5 at step 5: y = 302 - 0.5 / 4 x 254 = 270.25, printed with one decimal.
  EXPECT_THAT(chart_figure(html, "loss"), HasSubstr("<circle cx=\"616.0\" cy=\"270.2\""));
  // The skipped step's mark at x = 347.
  EXPECT_THAT(chart_figure(html, "loss"), HasSubstr("<line x1=\"347.0\" y1=\"48.0\" x2=\"347.0\" y2=\"302.0\""));
  // Learning rate 1e-3 x step: [0.001, 0.005] on an axis of step 0.001; the same diagonal.
  EXPECT_EQ(paths_in(chart_figure(html, "lr"), kChartPalette[0]),
            std::vector<std::string>{"M78.0 302.0 L212.5 238.5 L347.0 175.0 L481.5 111.5 L616.0 48.0"});
  // dp wire bytes 4096 x step = 4-20 KiB on an axis [4, 20] KiB (step 2): y = 302 - (4s - 4) / 16 x 254.
  EXPECT_EQ(paths_in(chart_figure(html, "comm_bytes"), kChartPalette[0]),
            std::vector<std::string>{"M78.0 302.0 L212.5 238.5 L347.0 175.0 L481.5 111.5 L616.0 48.0"});
}

TEST(Report, TwoRunsShareTheAxesWithAColourEachAndALegend) {
  TempDir tmp("loom_report_two");
  std::vector<nlohmann::json> slower = full_records();
  for (auto& r : slower)
    if (r["kind"] == "train") r["loss"] = r["loss"].get<double>() + 1;
  write_run(tmp.path() / "fast", full_records());
  write_run(tmp.path() / "slow", slower);
  const CommandResult r =
      run_loom("report " + tmp.file("fast") + " " + tmp.file("slow") + "/ -o " + tmp.file("two.html"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("2 runs"));
  const std::string html = read_text_file(tmp.file("two.html"));
  const std::string loss = chart_figure(html, "loss");
  // One line per run in its own colour (train loss solid), plus the val losses (dashed, dots).
  ASSERT_EQ(paths_in(loss, kChartPalette[0]).size(), 2u);
  ASSERT_EQ(paths_in(loss, kChartPalette[1]).size(), 2u);
  EXPECT_NE(paths_in(loss, kChartPalette[0])[0], paths_in(loss, kChartPalette[1])[0]);
  // Same axes: y now spans 1-6 for both, so the fast run's first point (5) is no longer at the top.
  EXPECT_EQ(paths_in(loss, kChartPalette[1])[0].substr(0, 9), "M78.0 48.");
  EXPECT_NE(paths_in(loss, kChartPalette[0])[0].substr(0, 9), "M78.0 48.");
  // The legend names both runs (the trailing slash dropped) and the two kinds of line.
  const std::string legend = loss.substr(loss.find("<g class=\"legend\">"));
  EXPECT_THAT(legend, HasSubstr(">" + tmp.file("fast") + "</text>"));
  EXPECT_THAT(legend, HasSubstr(">" + tmp.file("slow") + "</text>"));
  EXPECT_THAT(legend, HasSubstr(">train loss</text>"));
  EXPECT_THAT(legend, HasSubstr(">val loss</text>"));
  // A header per run, each with its swatch.
  EXPECT_EQ(count_of(html, "<div class=\"run\""), 2u);
  EXPECT_THAT(html, HasSubstr("style=\"background:" + std::string(kChartPalette[1]) + "\""));
  // The same directory twice: two runs, told apart.
  ASSERT_EQ(run_loom("report " + tmp.file("fast") + " " + tmp.file("fast") + " -o " + tmp.file("same.html")).exit_code, 0);
  EXPECT_THAT(read_text_file(tmp.file("same.html")), HasSubstr(tmp.file("fast") + " (2)"));
}

TEST(Report, EscapesEveryTextFromTheRunDirectory) {
  TempDir tmp("loom_report_escape");
  const std::string name = "a<b>&\"c\"";
  std::vector<nlohmann::json> records = full_records();
  records[2]["bad_step"] = "<script>alert(1)</script>";
  write_run(tmp.path() / name, records);
  write_text_file(tmp.path() / name / "run.json",
                  nlohmann::json{{"model", {{"arch", "<img src=x onerror=alert(1)>"}, {"n_layer", 2}}},
                                 {"layout", "tp=1 & <pp>"}, {"steps", 5}}.dump());
  write_text_file(tmp.path() / name / "pipeline.svg", "<svg><script>alert(2)</script></svg>");
  const CommandResult r = run_loom("report " + quoted(tmp.file(name)) + " -o " + tmp.file("e.html"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = read_text_file(tmp.file("e.html"));
  EXPECT_THAT(html, HasSubstr("a&lt;b&gt;&amp;&quot;c&quot;"));
  EXPECT_THAT(html, Not(HasSubstr("a<b>")));
  EXPECT_THAT(html, HasSubstr("&lt;img src=x onerror=alert(1)&gt;, 2 layers"));
  EXPECT_THAT(html, HasSubstr("tp=1 &amp; &lt;pp&gt;"));
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
  // The pipeline.svg goes in as a data: image, which runs no script; its text never reaches the page.
  EXPECT_THAT(html, HasSubstr("src=\"data:image/svg+xml;base64,"));
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("<img src=x")));
}

TEST(Report, BadInputIsAClearErrorAndNothingIsWritten) {
  TempDir tmp("loom_report_errors");
  write_run(tmp.path() / "good", full_records());
  std::filesystem::create_directories(tmp.path() / "empty");
  write_run(tmp.path() / "broken", full_records());
  write_text_file(tmp.path() / "broken" / "metrics.jsonl",
                  jsonl({full_records()[0], full_records()[1]}) + "{\"kind\": \"train\", \"step\": 3,,}\n" +
                      jsonl({full_records()[3]}));
  write_run(tmp.path() / "typed", {full_records()[0], {{"kind", "train"}, {"step", 2}, {"loss", "low"}}});
  write_run(tmp.path() / "stepless", {full_records()[0], {{"kind", "train"}, {"loss", 1}}});
  write_run(tmp.path() / "not_object", {full_records()[0], nlohmann::json::array({1, 2})});
  write_run(tmp.path() / "no_steps", {{{"kind", "val"}, {"step", 1}, {"val_loss", 2}}});
  write_text_file(tmp.file("report.html"), "the previous report");
  struct Case {
    std::string args;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {tmp.file("good") + " " + tmp.file("missing"), {tmp.file("missing"), "does not exist"}},
      {tmp.file("good") + " " + tmp.file("empty"), {tmp.file("empty"), "no metrics.jsonl"}},
      {tmp.file("broken"), {tmp.file("broken") + "/metrics.jsonl", "line 3", "not valid JSON"}},
      {tmp.file("typed"), {"metrics.jsonl", "line 2", "\"loss\" is \"low\"", "a number or null"}},
      {tmp.file("stepless"), {"metrics.jsonl", "line 2", "without \"step\""}},
      {tmp.file("not_object"), {"metrics.jsonl", "line 2", "expected a JSON object"}},
      {tmp.file("no_steps"), {"metrics.jsonl", "no training steps"}},
      {tmp.file("good/metrics.jsonl"), {"metrics.jsonl", "is not a directory"}},
  };
  for (const Case& c : cases) {
    const CommandResult r = run_loom("report " + c.args + " -o " + tmp.file("report.html"));
    EXPECT_EQ(r.exit_code, 2) << c.args << ": " << r.output;
    for (const std::string& fragment : c.expected) EXPECT_THAT(r.output, HasSubstr(fragment)) << c.args;
    EXPECT_EQ(read_text_file(tmp.file("report.html")), "the previous report") << c.args;
  }
  CommandResult r = run_loom("report " + tmp.file("good") + " -o " + tmp.file("nowhere/report.html"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("nowhere"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "nowhere"));
  r = run_loom("report -o " + tmp.file("x.html"));
  EXPECT_EQ(r.exit_code, 2) << "no run directory";
  EXPECT_FALSE(std::filesystem::exists(tmp.file("x.html")));
  // Only the page itself is left behind: no temporary files.
  ASSERT_EQ(run_loom("report " + tmp.file("good") + " -o " + tmp.file("report.html")).exit_code, 0);
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path())) files += entry.is_regular_file();
  EXPECT_EQ(files, 1u);
}

TEST(Report, RollbacksReplaceTheStepsTheyRedo) {
  std::vector<nlohmann::json> records;
  for (int step = 1; step <= 4; ++step) records.push_back({{"kind", "train"}, {"step", step}, {"loss", 10 - step}});
  records.push_back({{"kind", "rollback"}, {"step", 4}, {"to_step", 2}, {"checkpoint", "ckpt/step_2"}});
  for (int step = 3; step <= 5; ++step) records.push_back({{"kind", "train"}, {"step", step}, {"loss", 1.0 * step}});
  const std::vector<int64_t> lines = {1, 2, 3, 4, 5, 6, 7, 8};
  const RunMetrics metrics = extract_run_metrics(records, lines, "m.jsonl");
  ASSERT_FALSE(metrics.charts.empty());
  ASSERT_EQ(metrics.charts[0].id, "loss");
  const StepSeries& loss = metrics.charts[0].lines.at(0);
  EXPECT_EQ(loss.steps, (std::vector<double>{1, 2, 3, 4, 5}));
  EXPECT_EQ(loss.values, (std::vector<double>{9, 8, 3, 4, 5}));
  ASSERT_EQ(metrics.rollbacks.size(), 1u);
  EXPECT_EQ(metrics.rollbacks[0].step, 4);
  EXPECT_THAT(metrics.rollbacks[0].what, HasSubstr("rolled back to step 2"));
  EXPECT_EQ(metrics.last_step, 5);
}

TEST(Report, TheSamePageFromTheSameInput) {
  ReportRun run;
  run.name = "r";
  run.metrics = extract_run_metrics(full_records(), {1, 2, 3, 4, 5, 6}, "m.jsonl");
  EXPECT_EQ(render_run_report_html({run}), render_run_report_html({run}));
}

// A real run: `loom train` writes run.json beside metrics.jsonl, and the page says what the
// run was from its directory alone; without run.json the checkpoint inside still tells.
TEST(Report, DescribesATinyTrainingRunFromItsDirectory) {
  TinyRun run("report_train");
  const std::string log_dir = run.dir + "/run";
  const CommandResult trained = run_loom("train " + run.write_config(run.config("gpt2", 6)) +
                                         " --checkpoint.dir=\\\"" + log_dir + "/ckpt\\\"");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  ASSERT_TRUE(std::filesystem::exists(log_dir + "/run.json"));
  const nlohmann::json manifest = nlohmann::json::parse(read_text_file(log_dir + "/run.json"));
  EXPECT_EQ(manifest["tokens_per_step"], 128);  // 4 sequences x 16 tokens x 2 micro-batches
  EXPECT_EQ(manifest["layout"], "tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=none");

  CommandResult r = run_loom("report " + log_dir + " -o " + run.dir + "/report.html");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string html = read_text_file(run.dir + "/report.html");
  EXPECT_THAT(html, HasSubstr("<td>gpt2, 2 layers, d=32, 4 heads, ffn 128, vocab 64,"));
  EXPECT_THAT(html, HasSubstr("<td>tp=1 pp=1 dp=1 zero=0 mbs=4 recompute=none, 1 rank</td>"));
  EXPECT_THAT(html, HasSubstr("<td>f32 on cpu</td>"));
  EXPECT_THAT(html, HasSubstr("<td>128 (4 sequences x 16 tokens x 2 micro-batches x dp 1)</td>"));
  EXPECT_THAT(html, HasSubstr("<td>6 of 6</td>"));
  // Train and val loss (evaluated at steps 5 and 6), memory by category, no communication.
  EXPECT_EQ(paths_in(chart_figure(html, "loss"), kChartPalette[0]).size(), 1u);
  EXPECT_EQ(count_of(chart_figure(html, "loss"), "<circle"), 2u + 1u);  // + the legend's dot
  EXPECT_THAT(chart_figure(html, "memory"), HasSubstr("parameters (last"));
  EXPECT_EQ(chart_figure(html, "comm_bytes"), "");

  std::filesystem::remove(log_dir + "/run.json");
  r = run_loom("report " + log_dir + " -o " + run.dir + "/report.html");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  html = read_text_file(run.dir + "/report.html");
  EXPECT_THAT(html, HasSubstr("<td>gpt2, 2 layers, d=32, 4 heads, ffn 128, vocab 64,"));
  EXPECT_THAT(html, HasSubstr("No run.json"));
  EXPECT_THAT(html, HasSubstr("<td>128</td>"));
}

}  // namespace
}  // namespace loom::test
