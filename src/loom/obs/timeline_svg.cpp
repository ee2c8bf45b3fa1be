#include "loom/obs/timeline_svg.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/obs/svg_support.hpp"

namespace loom {
namespace {

// Geometry in SVG user units (pixels at 100% zoom).
constexpr double kWidth = 1000, kMarginLeft = 70, kMarginRight = 24;
constexpr double kPlotLeft = kMarginLeft, kPlotRight = kWidth - kMarginRight;
constexpr double kTitleY = 30, kSubtitleY = 48;
constexpr double kLaneHeight = 26, kLaneGap = 6;
constexpr int kTargetTicksX = 10;
// Average advance of a 10px (in-bar) and 12px (legend) sans-serif glyph: SVG cannot measure
// text, yet a label must only go where it fits.
constexpr double kBarCharWidth = 6.0, kLegendCharWidth = 6.8;
constexpr double kLegendRowHeight = 18, kLegendSwatch = 12;

// Forward blue, backward orange (matplotlib "tab10"); later chunks of an interleaved schedule
// fade towards white, at most this far, so the last chunk still reads as its pass.
struct Rgb {
  int r, g, b;
};
constexpr Rgb kForwardColor = {0x1f, 0x77, 0xb4}, kBackwardColor = {0xff, 0x7f, 0x0e},
              kWeightColor = {0x2c, 0xa0, 0x2c};
constexpr double kMaxChunkFade = 0.55;

Rgb span_color(bool backward, int64_t chunk, int64_t chunks, bool weight = false) {
  const Rgb base = weight ? kWeightColor : backward ? kBackwardColor : kForwardColor;
  const double fade =
      chunks > 1 ? kMaxChunkFade * static_cast<double>(chunk) / static_cast<double>(chunks - 1) : 0;
  const auto mix = [fade](int channel) {
    return static_cast<int>(std::lround(channel + (255 - channel) * fade));
  };
  return {mix(base.r), mix(base.g), mix(base.b)};
}

std::string hex(const Rgb& color) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, "#%02x%02x%02x", color.r, color.g, color.b);
  return buffer;
}

// Dark text on a light bar, white on a dark one (relative luminance, ITU-R BT.709 weights).
const char* text_color_on(const Rgb& color) {
  const double luminance = (0.2126 * color.r + 0.7152 * color.g + 0.0722 * color.b) / 255;
  return luminance > 0.6 ? "#222222" : "#ffffff";
}

void validate(const std::vector<TimelineSpan>& spans, int64_t lanes, const std::string& title) {
  if (lanes < 1) throw_error("timeline '", title, "': ", lanes, " lanes, expected at least 1");
  for (size_t i = 0; i < spans.size(); ++i) {
    const TimelineSpan& s = spans[i];
    if (s.lane < 0 || s.lane >= lanes)
      throw_error("timeline '", title, "' span ", i, ": lane ", s.lane, ", expected 0 to ",
                  lanes - 1);
    if (s.chunk < 0)
      throw_error("timeline '", title, "' span ", i, ": chunk ", s.chunk, ", expected >= 0");
    if (!std::isfinite(s.start) || !std::isfinite(s.end))
      throw_error("timeline '", title, "' span ", i, ": start ", s.start, " end ", s.end,
                  ", expected finite times");
    if (s.end < s.start)
      throw_error("timeline '", title, "' span ", i, ": ends at ", s.end, " before its start ",
                  s.start);
  }
}

struct Plot {
  double top, bottom;
  NiceAxis x;
  double to_x(double time) const {
    return kPlotLeft + (time - x.lo) / (x.hi - x.lo) * (kPlotRight - kPlotLeft);
  }
  double lane_top(int64_t lane) const {
    return top + static_cast<double>(lane) * (kLaneHeight + kLaneGap) + kLaneGap / 2;
  }
};

