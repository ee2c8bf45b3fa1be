// The stacked bar chart and the pipeline timeline: geometry read back from the SVG text,
// escaping, input errors, and the atomic file write they share.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/obs/bar_chart_svg.hpp"
#include "loom/obs/svg_support.hpp"
#include "loom/obs/timeline_svg.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

size_t count_of(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++count;
  return count;
}

// The opening tags that start with `prefix` (e.g. `<rect class="span`), in document order.
std::vector<std::string> elements(const std::string& svg, const std::string& prefix) {
  std::vector<std::string> found;
  for (size_t at = svg.find(prefix); at != std::string::npos; at = svg.find(prefix, at + 1))
    found.push_back(svg.substr(at, svg.find('>', at) - at + 1));
  return found;
}

// The opening tag of the element whose text is exactly `content`, e.g. a tick label.
std::string element_with_text(const std::string& svg, const std::string& content) {
  const size_t end = svg.find(">" + content + "</text>");
  if (end == std::string::npos) ADD_FAILURE() << "no text '" << content << "'";
  if (end == std::string::npos) return "";
  const size_t start = svg.rfind("<text", end);
  return svg.substr(start, end - start + 1);
}

double attribute(const std::string& element, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t at = element.find(key);
  if (at == std::string::npos) ADD_FAILURE() << "no " << name << " in " << element;
  return at == std::string::npos ? kNaN : std::stod(element.substr(at + key.size()));
}

std::string string_attribute(const std::string& element, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t at = element.find(key) + key.size();
  return element.substr(at, element.find('"', at) - at);
}

// A standalone document, balanced where a renderer could slip, no NaN or inf printed.
void expect_standalone_svg(const std::string& svg) {
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count_of(svg, "<g>") + count_of(svg, "<g "), count_of(svg, "</g>"));
  EXPECT_EQ(count_of(svg, "<text"), count_of(svg, "</text>"));
  EXPECT_EQ(count_of(svg, "<title>"), count_of(svg, "</title>"));
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

// ---- timeline ----

// Two ranks of a 1F1B-like schedule, with a bubble on rank 1 before its first forward.
std::vector<TimelineSpan> two_rank_spans() {
  return {
      {0, false, 0, 0, 0.0, 1.0}, {0, false, 1, 0, 1.0, 2.0}, {1, false, 0, 0, 1.0, 2.0},
      {1, true, 0, 0, 2.0, 4.0},  {0, true, 0, 0, 4.0, 6.0},  {1, false, 1, 0, 4.0, 5.0},
      {1, true, 1, 0, 5.0, 7.0},  {0, true, 1, 0, 7.0, 9.0},
  };
}

TEST(TimelineSvg, OneRectPerSpanWithXAndWidthProportionalToTime) {
  const auto spans = two_rank_spans();
  const std::string svg = render_timeline_svg(spans, 2, "1F1B", "ms");
  expect_standalone_svg(svg);
  const auto rects = elements(svg, "<rect class=\"span");
  ASSERT_EQ(rects.size(), spans.size());
  // x = origin + scale * start for one origin and scale shared by every span.
  // Scale from the two spans farthest apart, so the 0.01-pixel rounding barely moves it.
  const double scale =
      (attribute(rects[7], "x") + attribute(rects[7], "width") - attribute(rects[0], "x")) /
      (spans[7].end - spans[0].start);
  const double origin = attribute(rects[0], "x") - scale * spans[0].start;
  EXPECT_GT(scale, 50) << "nine time units across ~900 pixels";
  for (size_t i = 0; i < spans.size(); ++i) {
    EXPECT_NEAR(attribute(rects[i], "x"), origin + scale * spans[i].start, 0.02) << i;
    EXPECT_NEAR(attribute(rects[i], "width"), scale * (spans[i].end - spans[i].start), 0.02) << i;
  }
  // Rank 1 sits below rank 0, and the bubble before its first span stays blank.
  EXPECT_GT(attribute(rects[2], "y"), attribute(rects[0], "y"));
  EXPECT_NE(svg.find(">rank 1</text>"), std::string::npos);
}

