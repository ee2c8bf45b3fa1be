#include "loom/obs/bar_chart_svg.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numbers>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/obs/svg_support.hpp"

namespace loom {
namespace {

// Geometry in SVG user units (pixels at 100% zoom). The plot widens with the bar count so
// that each bar keeps a slot wide enough for its wrapped label.
constexpr double kMarginLeft = 78, kMarginTop = 48, kMarginRight = 16, kMarginBottom = 12;
constexpr double kPlotHeight = 340, kMinPlotWidth = 560;
constexpr double kSlotWidth = 132;  // fits "recompute=selective" on one line of tick text
constexpr double kBarFraction = 0.6, kMaxBarWidth = 72;
constexpr double kLegendGap = 24;  // between the plot's right edge and the legend
constexpr int kTargetTicksY = 6;
// Average advance of an 11px (tick) and 12px (legend) sans-serif glyph: SVG cannot measure
// text, yet wrapping and the legend need widths.
constexpr double kTickCharWidth = 6.1, kLegendCharWidth = 6.8;
constexpr double kTickLineHeight = 13, kLegendRowHeight = 18, kLegendSwatch = 12;
constexpr size_t kMaxTickLines = 4;  // more wrapped lines than this read worse than rotation
constexpr double kRotatedTickDegrees = 45;
// matplotlib's "tab10" palette, in its order: ten colours told apart even in print.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr const char* kLimitColor = "#444444";

const char* segment_color(size_t segment) { return kPalette[segment % std::size(kPalette)]; }

void validate(const std::vector<StackedBar>& bars, const std::vector<std::string>& segment_labels,
              const std::string& title, std::optional<double> limit_line) {
  for (const StackedBar& bar : bars) {
    if (bar.values.size() != segment_labels.size())
      throw_error("stacked bar chart '", title, "' bar '", bar.label, "': ", bar.values.size(),
                  " segment values, expected one per segment label (", segment_labels.size(), ")");
    for (size_t i = 0; i < bar.values.size(); ++i)
      if (!std::isfinite(bar.values[i]) || bar.values[i] < 0)
        throw_error("stacked bar chart '", title, "' bar '", bar.label, "' segment '",
                    segment_labels[i], "': value ", bar.values[i],
                    ", expected a finite number >= 0");
  }
  if (limit_line && (!std::isfinite(*limit_line) || *limit_line < 0))
    throw_error("stacked bar chart '", title, "': limit line at ", *limit_line,
                ", expected a finite number >= 0");
}

double bar_total(const StackedBar& bar) {
  double total = 0;
  for (const double v : bar.values) total += v;
  return total;
}

// Greedy word wrap at spaces; a word longer than `max_chars` keeps a line of its own.
std::vector<std::string> wrap_words(const std::string& text, size_t max_chars) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    if (!lines.empty() && lines.back().size() + 1 + word.size() <= max_chars)
      lines.back() += ' ' + word;
    else
      lines.push_back(word);
  }
  return lines;
}

// Tick labels wrap under their bar when every one fits its slot in a few lines; otherwise all
// of them turn, so the chart reads one way.
struct TickLayout {
  bool rotated = false;
  std::vector<std::vector<std::string>> lines;  // per bar, when not rotated
  double height = 0;                            // below the plot's bottom edge
};

TickLayout layout_tick_labels(const std::vector<StackedBar>& bars, double slot_width) {
  const auto max_chars = static_cast<size_t>(std::max(1.0, (slot_width - 8) / kTickCharWidth));
  TickLayout layout;
  size_t most_lines = 1, longest_label = 0;
  for (const StackedBar& bar : bars) {
    layout.lines.push_back(wrap_words(bar.label, max_chars));
    for (const std::string& line : layout.lines.back())
      if (line.size() > max_chars) layout.rotated = true;
    most_lines = std::max(most_lines, layout.lines.back().size());
    longest_label = std::max(longest_label, bar.label.size());
  }
  if (most_lines > kMaxTickLines) layout.rotated = true;
  const double sine = std::sin(kRotatedTickDegrees * std::numbers::pi / 180);
  layout.height = layout.rotated ? 20 + kTickCharWidth * static_cast<double>(longest_label) * sine
                                 : 8 + kTickLineHeight * static_cast<double>(most_lines);
  return layout;
}

struct Plot {
  double left, right, top, bottom;
  NiceAxis y;
  double to_y(double value) const {
    return bottom - (value - y.lo) / (y.hi - y.lo) * (bottom - top);
  }
};