void draw_axes(std::ostringstream& svg, const Plot& plot, int64_t lanes,
               const std::string& time_unit_label) {
  svg << "<g stroke=\"#e6e6e6\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n";
  for (const double t : nice_tick_values(plot.x))
    svg << "<line x1=\"" << format_fixed(plot.to_x(t), 1) << "\" y1=\"" << format_fixed(plot.top, 1)
        << "\" x2=\"" << format_fixed(plot.to_x(t), 1) << "\" y2=\"" << format_fixed(plot.bottom, 1)
        << "\"/>\n";
  svg << "</g>\n<rect x=\"" << format_fixed(kPlotLeft, 1) << "\" y=\"" << format_fixed(plot.top, 1)
      << "\" width=\"" << format_fixed(kPlotRight - kPlotLeft, 1) << "\" height=\""
      << format_fixed(plot.bottom - plot.top, 1)
      << "\" fill=\"none\" stroke=\"#999999\" shape-rendering=\"crispEdges\"/>\n";
  svg << "<g fill=\"#444444\">\n";
  for (int64_t lane = 0; lane < lanes; ++lane)
    svg << "<text x=\"" << format_fixed(kPlotLeft - 8, 1) << "\" y=\""
        << format_fixed(plot.lane_top(lane) + kLaneHeight / 2 + 4, 1)
        << "\" text-anchor=\"end\">rank " << lane << "</text>\n";
  for (const double t : nice_tick_values(plot.x))
    svg << "<text x=\"" << format_fixed(plot.to_x(t), 1) << "\" y=\""
        << format_fixed(plot.bottom + 17, 1) << "\" text-anchor=\"middle\">"
        << nice_tick_label(t, plot.x) << "</text>\n";
  const std::string axis_label =
      time_unit_label.empty() ? "time" : "time (" + time_unit_label + ")";
  svg << "<text x=\"" << format_fixed((kPlotLeft + kPlotRight) / 2, 1) << "\" y=\""
      << format_fixed(plot.bottom + 36, 1) << "\" text-anchor=\"middle\" font-size=\"13\">"
      << xml_escape(axis_label) << "</text>\n</g>\n";
}

void draw_spans(std::ostringstream& svg, const Plot& plot, const std::vector<TimelineSpan>& spans,
                int64_t chunks, const std::string& time_unit_label) {
  const int decimals = value_decimals(plot.x);
  const std::string unit = time_unit_label.empty() ? "" : " " + xml_escape(time_unit_label);
  // A thin white outline keeps back-to-back spans of one rank apart.
  svg << "<g stroke=\"white\" stroke-width=\"0.5\">\n";
  for (const TimelineSpan& s : spans) {
    const double x = plot.to_x(s.start), width = plot.to_x(s.end) - x;
    const double top = plot.lane_top(s.lane);
    const Rgb color = span_color(s.backward, s.chunk, chunks, s.weight);
    svg << "<rect class=\"span " << (s.weight ? "weight" : s.backward ? "backward" : "forward") << "\" x=\""
        << format_fixed(x, 2) << "\" y=\"" << format_fixed(top, 1) << "\" width=\""
        << format_fixed(width, 2) << "\" height=\"" << format_fixed(kLaneHeight, 1) << "\" fill=\""
        << hex(color) << "\"><title>" << (s.weight ? 'W' : s.backward ? 'B' : 'F') << " mb " << s.micro_batch;
    if (chunks > 1) svg << " chunk " << s.chunk;
    svg << ": " << format_fixed(s.start, decimals) << '-' << format_fixed(s.end, decimals) << unit
        << "</title></rect>\n";
    const std::string number = std::to_string(s.micro_batch);
    if (width >= kBarCharWidth * static_cast<double>(number.size()) + 4)
      svg << "<text x=\"" << format_fixed(x + width / 2, 2) << "\" y=\""
          << format_fixed(top + kLaneHeight / 2 + 3.5, 1)
          << "\" text-anchor=\"middle\" font-size=\"10\" stroke=\"none\" fill=\""
          << text_color_on(color) << "\">" << number << "</text>\n";
  }
  svg << "</g>\n";
}

struct LegendEntry {
  std::string label;
  Rgb color;
};