TEST(TimelineSvg, ColoursPassesAndChunksAndLabelsWideSpansOnly) {
  const std::vector<TimelineSpan> spans = {
      {0, false, 3, 0, 0.0, 1.2},
      {0, false, 3, 1, 1.2, 2.4},
      {0, true, 3, 1, 2.4, 3.6},
      {0, false, 77, 0, 3.6, 3.601},  // too narrow for "77"
  };
  const std::string svg = render_timeline_svg(spans, 1, "interleaved", "ms");
  expect_standalone_svg(svg);
  const auto rects = elements(svg, "<rect class=\"span");
  ASSERT_EQ(rects.size(), 4u);
  EXPECT_NE(string_attribute(rects[0], "fill"), string_attribute(rects[1], "fill")) << "chunk";
  EXPECT_NE(string_attribute(rects[1], "fill"), string_attribute(rects[2], "fill")) << "pass";
  EXPECT_EQ(string_attribute(rects[0], "fill"), string_attribute(rects[3], "fill"));
  EXPECT_EQ(string_attribute(rects[2], "class"), "span backward");
  EXPECT_NE(svg.find("<title>F mb 3 chunk 1: 1.20-2.40 ms</title>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<title>B mb 3 chunk 1: 2.40-3.60 ms</title>"), std::string::npos);
  EXPECT_EQ(count_of(svg, ">3</text>"), 3u);
  EXPECT_EQ(svg.find(">77</text>"), std::string::npos);
  EXPECT_NE(svg.find("forward chunk 1"), std::string::npos) << "legend names each chunk";
}

