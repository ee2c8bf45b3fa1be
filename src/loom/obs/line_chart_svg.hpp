#pragma once
// Line charts as SVG: round-numbered axes, gridlines, a legend, optional markers, dashes and
// vertical marks. The loss plot of a training run (loss_plot) and every chart of `loom report`
// (run_report_html) are drawn by this one function.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

struct Series {
  std::string label;         // legend text; empty leaves the series out of the legend
  std::string color;         // any SVG colour; empty takes the next one of a default palette
  std::vector<double> x, y;  // same length; points with a NaN or infinite coordinate are skipped
  bool markers = false;      // also draw a dot at every point (sparse series such as val loss)
  std::string dash;          // SVG stroke-dasharray ("6 4"); empty draws a solid line
  std::string tooltip;       // a <title> on the line, shown on hover; empty: none

  Series() = default;
  Series(std::string label, std::string color, std::vector<double> x, std::vector<double> y,
         bool markers = false, std::string dash = "", std::string tooltip = "")
      : label(std::move(label)),
        color(std::move(color)),
        x(std::move(x)),
        y(std::move(y)),
        markers(markers),
        dash(std::move(dash)),
        tooltip(std::move(tooltip)) {}
};

// A legend row that belongs to no single series: "run A" in its colour over several series, or
// "parameters" as a dash pattern shared by every run's line of that category.
struct LegendKey {
  std::string label, color, dash;
  bool markers = false;
};

// A dashed vertical line across the plot at x (a skipped step), with a hover tooltip.
struct VerticalMark {
  double x = 0;
  std::string color;
  std::string tooltip;
};

// Plot-area margins in SVG user units; the plot spans [left, width - right] x [top, height -
// bottom], and data maps linearly onto it: x.lo to the left edge, y.lo to the bottom edge.
inline constexpr double kLineChartMarginLeft = 78, kLineChartMarginRight = 24;
inline constexpr double kLineChartMarginTop = 48, kLineChartMarginBottom = 58;

struct LineChartOptions {
  std::string title, x_label, y_label;
  double width = 800, height = 500;
  // A horizontal dashed line (a baseline) included in the y range, named in the legend.
  std::optional<double> reference_line_y;
  std::string reference_label;
  std::vector<VerticalMark> marks;  // included in the x range
  std::string marks_label;          // legend row for the marks; empty: none
  std::vector<LegendKey> legend;    // rows after the labelled series' own
  // Standalone files need xmlns; an <svg> inside an HTML page does without it.
  bool standalone = true;
};

// Round-numbered axis ticks over all finite points (and the reference line and marks),
// gridlines, and a legend at the top right; every text is XML-escaped and the same input gives
// the same bytes. Long sorted series are thinned to the pixel columns (M4).
// Throws loom::Error if a series has x and y of different lengths.
std::string render_line_chart_svg(const std::vector<Series>& series,
                                  const LineChartOptions& options);

// The 800x500 chart with a title, axis labels and an optional dashed reference line.
std::string render_line_chart_svg(const std::vector<Series>& series, const std::string& title,
                                  const std::string& x_label, const std::string& y_label,
                                  std::optional<double> reference_line_y = {},
                                  std::string reference_label = "");

// matplotlib's "tab10" palette: distinguishable, and familiar from every other loss plot.
// Series without a colour take these in turn; `loom report` gives run i colour i.
inline constexpr const char* kChartPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                                "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                "#bcbd22", "#17becf"};

}  // namespace loom