// Both passes (and W when the schedule splits backwards, whose B is then "input gradient"),
// and each chunk of them when the schedule is interleaved.
std::vector<LegendEntry> legend_entries(int64_t chunks, bool weights) {
  std::vector<LegendEntry> entries;
  for (const int kind : {0, 1, 2}) {
    if (kind == 2 && !weights) continue;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      std::string label = kind == 0 ? "forward" : kind == 2 ? "weight gradient (W)"
                                              : weights ? "input gradient (B)" : "backward";
      if (chunks > 1) label += " chunk " + std::to_string(chunk);
      entries.push_back({label, span_color(kind != 0, chunk, chunks, kind == 2)});
    }
  }
  return entries;
}

double entry_width(const LegendEntry& entry) {
  return kLegendSwatch + 6 + kLegendCharWidth * static_cast<double>(entry.label.size()) + 18;
}

// Rows under the time axis, wrapping before the plot's right edge; returns how many rows.
int draw_legend(std::ostringstream& svg, const std::vector<LegendEntry>& entries, double top) {
  svg << "<g fill=\"#333333\">\n";
  double x = kPlotLeft, row_center = top + kLegendRowHeight / 2;
  int rows = 1;
  for (const LegendEntry& entry : entries) {
    if (x > kPlotLeft && x + entry_width(entry) > kPlotRight) {
      x = kPlotLeft, row_center += kLegendRowHeight, ++rows;
    }
    svg << "<rect x=\"" << format_fixed(x, 1) << "\" y=\""
        << format_fixed(row_center - kLegendSwatch / 2, 1) << "\" width=\""
        << format_fixed(kLegendSwatch, 0) << "\" height=\"" << format_fixed(kLegendSwatch, 0)
        << "\" fill=\"" << hex(entry.color) << "\"/>\n<text x=\""
        << format_fixed(x + kLegendSwatch + 6, 1) << "\" y=\"" << format_fixed(row_center + 4, 1)
        << "\">" << xml_escape(entry.label) << "</text>\n";
    x += entry_width(entry);
  }
  svg << "</g>\n";
  return rows;
}

}  // namespace

std::string render_timeline_svg(const std::vector<TimelineSpan>& spans, int64_t lanes,
                                const std::string& title, const std::string& time_unit_label,
                                const std::string& subtitle) {
  validate(spans, lanes, title);
  constexpr double inf = std::numeric_limits<double>::infinity();
  double first = inf, last = -inf;
  int64_t chunks = 1;
  bool weights = false;
  for (const TimelineSpan& s : spans) {
    first = std::min(first, s.start), last = std::max(last, s.end);
    chunks = std::max(chunks, s.chunk + 1);
    weights = weights || s.weight;
  }
  const double plot_top = subtitle.empty() ? 44 : 60;
  const Plot plot{plot_top, plot_top + static_cast<double>(lanes) * (kLaneHeight + kLaneGap),
                  make_nice_axis(first, last, kTargetTicksX)};

  // The legend's rows decide the height, and the header comes first: draw the body aside.
  std::ostringstream body;
  draw_axes(body, plot, lanes, time_unit_label);
  draw_spans(body, plot, spans, chunks, time_unit_label);
  const int legend_rows = draw_legend(body, legend_entries(chunks, weights), plot.bottom + 48);
  const double height = std::ceil(plot.bottom + 48 + legend_rows * kLegendRowHeight + 10);

  std::ostringstream svg;
  const std::string center_x = format_fixed((kPlotLeft + kPlotRight) / 2, 1);
  svg << svg_document_start(kWidth, height) << "<text x=\"" << center_x << "\" y=\""
      << format_fixed(kTitleY, 0)
      << "\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\" fill=\"#222222\">"
      << xml_escape(title) << "</text>\n";
  if (!subtitle.empty())
    svg << "<text x=\"" << center_x << "\" y=\"" << format_fixed(kSubtitleY, 0)
        << "\" text-anchor=\"middle\" fill=\"#555555\">" << xml_escape(subtitle) << "</text>\n";
  svg << body.str() << "</svg>\n";
  return svg.str();
}

}  // namespace loom