TEST(TimelineSvg, WithoutChunksTooltipsLeaveThemOut) {
  const std::string svg = render_timeline_svg({{0, true, 2, 0, 0.5, 1.5}}, 1, "t", "us");
  EXPECT_NE(svg.find("<title>B mb 2: 0.50-1.50 us</title>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("chunk"), std::string::npos);
}

TEST(TimelineSvg, EscapesEveryTextAndIsDeterministic) {
  const std::string svg = render_timeline_svg(two_rank_spans(), 2, "a<b", "m&s", "sub'\"x>");
  expect_standalone_svg(svg);
  EXPECT_NE(svg.find(">a&lt;b</text>"), std::string::npos);
  EXPECT_NE(svg.find("time (m&amp;s)"), std::string::npos);
  EXPECT_NE(svg.find(" m&amp;s</title>"), std::string::npos);
  EXPECT_NE(svg.find("sub&apos;&quot;x&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(svg, render_timeline_svg(two_rank_spans(), 2, "a<b", "m&s", "sub'\"x>"));
}

TEST(TimelineSvg, NoSpansStillDrawsTheLanes) {
  const std::string svg = render_timeline_svg({}, 4, "empty", "ms");
  expect_standalone_svg(svg);
  EXPECT_NE(svg.find(">rank 3</text>"), std::string::npos);
  EXPECT_EQ(count_of(svg, "<rect class=\"span"), 0u);
}

TEST(TimelineSvg, RejectsBadSpansNamingThem) {
  const auto with = [](TimelineSpan span) {
    return [span] { render_timeline_svg({{0, false, 0, 0, 0, 1}, span}, 2, "sched", "ms"); };
  };
  expect_contains(error_message(with({2, false, 0, 0, 0, 1})), {"sched", "span 1", "lane 2"});
  expect_contains(error_message(with({-1, false, 0, 0, 0, 1})), {"span 1", "lane -1"});
  expect_contains(error_message(with({0, false, 0, 0, 2, 1})), {"span 1", "before its start"});
  expect_contains(error_message(with({0, false, 0, 0, kNaN, 1})), {"span 1", "finite"});
  expect_contains(error_message(with({0, false, 0, 0, 0, kInf})), {"span 1", "finite"});
  expect_contains(error_message(with({0, false, 0, -1, 0, 1})), {"span 1", "chunk -1"});
  expect_contains(error_message([] { render_timeline_svg({}, 0, "sched", "ms"); }), {"0 lanes"});
}

// ---- stacked bar chart ----

const std::vector<std::string> kMemorySegments = {"parameters", "gradients", "optimizer state",
                                                  "activations"};

TEST(StackedBarChartSvg, SegmentHeightsAreProportionalAndStackToTheTotal) {
  const std::vector<StackedBar> bars = {
      {"tp=8 pp=2 dp=4 zero=1 mbs=1 recompute=full", {2, 4, 8, 16}},
      {"tp=4 pp=4", {1, 0, 3, 6}},  // a zero segment draws nothing
  };
  const std::string svg = render_stacked_bar_chart_svg(bars, kMemorySegments, "memory", "GiB");
  expect_standalone_svg(svg);
  const auto rects = elements(svg, "<rect class=\"segment\"");
  ASSERT_EQ(rects.size(), 7u);
  std::map<double, double> stacked_height_by_x;  // bars told apart by their x
  for (const std::string& rect : rects)
    stacked_height_by_x[attribute(rect, "x")] += attribute(rect, "height");
  ASSERT_EQ(stacked_height_by_x.size(), 2u);
  // Pixels per GiB, from the taller bar (total 30); the shorter one must follow the same scale.
  const double scale = stacked_height_by_x.begin()->second / 30;
  EXPECT_NEAR(stacked_height_by_x.rbegin()->second, scale * 10, 0.03);
  // The same scale as the y axis: its ticks 0 and 30 lie 30 * scale apart.
  EXPECT_NEAR(
      attribute(element_with_text(svg, "0"), "y") - attribute(element_with_text(svg, "30"), "y"),
      scale * 30, 0.1);
  EXPECT_NEAR(attribute(rects[0], "y") + attribute(rects[0], "height") + 4,
              attribute(element_with_text(svg, "0"), "y"), 0.1)
      << "bars stand on the zero tick (labels sit 4 pixels below their line)";
  const std::vector<double> drawn_values = {2, 4, 8, 16, 1, 3, 6};
  for (size_t i = 0; i < rects.size(); ++i) {
    EXPECT_NEAR(attribute(rects[i], "height"), scale * drawn_values[i], 0.01) << i;
    // Each segment sits right on top of the one below it.
    if (i != 0 && i != 4) {
      EXPECT_NEAR(attribute(rects[i], "y") + attribute(rects[i], "height"),
                  attribute(rects[i - 1], "y"), 0.02)
          << i;
    }
  }
  EXPECT_NE(svg.find(">30.0</text>"), std::string::npos) << "total above the bar";
  EXPECT_NE(string_attribute(rects[0], "fill"), string_attribute(rects[1], "fill"));
  EXPECT_EQ(string_attribute(rects[0], "fill"), string_attribute(rects[4], "fill")) << "by segment";
}

TEST(StackedBarChartSvg, RoundTicksAndADashedLimitAboveTheBars) {
  const std::string svg = render_stacked_bar_chart_svg({{"a", {20, 41.3, 0, 0}}}, kMemorySegments,
                                                       "t", "GiB", 72.0, "usable HBM (72 GiB)");
  expect_standalone_svg(svg);
  for (const char* tick : {">0</text>", ">10</text>", ">40</text>", ">80</text>"})
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  const auto limit = elements(svg, "<line class=\"limit\"");
  ASSERT_EQ(limit.size(), 1u);
  EXPECT_NE(limit[0].find("stroke-dasharray"), std::string::npos);
  const auto rects = elements(svg, "<rect class=\"segment\"");
  ASSERT_EQ(rects.size(), 2u);
  // 72 on an axis to 80 is above the 61.3 bar: a smaller pixel y.
  const double bar_top = attribute(rects[1], "y"),
               bar_bottom = attribute(rects[0], "y") + attribute(rects[0], "height");
  EXPECT_LT(attribute(limit[0], "y1"), bar_top);
  EXPECT_NEAR((bar_bottom - attribute(limit[0], "y1")) / (bar_bottom - bar_top), 72 / 61.3, 1e-3);
  EXPECT_NE(svg.find(">usable HBM (72 GiB)</text>"), std::string::npos);
}

TEST(StackedBarChartSvg, LongLabelsWrapAtSpacesOrTurnWhenAWordCannotFit) {
  // Five top candidates, as `loom plan` draws them: each label gets a slot of ~130 pixels.
  const std::vector<StackedBar> candidates(
      5, StackedBar{"tp=8 pp=2 dp=4 zero=1 mbs=1 recompute=selective", {1, 1, 1, 1}});
  const std::string wrapped = render_stacked_bar_chart_svg(candidates, kMemorySegments, "t", "GiB");
  expect_standalone_svg(wrapped);
  EXPECT_EQ(count_of(wrapped, "<tspan"), 5u * 3u) << "three lines under each bar";
  EXPECT_NE(wrapped.find(">recompute=selective</tspan>"), std::string::npos);
  EXPECT_EQ(wrapped.find("rotate(45"), std::string::npos);
  const std::string turned = render_stacked_bar_chart_svg(
      {{std::string(60, 'x'), {1, 1, 1, 1}}, {"short", {1, 1, 1, 1}}}, kMemorySegments, "t", "GiB");
  expect_standalone_svg(turned);
  EXPECT_EQ(count_of(turned, "rotate(45"), 2u) << "all labels turn together";
}

TEST(StackedBarChartSvg, EscapesEveryTextAndIsDeterministic) {
  const auto render = [] {
    return render_stacked_bar_chart_svg({{"a<b", {1, 2, 3, 4}}}, {"p&q", "g'", "o\"s", "act>"},
                                        "T<", "Gi<B", 12.0, "HBM&");
  };
  const std::string svg = render();
  expect_standalone_svg(svg);
  for (const char* escaped :
       {"a&lt;b", "p&amp;q", "g&apos;", "o&quot;s", "act&gt;", "T&lt;", "Gi&lt;B", "HBM&amp;"})
    EXPECT_NE(svg.find(escaped), std::string::npos) << escaped;
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(svg, render());
}

TEST(StackedBarChartSvg, NoBarsStillMakesADocument) {
  expect_standalone_svg(render_stacked_bar_chart_svg({}, kMemorySegments, "none", "GiB"));
}

TEST(StackedBarChartSvg, RejectsBadValuesNamingTheBarAndSegment) {
  const auto with = [](std::vector<double> values) {
    return [values] {
      render_stacked_bar_chart_svg({{"good", {1, 1, 1, 1}}, {"bad bar", values}}, kMemorySegments,
                                   "mem", "GiB");
    };
  };
  expect_contains(error_message(with({1, 2, 3})), {"mem", "bad bar", "3 segment values", "(4)"});
  expect_contains(error_message(with({1, -2, 3, 4})), {"bad bar", "gradients", "-2"});
  expect_contains(error_message(with({1, 2, kNaN, 4})), {"bad bar", "optimizer state", "finite"});
  expect_contains(error_message(with({1, 2, 3, kInf})), {"bad bar", "activations", "finite"});
  expect_contains(
      error_message([] { render_stacked_bar_chart_svg({}, kMemorySegments, "mem", "GiB", kNaN); }),
      {"limit"});
}

// ---- write_svg_file ----

TEST(SvgSupport, WriteSvgFileReplacesTheFileAndLeavesNoTemporary) {
  TempDir dir("loom_test_svg");
  const std::string path = dir.file("chart.svg");
  write_text_file(path, "old contents, longer than the new ones");
  const std::string svg = render_timeline_svg(two_rank_spans(), 2, "t", "ms");
  write_svg_file(path, svg);
  EXPECT_EQ(read_text_file(path), svg);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
  expect_contains(error_message([&] { write_svg_file(dir.file("missing/chart.svg"), svg); }),
                  {dir.file("missing/chart.svg")});
}

TEST(SvgSupport, NumbersNeverPrintNegativeZero) {
  EXPECT_EQ(format_fixed(-0.0001, 2), "0.00");
  EXPECT_EQ(format_fixed(-0.0, 0), "0");
  EXPECT_EQ(format_fixed(-1.234, 1), "-1.2");
}

}  // namespace
}  // namespace loom::test
