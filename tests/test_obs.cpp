// The observability layer: metrics log round trips, SVG well-formedness, human formats.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "loom/core/error.hpp"
#include "loom/obs/loss_plot.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/obs/progress.hpp"
#include "loom/obs/step_line.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("loom_test_obs_" + std::to_string(getpid()) + "_" + name))
      .string();
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++count;
  return count;
}

// Parse-lite well-formedness: one <svg> root, balanced groups, no stray '&' or '<'.
void expect_well_formed_svg(const std::string& svg) {
  ASSERT_EQ(svg.rfind("<svg", 0), 0u) << "must start with <svg";
  const auto end = svg.find_last_not_of(" \n");
  ASSERT_NE(end, std::string::npos);
  EXPECT_EQ(svg.substr(0, end + 1).substr(end + 1 - 6), "</svg>");
  EXPECT_EQ(count_of(svg, "<svg"), 1u);
  EXPECT_EQ(count_of(svg, "<g>") + count_of(svg, "<g "), count_of(svg, "</g>"));
  EXPECT_EQ(count_of(svg, "<text"), count_of(svg, "</text>"));
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // Every '&' starts an entity.
  for (size_t at = svg.find('&'); at != std::string::npos; at = svg.find('&', at + 1)) {
    const std::string rest = svg.substr(at, 6);
    EXPECT_TRUE(rest.rfind("&amp;", 0) == 0 || rest.rfind("&lt;", 0) == 0 ||
                rest.rfind("&gt;", 0) == 0 || rest.rfind("&quot;", 0) == 0 ||
                rest.rfind("&apos;", 0) == 0)
        << "unescaped '&' at " << at << ": " << rest;
  }
  // Every '<' opens a tag: a letter, '/' or '?' follows.
  for (size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const char next = svg[at + 1];
    EXPECT_TRUE(std::isalpha(static_cast<unsigned char>(next)) || next == '/')
        << "stray '<' at " << at;
  }
}

// ---- MetricsLog ----

TEST(MetricsLog, WritesOneCompactLinePerRecordAndReadsThemBack) {
  const std::string path = temp_path("round_trip.jsonl");
  {
    MetricsLog log(path, MetricsLog::Mode::Truncate);
    log.write({{"kind", "train"}, {"step", 1}, {"loss", 10.5}});
    log.write({{"kind", "val"}, {"step", 1}, {"val_loss", 10.75}, {"note", "line\nbreak"}});
  }
  const std::string text = read_text_file(path);
  EXPECT_EQ(count_of(text, "\n"), 2u);  // the embedded newline is escaped, not written raw
  EXPECT_EQ(text.find(": "), std::string::npos) << "compact: no spaces after ':'";
  const auto records = MetricsLog::read_all(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["loss"].get<double>(), 10.5);
  EXPECT_EQ(records[1]["note"].get<std::string>(), "line\nbreak");
  std::remove(path.c_str());
}

TEST(MetricsLog, LinesAreOnDiskBeforeTheLogCloses) {
  const std::string path = temp_path("flushed.jsonl");
  MetricsLog log(path, MetricsLog::Mode::Truncate);
  log.write({{"step", 7}});
  EXPECT_EQ(MetricsLog::read_all(path).size(), 1u);  // as a killed run would leave it
  std::remove(path.c_str());
}

TEST(MetricsLog, ReadSkipsATruncatedLastLine) {
  const std::string path = temp_path("truncated.jsonl");
  std::ofstream(path) << "{\"step\":1,\"loss\":3.5}\n\n{\"step\":2,\"loss\":3.4}\n{\"step\":3,\"lo";
  const auto records = MetricsLog::read_all(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1]["step"].get<int>(), 2);
  std::remove(path.c_str());
}

TEST(MetricsLog, ReadKeepsACompleteLastLineWithoutNewline) {
  const std::string path = temp_path("no_newline.jsonl");
  std::ofstream(path) << "{\"step\":1}\n{\"step\":2}";
  EXPECT_EQ(MetricsLog::read_all(path).size(), 2u);
  std::remove(path.c_str());
}