void draw_y_axis(std::ostringstream& svg, const Plot& plot, const std::string& y_label) {
  svg << "<g stroke=\"#e6e6e6\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n";
  for (const double v : nice_tick_values(plot.y))
    svg << "<line x1=\"" << format_fixed(plot.left, 1) << "\" y1=\""
        << format_fixed(plot.to_y(v), 1) << "\" x2=\"" << format_fixed(plot.right, 1) << "\" y2=\""
        << format_fixed(plot.to_y(v), 1) << "\"/>\n";
  svg << "</g>\n<g fill=\"#444444\">\n";
  for (const double v : nice_tick_values(plot.y))
    svg << "<text x=\"" << format_fixed(plot.left - 7, 1) << "\" y=\""
        << format_fixed(plot.to_y(v) + 4, 1) << "\" text-anchor=\"end\">"
        << nice_tick_label(v, plot.y) << "</text>\n";
  const std::string mid_y = format_fixed((plot.top + plot.bottom) / 2, 1);
  svg << "<text x=\"20\" y=\"" << mid_y << "\" transform=\"rotate(-90 20 " << mid_y
      << ")\" text-anchor=\"middle\" font-size=\"13\">" << xml_escape(y_label) << "</text>\n</g>\n";
}

void draw_bars(std::ostringstream& svg, const Plot& plot, const std::vector<StackedBar>& bars,
               const std::vector<std::string>& segment_labels, double slot_width) {
  const double bar_width = std::min(kMaxBarWidth, kBarFraction * slot_width);
  const int decimals = value_decimals(plot.y);
  for (size_t b = 0; b < bars.size(); ++b) {
    const StackedBar& bar = bars[b];
    const double center = plot.left + (static_cast<double>(b) + 0.5) * slot_width;
    const double total = bar_total(bar);
    svg << "<g>\n";
    double base = 0;
    for (size_t s = 0; s < bar.values.size(); ++s) {
      if (bar.values[s] == 0) continue;  // nothing to see, and a zero-height rect only clutters
      const double top = plot.to_y(base + bar.values[s]);
      svg << "<rect class=\"segment\" x=\"" << format_fixed(center - bar_width / 2, 2) << "\" y=\""
          << format_fixed(top, 2) << "\" width=\"" << format_fixed(bar_width, 2) << "\" height=\""
          << format_fixed(plot.to_y(base) - top, 2) << "\" fill=\"" << segment_color(s)
          << "\"><title>" << xml_escape(bar.label) << ": " << xml_escape(segment_labels[s]) << ' '
          << format_fixed(bar.values[s], decimals) << " of " << format_fixed(total, decimals)
          << "</title></rect>\n";
      base += bar.values[s];
    }
    svg << "<text x=\"" << format_fixed(center, 2) << "\" y=\""
        << format_fixed(plot.to_y(total) - 4, 2)
        << "\" text-anchor=\"middle\" font-size=\"11\" fill=\"#333333\">"
        << format_fixed(total, decimals) << "</text>\n</g>\n";
  }
  svg << "<rect x=\"" << format_fixed(plot.left, 1) << "\" y=\"" << format_fixed(plot.top, 1)
      << "\" width=\"" << format_fixed(plot.right - plot.left, 1) << "\" height=\""
      << format_fixed(plot.bottom - plot.top, 1)
      << "\" fill=\"none\" stroke=\"#999999\" shape-rendering=\"crispEdges\"/>\n";
}

void draw_tick_labels(std::ostringstream& svg, const Plot& plot,
                      const std::vector<StackedBar>& bars, const TickLayout& layout,
                      double slot_width) {
  svg << "<g fill=\"#444444\" font-size=\"11\">\n";
  for (size_t b = 0; b < bars.size(); ++b) {
    const std::string x = format_fixed(plot.left + (static_cast<double>(b) + 0.5) * slot_width, 2);
    if (layout.rotated) {
      const std::string y = format_fixed(plot.bottom + 14, 1);
      svg << "<text x=\"" << x << "\" y=\"" << y << "\" transform=\"rotate("
          << format_fixed(kRotatedTickDegrees, 0) << ' ' << x << ' ' << y
          << ")\" text-anchor=\"start\">" << xml_escape(bars[b].label) << "</text>\n";
      continue;
    }
    svg << "<text x=\"" << x << "\" y=\"" << format_fixed(plot.bottom + 15, 1)
        << "\" text-anchor=\"middle\">";
    for (size_t i = 0; i < layout.lines[b].size(); ++i)
      svg << "<tspan x=\"" << x << "\" dy=\"" << (i == 0 ? "0" : format_fixed(kTickLineHeight, 0))
          << "\">" << xml_escape(layout.lines[b][i]) << "</tspan>";
    svg << "</text>\n";
  }
  svg << "</g>\n";
}

double legend_width(const std::vector<std::string>& segment_labels,
                    const std::string& limit_label) {
  size_t longest = limit_label.size();
  for (const std::string& label : segment_labels) longest = std::max(longest, label.size());
  return 44 + kLegendCharWidth * static_cast<double>(longest);
}

