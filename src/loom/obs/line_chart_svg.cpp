#include "loom/obs/line_chart_svg.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/obs/svg_support.hpp"

namespace loom {
namespace {

constexpr int kTargetTicksX = 8, kTargetTicksY = 6;
// Average advance of a 12px sans-serif glyph: SVG cannot measure text, yet the legend box
// needs a width.
constexpr double kLegendCharWidth = 6.8;
constexpr double kLegendRowHeight = 18;
constexpr const char* kReferenceColor = "#666666";
constexpr const char* kReferenceDash = "6 4";
constexpr const char* kMarkDash = "3 3";
constexpr const char* kMarkLegendColor = "#888888";

struct Point {
  double x, y;
};

// Data-to-pixel mapping of the plot area.
struct Frame {
  NiceAxis x, y;
  double left, right, top, bottom;  // the plot area's edges in pixels
  Point to_pixel(double data_x, double data_y) const {
    return {left + (data_x - x.lo) / (x.hi - x.lo) * (right - left),
            bottom - (data_y - y.lo) / (y.hi - y.lo) * (bottom - top)};
  }
};

// The pixels to draw for a series. A long series with sorted x keeps only the first, last,
// lowest and highest point of each pixel column (M4, Jugel et al., VLDB 2014): the same picture
// as drawing every point, at a fraction of the file size for a 100k-step run.
std::vector<Point> series_pixels(const Series& series, const Frame& frame) {
  std::vector<Point> pixels;
  for (size_t i = 0; i < series.x.size(); ++i)
    if (std::isfinite(series.x[i]) && std::isfinite(series.y[i]))
      pixels.push_back(frame.to_pixel(series.x[i], series.y[i]));
  const bool sorted = std::is_sorted(pixels.begin(), pixels.end(),
                                     [](const Point& a, const Point& b) { return a.x < b.x; });
  if (!sorted || pixels.size() <= 4 * static_cast<size_t>(frame.right - frame.left)) return pixels;
  std::vector<Point> kept;
  for (size_t begin = 0; begin < pixels.size();) {
    size_t end = begin, lowest = begin, highest = begin;
    while (end < pixels.size() && std::floor(pixels[end].x) == std::floor(pixels[begin].x)) {
      if (pixels[end].y > pixels[lowest].y) lowest = end;  // pixel y grows downwards
      if (pixels[end].y < pixels[highest].y) highest = end;
      ++end;
    }
    std::vector<size_t> picks = {begin, lowest, highest, end - 1};
    std::sort(picks.begin(), picks.end());
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    for (const size_t i : picks) kept.push_back(pixels[i]);
    begin = end;
  }
  return kept;
}

void draw_axes(std::ostringstream& svg, const Frame& frame, const LineChartOptions& options) {
  const std::string top = format_fixed(frame.top, 1), bottom = format_fixed(frame.bottom, 1);
  const std::string left = format_fixed(frame.left, 1), right = format_fixed(frame.right, 1);
  svg << "<g stroke=\"#e6e6e6\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n";
  for (const double v : nice_tick_values(frame.x)) {
    const std::string px = format_fixed(frame.to_pixel(v, frame.y.lo).x, 1);
    svg << "<line x1=\"" << px << "\" y1=\"" << top << "\" x2=\"" << px << "\" y2=\"" << bottom
        << "\"/>\n";
  }
  for (const double v : nice_tick_values(frame.y)) {
    const std::string py = format_fixed(frame.to_pixel(frame.x.lo, v).y, 1);
    svg << "<line x1=\"" << left << "\" y1=\"" << py << "\" x2=\"" << right << "\" y2=\"" << py
        << "\"/>\n";
  }
  svg << "</g>\n<rect x=\"" << left << "\" y=\"" << top << "\" width=\""
      << format_fixed(frame.right - frame.left, 1) << "\" height=\""
      << format_fixed(frame.bottom - frame.top, 1)
      << "\" fill=\"none\" stroke=\"#999999\" shape-rendering=\"crispEdges\"/>\n";
  svg << "<g fill=\"#444444\">\n";
  for (const double v : nice_tick_values(frame.x))
    svg << "<text x=\"" << format_fixed(frame.to_pixel(v, 0).x, 1) << "\" y=\""
        << format_fixed(frame.bottom + 17, 1) << "\" text-anchor=\"middle\">"
        << nice_tick_label(v, frame.x) << "</text>\n";
  for (const double v : nice_tick_values(frame.y))
    svg << "<text x=\"" << format_fixed(frame.left - 7, 1) << "\" y=\""
        << format_fixed(frame.to_pixel(0, v).y + 4, 1) << "\" text-anchor=\"end\">"
        << nice_tick_label(v, frame.y) << "</text>\n";
  svg << "<text x=\"" << format_fixed((frame.left + frame.right) / 2, 1) << "\" y=\""
      << format_fixed(options.height - 14, 1) << "\" text-anchor=\"middle\" font-size=\"13\">"
      << xml_escape(options.x_label) << "</text>\n";
  const std::string mid_y = format_fixed((frame.top + frame.bottom) / 2, 1);
  svg << "<text x=\"20\" y=\"" << mid_y << "\" transform=\"rotate(-90 20 " << mid_y
      << ")\" text-anchor=\"middle\" font-size=\"13\">" << xml_escape(options.y_label)
      << "</text>\n</g>\n";
}

void draw_series(std::ostringstream& svg, const std::vector<Point>& pixels, const Series& series,
                 const std::string& color) {
  if (pixels.empty()) return;
  svg << "<g>\n<path fill=\"none\" stroke=\"" << xml_escape(color) << "\" stroke-width=\"1.3\"";
  if (!series.dash.empty()) svg << " stroke-dasharray=\"" << xml_escape(series.dash) << '"';
  svg << " stroke-linejoin=\"round\" stroke-linecap=\"round\" d=\"";
  for (size_t i = 0; i < pixels.size(); ++i)
    svg << (i == 0 ? "M" : " L") << format_fixed(pixels[i].x, 1) << ' '
        << format_fixed(pixels[i].y, 1);
  svg << '"';
  if (series.tooltip.empty())
    svg << "/>\n";
  else
    svg << "><title>" << xml_escape(series.tooltip) << "</title></path>\n";
  if (series.markers)
    for (const Point& p : pixels)
      svg << "<circle cx=\"" << format_fixed(p.x, 1) << "\" cy=\"" << format_fixed(p.y, 1)
          << "\" r=\"3.2\" fill=\"" << xml_escape(color)
          << "\" stroke=\"white\" stroke-width=\"1\"/>\n";
  svg << "</g>\n";
}

void draw_marks(std::ostringstream& svg, const Frame& frame,
                const std::vector<VerticalMark>& marks) {
  if (marks.empty()) return;
  svg << "<g class=\"marks\" stroke-width=\"1.2\" stroke-dasharray=\"" << kMarkDash << "\">\n";
  for (const VerticalMark& mark : marks) {
    if (!std::isfinite(mark.x)) continue;
    const std::string px = format_fixed(frame.to_pixel(mark.x, frame.y.lo).x, 1);
    svg << "<line x1=\"" << px << "\" y1=\"" << format_fixed(frame.top, 1) << "\" x2=\"" << px
        << "\" y2=\"" << format_fixed(frame.bottom, 1) << "\" stroke=\""
        << xml_escape(mark.color.empty() ? kMarkLegendColor : mark.color) << '"';
    if (mark.tooltip.empty())
      svg << "/>\n";
    else
      svg << "><title>" << xml_escape(mark.tooltip) << "</title></line>\n";
  }
  svg << "</g>\n";
}

// Top right of the plot area, where a falling loss curve leaves room.
void draw_legend(std::ostringstream& svg, const Frame& frame, const std::vector<LegendKey>& keys) {
  if (keys.empty()) return;
  size_t longest = 0;
  for (const auto& key : keys) longest = std::max(longest, key.label.size());
  const double width = 44 + kLegendCharWidth * static_cast<double>(longest);
  const double height = 8 + kLegendRowHeight * static_cast<double>(keys.size());
  const double left = frame.right - width - 10, top = frame.top + 10;
  svg << "<g class=\"legend\">\n<rect x=\"" << format_fixed(left, 1) << "\" y=\""
      << format_fixed(top, 1) << "\" width=\"" << format_fixed(width, 1) << "\" height=\""
      << format_fixed(height, 1)
      << "\" rx=\"4\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#cccccc\"/>\n";
  for (size_t i = 0; i < keys.size(); ++i) {
    const LegendKey& key = keys[i];
    const double row_y = top + 4 + kLegendRowHeight * (static_cast<double>(i) + 0.5);
    const std::string y = format_fixed(row_y, 1);
    svg << "<line x1=\"" << format_fixed(left + 8, 1) << "\" y1=\"" << y << "\" x2=\""
        << format_fixed(left + 32, 1) << "\" y2=\"" << y << "\" stroke=\"" << xml_escape(key.color)
        << "\" stroke-width=\"1.6\"";
    if (!key.dash.empty()) svg << " stroke-dasharray=\"" << xml_escape(key.dash) << '"';
    svg << "/>\n";
    if (key.markers)
      svg << "<circle cx=\"" << format_fixed(left + 20, 1) << "\" cy=\"" << y
          << "\" r=\"3.2\" fill=\"" << xml_escape(key.color)
          << "\" stroke=\"white\" stroke-width=\"1\"/>\n";
    svg << "<text x=\"" << format_fixed(left + 38, 1) << "\" y=\"" << format_fixed(row_y + 4, 1)
        << "\" fill=\"#333333\">" << xml_escape(key.label) << "</text>\n";
  }
  svg << "</g>\n";
}

}  // namespace

std::string render_line_chart_svg(const std::vector<Series>& series,
                                  const LineChartOptions& options) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double x_min = inf, x_max = -inf, y_min = inf, y_max = -inf;
  for (const Series& s : series) {
    if (s.x.size() != s.y.size())
      throw_error("line chart '", options.title, "' series '", s.label, "': ", s.x.size(),
                  " x values but ", s.y.size(), " y values, expected as many of each");
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_min = std::min(x_min, s.x[i]), x_max = std::max(x_max, s.x[i]);
      y_min = std::min(y_min, s.y[i]), y_max = std::max(y_max, s.y[i]);
    }
  }
  for (const VerticalMark& mark : options.marks)
    if (std::isfinite(mark.x)) x_min = std::min(x_min, mark.x), x_max = std::max(x_max, mark.x);
  const bool has_reference = options.reference_line_y && std::isfinite(*options.reference_line_y);
  if (has_reference) {
    y_min = std::min(y_min, *options.reference_line_y);
    y_max = std::max(y_max, *options.reference_line_y);
  }
  const Frame frame{make_nice_axis(x_min, x_max, kTargetTicksX),
                    make_nice_axis(y_min, y_max, kTargetTicksY),
                    kLineChartMarginLeft,
                    options.width - kLineChartMarginRight,
                    kLineChartMarginTop,
                    options.height - kLineChartMarginBottom};

  std::ostringstream svg;
  svg << svg_document_start(options.width, options.height, options.standalone) << "<text x=\""
      << format_fixed((frame.left + frame.right) / 2, 1)
      << "\" y=\"30\" text-anchor=\"middle\" font-size=\"16\""
      << " font-weight=\"bold\" fill=\"#222222\">" << xml_escape(options.title) << "</text>\n";
  draw_axes(svg, frame, options);
  draw_marks(svg, frame, options.marks);

  std::vector<LegendKey> legend;
  if (has_reference) {
    const std::string py = format_fixed(frame.to_pixel(frame.x.lo, *options.reference_line_y).y, 1);
    svg << "<line x1=\"" << format_fixed(frame.left, 1) << "\" y1=\"" << py << "\" x2=\""
        << format_fixed(frame.right, 1) << "\" y2=\"" << py << "\" stroke=\"" << kReferenceColor
        << "\" stroke-width=\"1.4\" stroke-dasharray=\"" << kReferenceDash << "\"/>\n";
  }
  size_t palette_index = 0;
  for (const Series& s : series) {
    const std::string color =
        s.color.empty() ? kChartPalette[palette_index++ % std::size(kChartPalette)] : s.color;
    draw_series(svg, series_pixels(s, frame), s, color);
    if (!s.label.empty()) legend.push_back({s.label, color, s.dash, s.markers});
  }
  legend.insert(legend.end(), options.legend.begin(), options.legend.end());
  if (!options.marks.empty() && !options.marks_label.empty())
    legend.push_back({options.marks_label, kMarkLegendColor, kMarkDash, false});
  // The reference goes last in the legend: the curves are what the reader came for.
  if (has_reference && !options.reference_label.empty())
    legend.push_back({options.reference_label, kReferenceColor, kReferenceDash, false});
  draw_legend(svg, frame, legend);
  svg << "</svg>\n";
  return svg.str();
}

std::string render_line_chart_svg(const std::vector<Series>& series, const std::string& title,
                                  const std::string& x_label, const std::string& y_label,
                                  std::optional<double> reference_line_y,
                                  std::string reference_label) {
  LineChartOptions options;
  options.title = title;
  options.x_label = x_label;
  options.y_label = y_label;
  options.reference_line_y = reference_line_y;
  options.reference_label = std::move(reference_label);
  return render_line_chart_svg(series, options);
}

}  // namespace loom