TEST(MetricsLog, ReadRejectsAMalformedCompleteLineNamingIt) {
  const std::string path = temp_path("malformed.jsonl");
  std::ofstream(path) << "{\"step\":1}\nnot json\n{\"step\":3}\n";
  try {
    MetricsLog::read_all(path);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(MetricsLog, AppendDropsTheKilledRunsPartialLineAndKeepsTheRest) {
  const std::string path = temp_path("append.jsonl");
  std::ofstream(path) << "{\"step\":1}\n{\"step\":2,\"lo";
  {
    MetricsLog log(path, MetricsLog::Mode::Append);
    log.write({{"step", 2}});
  }
  const auto records = MetricsLog::read_all(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1]["step"].get<int>(), 2);
  { MetricsLog log(path, MetricsLog::Mode::Truncate); }
  EXPECT_TRUE(MetricsLog::read_all(path).empty());
  std::remove(path.c_str());
}

TEST(MetricsLog, NonFiniteValuesBecomeNull) {
  const std::string path = temp_path("nan.jsonl");
  {
    MetricsLog log(path, MetricsLog::Mode::Truncate);
    log.write({{"loss", kNaN}, {"grad_norm", kInf}});
  }
  const auto records = MetricsLog::read_all(path);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_TRUE(records[0]["loss"].is_null());
  EXPECT_TRUE(records[0]["grad_norm"].is_null());
  std::remove(path.c_str());
}

TEST(MetricsLog, UnopenablePathsThrowNamingThePath) {
  EXPECT_THROW(MetricsLog("/nonexistent_dir_loom/x.jsonl", MetricsLog::Mode::Truncate), Error);
  try {
    MetricsLog::read_all("/nonexistent_dir_loom/x.jsonl");
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent_dir_loom/x.jsonl"), std::string::npos);
  }
}

// ---- SVG line chart ----

TEST(LineChartSvg, IsWellFormedWithOnePathPerNonEmptySeries) {
  const std::vector<Series> series = {
      {"train", "#1f77b4", {1, 2, 3, 4}, {4.0, 3.5, 3.2, 3.1}, false},
      {"val", "", {2, 4}, {3.6, 3.3}, true},
      {"empty", "green", {}, {}, false},
  };
  const std::string svg = render_line_chart_svg(series, "Loss", "step", "loss", 3.0, "baseline");
  expect_well_formed_svg(svg);
  EXPECT_EQ(count_of(svg, "<path"), 2u);
  EXPECT_EQ(count_of(svg, "<circle"), 2u + 1u);  // val's points, plus its legend sample
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(svg.find(">baseline<"), std::string::npos);
  EXPECT_NE(svg.find(">empty<"), std::string::npos) << "an empty series still has its legend entry";
}

TEST(LineChartSvg, EscapesEveryText) {
  const std::vector<Series> series = {{"a<b & \"c\"", "#000", {0, 1}, {0, 1}, false}};
  const std::string svg = render_line_chart_svg(series, "<title>&", "x<&", "y'>", 0.5, "ref<&>");
  expect_well_formed_svg(svg);
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg.find("&lt;title&gt;&amp;"), std::string::npos);
  EXPECT_NE(svg.find("x&lt;&amp;"), std::string::npos);
  EXPECT_NE(svg.find("y&apos;&gt;"), std::string::npos);
  EXPECT_NE(svg.find("ref&lt;&amp;&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<title>"), std::string::npos);
}

TEST(LineChartSvg, SkipsNonFinitePointsAndDrawsNothingForAnAllNaNSeries) {
  const std::vector<Series> series = {
      {"some", "", {0, 1, kNaN, 3, 4}, {1, kInf, 2, 2.5, -kInf}, false},
      {"none", "", {0, 1}, {kNaN, kNaN}, false},
  };
  const std::string svg = render_line_chart_svg(series, "t", "x", "y");
  expect_well_formed_svg(svg);
  EXPECT_EQ(count_of(svg, "<path"), 1u);
  EXPECT_EQ(count_of(svg, " L"), 1u) << "two finite points: one move and one line segment";
}

TEST(LineChartSvg, HandlesNoDataAndASingleValue) {
  expect_well_formed_svg(render_line_chart_svg({}, "", "", ""));
  const std::string svg =
      render_line_chart_svg({{"flat", "", {5, 5}, {2, 2}, true}}, "t", "x", "y");
  expect_well_formed_svg(svg);
  EXPECT_EQ(count_of(svg, "<path"), 1u);
}