// A column right of the plot, where no bar can hide it. The limit comes first, then the
// segments from the top of the stack down, in the order the eye meets them on a bar.
void draw_legend(std::ostringstream& svg, double left, double top,
                 const std::vector<std::string>& segment_labels, bool has_limit,
                 const std::string& limit_label) {
  svg << "<g fill=\"#333333\">\n";
  double row_center = top + kLegendRowHeight / 2;
  if (has_limit && !limit_label.empty()) {
    svg << "<line x1=\"" << format_fixed(left, 1) << "\" y1=\"" << format_fixed(row_center, 1)
        << "\" x2=\"" << format_fixed(left + 28, 1) << "\" y2=\"" << format_fixed(row_center, 1)
        << "\" stroke=\"" << kLimitColor << "\" stroke-width=\"1.6\" stroke-dasharray=\"6 4\"/>\n"
        << "<text x=\"" << format_fixed(left + 36, 1) << "\" y=\""
        << format_fixed(row_center + 4, 1) << "\">" << xml_escape(limit_label) << "</text>\n";
    row_center += kLegendRowHeight;
  }
  for (size_t s = segment_labels.size(); s-- > 0;) {
    svg << "<rect x=\"" << format_fixed(left + 8, 1) << "\" y=\""
        << format_fixed(row_center - kLegendSwatch / 2, 1) << "\" width=\""
        << format_fixed(kLegendSwatch, 0) << "\" height=\"" << format_fixed(kLegendSwatch, 0)
        << "\" fill=\"" << segment_color(s) << "\"/>\n<text x=\"" << format_fixed(left + 36, 1)
        << "\" y=\"" << format_fixed(row_center + 4, 1) << "\">" << xml_escape(segment_labels[s])
        << "</text>\n";
    row_center += kLegendRowHeight;
  }
  svg << "</g>\n";
}

}  // namespace

std::string render_stacked_bar_chart_svg(const std::vector<StackedBar>& bars,
                                         const std::vector<std::string>& segment_labels,
                                         const std::string& title, const std::string& y_label,
                                         std::optional<double> limit_line,
                                         std::string limit_label) {
  validate(bars, segment_labels, title, limit_line);
  double data_max = limit_line.value_or(0);
  for (const StackedBar& bar : bars) data_max = std::max(data_max, bar_total(bar));
  // Bars grow from zero; with nothing above zero the axis still needs a span.
  const NiceAxis y_axis = make_nice_axis(0, data_max > 0 ? data_max : 1, kTargetTicksY);

  const double plot_width = std::max(kMinPlotWidth, kSlotWidth * static_cast<double>(bars.size()));
  const double slot_width = bars.empty() ? 0 : plot_width / static_cast<double>(bars.size());
  const Plot plot{kMarginLeft, kMarginLeft + plot_width, kMarginTop, kMarginTop + kPlotHeight,
                  y_axis};
  const TickLayout ticks = layout_tick_labels(bars, slot_width);

  double width = plot.right + kLegendGap + legend_width(segment_labels, limit_label) + kMarginRight;
  if (ticks.rotated && !bars.empty()) {  // the last label runs down and right past its slot
    const double cosine = std::cos(kRotatedTickDegrees * std::numbers::pi / 180);
    const double last_center = plot.right - slot_width / 2;
    width = std::max(width,
                     last_center +
                         kTickCharWidth * cosine * static_cast<double>(bars.back().label.size()) +
                         kMarginRight);
  }
  width = std::ceil(width);
  const double height = std::ceil(plot.bottom + ticks.height + kMarginBottom);

  std::ostringstream svg;
  svg << svg_document_start(width, height) << "<text x=\""
      << format_fixed((plot.left + plot.right) / 2, 1)
      << "\" y=\"30\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\" "
         "fill=\"#222222\">"
      << xml_escape(title) << "</text>\n";
  draw_y_axis(svg, plot, y_label);
  draw_bars(svg, plot, bars, segment_labels, slot_width);
  draw_tick_labels(svg, plot, bars, ticks, slot_width);
  if (limit_line) {
    const std::string y = format_fixed(plot.to_y(*limit_line), 2);
    svg << "<line class=\"limit\" x1=\"" << format_fixed(plot.left, 1) << "\" y1=\"" << y
        << "\" x2=\"" << format_fixed(plot.right, 1) << "\" y2=\"" << y << "\" stroke=\""
        << kLimitColor << "\" stroke-width=\"1.6\" stroke-dasharray=\"6 4\"/>\n";
  }
  draw_legend(svg, plot.right + kLegendGap, plot.top, segment_labels, limit_line.has_value(),
              limit_label);
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace loom