TEST(LineChartSvg, TicksAreRoundNumbers) {
  const std::string svg =
      render_line_chart_svg({{"", "", {0, 1000}, {2.9, 10.8}, false}}, "t", "x", "y");
  for (const char* tick : {">0<", ">200<", ">1000<", ">2<", ">4<", ">10<"})
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  EXPECT_EQ(svg.find(">1.1<"), std::string::npos);
}

TEST(LineChartSvg, LongSeriesAreThinnedToThePixelColumns) {
  Series noisy{"", "", {}, {}, false};
  for (int i = 0; i < 100000; ++i) noisy.x.push_back(i), noisy.y.push_back(3 + std::sin(i * 0.37));
  const std::string svg = render_line_chart_svg({noisy}, "t", "x", "y");
  expect_well_formed_svg(svg);
  EXPECT_LT(count_of(svg, " L"), 4u * 800u);
  EXPECT_LT(svg.size(), 100'000u);
}

TEST(LineChartSvg, MismatchedLengthsThrowNamingTheSeries) {
  try {
    render_line_chart_svg({{"lopsided", "", {1, 2}, {1}, false}}, "t", "x", "y");
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lopsided"), std::string::npos);
  }
}

TEST(LossPlot, PlotsTrainAndValFromRecordsAndReplacesTheFileAtomically) {
  const std::string path = temp_path("loss.svg");
  std::vector<nlohmann::json> records;
  for (int step = 1; step <= 50; ++step)
    records.push_back({{"kind", "train"}, {"step", step}, {"loss", 10.0 / std::sqrt(step)}});
  records.push_back({{"kind", "train"}, {"step", 51}, {"loss", nullptr}});  // a NaN loss, logged
  records.push_back({{"kind", "val"}, {"step", 25}, {"val_loss", 2.5}});
  records.push_back({{"kind", "val"}, {"step", 50}, {"val_loss", 1.6}});
  records.push_back({{"kind", "config"}, {"step", "not a number"}});
  records.push_back("not an object");
  std::ofstream(path) << "old";
  write_loss_plot_svg(path, records, 7.5);
  const std::string svg = read_text_file(path);
  expect_well_formed_svg(svg);
  EXPECT_EQ(count_of(svg, "<path"), 2u);
  EXPECT_NE(svg.find("unigram baseline (7.500)"), std::string::npos);
  EXPECT_NE(svg.find("val loss (last 1.600)"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::remove(path.c_str());
  EXPECT_THROW(write_loss_plot_svg("/nonexistent_dir_loom/loss.svg", records, {}), Error);
}

// ---- human formats ----

TEST(Formats, Duration) {
  EXPECT_EQ(format_duration(0), "0.0s");
  EXPECT_EQ(format_duration(12.34), "12.3s");
  EXPECT_EQ(format_duration(59.97), "1m00s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3599.6), "1h00m");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(100 * 3600), "100h00m");
  EXPECT_EQ(format_duration(-1), "--");
  EXPECT_EQ(format_duration(kNaN), "--");
  EXPECT_EQ(format_duration(kInf), "--");
}

TEST(Formats, Bytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1048575), "1.00 MiB");  // not "1024 KiB"
  EXPECT_EQ(format_bytes(static_cast<int64_t>(1.23 * (1LL << 30))), "1.23 GiB");
  EXPECT_EQ(format_bytes(80LL << 30), "80.0 GiB");
  EXPECT_EQ(format_bytes(-2048), "-2.00 KiB");
  EXPECT_EQ(format_bytes(std::numeric_limits<int64_t>::max()), "8.00 EiB");
}

TEST(Formats, Count) {
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(812), "812");
  EXPECT_EQ(format_count(999.96), "1k");
  EXPECT_EQ(format_count(3200), "3.2k");
  EXPECT_EQ(format_count(1260), "1.26k");
  EXPECT_EQ(format_count(124.4e6), "124.4M");
  EXPECT_EQ(format_count(7e9), "7B");
  EXPECT_EQ(format_count(-1500), "-1.5k");
  EXPECT_EQ(format_count(kNaN), "nan");
  EXPECT_EQ(format_count(kInf), "inf");
}

// ---- progress bar ----

TEST(Progress, LineShowsBarCountPercentEtaAndSuffix) {
  EXPECT_EQ(progress_line(45, 100, 83.0, "loss 3.2"),
            "[#############.................] 45/100 45% ETA 1m23s loss 3.2");
  EXPECT_EQ(progress_line(0, 100, std::nullopt, ""),
            "[..............................] 0/100 0% ETA --");
  EXPECT_EQ(progress_line(150, 100, 0.0, "").substr(0, 32), "[##############################]");
  EXPECT_NE(progress_line(0, 0, std::nullopt, "").find("100%"), std::string::npos);
}

TEST(Progress, DrawsOnlyWhenInteractive) {
  std::FILE* out = std::tmpfile();
  {
    ProgressBar quiet(10, out, /*interactive=*/false);
    quiet.update(5, "x");
    quiet.finish();
  }
  EXPECT_EQ(std::ftell(out), 0L);
  {
    ProgressBar bar(10, out, /*interactive=*/true);
    bar.update(1, "first");
    bar.update(2, "maybe throttled");
    bar.update(10, "last");
  }  // the destructor ends the line
  std::rewind(out);
  char buffer[1024] = {};
  const size_t length = std::fread(buffer, 1, sizeof buffer - 1, out);
  const std::string text(buffer, length);
  std::fclose(out);
  EXPECT_EQ(text.front(), '\r');
  EXPECT_NE(text.find("1/10"), std::string::npos);
  EXPECT_NE(text.find("10/10 100%"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

// ---- step line ----

StepReport sample_report() {
  StepReport r;
  r.step = 12, r.total_steps = 1000, r.loss = 5.4321, r.lr = 3e-4, r.grad_norm = 1.234;
  r.step_ms = 812, r.tokens_per_s = 1260, r.mfu = 0.412,
  r.memory_bytes = static_cast<int64_t>(1.05 * (1LL << 30));
  return r;
}

TEST(StepLine, ContainsEveryNumber) {
  EXPECT_EQ(format_step_line(sample_report()),
            "step   12/1000 | loss  5.4321 | lr 3.00e-04 | norm  1.23 |   812 ms |  1.26k tok/s | "
            "MFU 41.2% "
            "| mem   1.05 GiB");
}

TEST(StepLine, KeepsItsWidthAcrossSteps) {
  StepReport late = sample_report();
  late.step = 1000, late.loss = 3.1, late.step_ms = 790, late.tokens_per_s = 1300, late.mfu = 0.4;
  EXPECT_EQ(format_step_line(late).size(), format_step_line(sample_report()).size());
}

TEST(StepLine, UnknownMfuAndMemoryShowAsDashes) {
  StepReport r = sample_report();
  r.mfu = kNaN, r.memory_bytes = -1, r.step_ms = 3.25;
  const std::string line = format_step_line(r);
  EXPECT_NE(line.find("MFU    --"), std::string::npos) << line;
  EXPECT_NE(line.find("mem         --"), std::string::npos) << line;
  EXPECT_NE(line.find("3.2 ms"), std::string::npos) << line;
}

TEST(StepLine, JsonHasKindTrainAndSnakeCaseKeys) {
  const nlohmann::json j = step_report_json(sample_report());
  EXPECT_EQ(j["kind"], "train");
  EXPECT_EQ(j["step"], 12);
  EXPECT_EQ(j["total_steps"], 1000);
  EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 5.4321);
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 3e-4);
  EXPECT_DOUBLE_EQ(j["grad_norm"].get<double>(), 1.234);
  EXPECT_DOUBLE_EQ(j["step_ms"].get<double>(), 812);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 1260);
  EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.412);
  EXPECT_EQ(j["memory_bytes"], sample_report().memory_bytes);
  StepReport unknown = sample_report();
  unknown.mfu = kNaN, unknown.memory_bytes = -1;
  EXPECT_TRUE(step_report_json(unknown)["mfu"].is_null());
  EXPECT_TRUE(step_report_json(unknown)["memory_bytes"].is_null());
}

}  // namespace
}  // namespace loom::test
