#include "loom/obs/loss_plot.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/obs/svg_support.hpp"

namespace loom {
namespace {

// Canvas and plot-area geometry, in SVG user units (pixels at 100% zoom).
constexpr double kWidth = 800, kHeight = 500;
constexpr double kMarginLeft = 78, kMarginRight = 24, kMarginTop = 48, kMarginBottom = 58;
constexpr double kPlotLeft = kMarginLeft, kPlotRight = kWidth - kMarginRight;
constexpr double kPlotTop = kMarginTop, kPlotBottom = kHeight - kMarginBottom;
constexpr int kTargetTicksX = 8, kTargetTicksY = 6;
// Average advance of a 12px sans-serif glyph: SVG cannot measure text, yet the legend box
// needs a width.
constexpr double kLegendCharWidth = 6.8;
constexpr double kLegendRowHeight = 18;
// matplotlib's "tab10" palette: distinguishable, and familiar from every other loss plot.
constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c",
                                    "#ff7f0e", "#9467bd", "#8c564b"};
constexpr const char* kReferenceColor = "#666666";

struct Point {
  double x, y;
};

// Data-to-pixel mapping of the plot area.
struct Frame {
  NiceAxis x, y;
  Point to_pixel(double data_x, double data_y) const {
    return {kPlotLeft + (data_x - x.lo) / (x.hi - x.lo) * (kPlotRight - kPlotLeft),
            kPlotBottom - (data_y - y.lo) / (y.hi - y.lo) * (kPlotBottom - kPlotTop)};
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
  if (!sorted || pixels.size() <= 4 * static_cast<size_t>(kPlotRight - kPlotLeft)) return pixels;
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

void draw_axes(std::ostringstream& svg, const Frame& frame, const std::string& x_label,
               const std::string& y_label) {
  svg << "<g stroke=\"#e6e6e6\" stroke-width=\"1\" shape-rendering=\"crispEdges\">\n";
  for (const double v : nice_tick_values(frame.x)) {
    const double px = frame.to_pixel(v, frame.y.lo).x;
    svg << "<line x1=\"" << format_fixed(px, 1) << "\" y1=\"" << kPlotTop << "\" x2=\""
        << format_fixed(px, 1) << "\" y2=\"" << kPlotBottom << "\"/>\n";
  }
  for (const double v : nice_tick_values(frame.y)) {
    const double py = frame.to_pixel(frame.x.lo, v).y;
    svg << "<line x1=\"" << kPlotLeft << "\" y1=\"" << format_fixed(py, 1) << "\" x2=\""
        << kPlotRight << "\" y2=\"" << format_fixed(py, 1) << "\"/>\n";
  }
  svg << "</g>\n<rect x=\"" << kPlotLeft << "\" y=\"" << kPlotTop << "\" width=\""
      << kPlotRight - kPlotLeft << "\" height=\"" << kPlotBottom - kPlotTop
      << "\" fill=\"none\" stroke=\"#999999\" shape-rendering=\"crispEdges\"/>\n";
  svg << "<g fill=\"#444444\">\n";
  for (const double v : nice_tick_values(frame.x))
    svg << "<text x=\"" << format_fixed(frame.to_pixel(v, 0).x, 1) << "\" y=\"" << kPlotBottom + 17
        << "\" text-anchor=\"middle\">" << nice_tick_label(v, frame.x) << "</text>\n";
  for (const double v : nice_tick_values(frame.y))
    svg << "<text x=\"" << kPlotLeft - 7 << "\" y=\"" << format_fixed(frame.to_pixel(0, v).y + 4, 1)
        << "\" text-anchor=\"end\">" << nice_tick_label(v, frame.y) << "</text>\n";
  svg << "<text x=\"" << (kPlotLeft + kPlotRight) / 2 << "\" y=\"" << kHeight - 14
      << "\" text-anchor=\"middle\" font-size=\"13\">" << xml_escape(x_label) << "</text>\n";
  const double mid_y = (kPlotTop + kPlotBottom) / 2;
  svg << "<text x=\"20\" y=\"" << mid_y << "\" transform=\"rotate(-90 20 " << mid_y
      << ")\" text-anchor=\"middle\" font-size=\"13\">" << xml_escape(y_label) << "</text>\n</g>\n";
}

void draw_series(std::ostringstream& svg, const std::vector<Point>& pixels,
                 const std::string& color, bool markers) {
  if (pixels.empty()) return;
  svg << "<g>\n<path fill=\"none\" stroke=\"" << xml_escape(color)
      << "\" stroke-width=\"1.3\" stroke-linejoin=\"round\" stroke-linecap=\"round\" d=\"";
  for (size_t i = 0; i < pixels.size(); ++i)
    svg << (i == 0 ? "M" : " L") << format_fixed(pixels[i].x, 1) << ' '
        << format_fixed(pixels[i].y, 1);
  svg << "\"/>\n";
  if (markers)
    for (const Point& p : pixels)
      svg << "<circle cx=\"" << format_fixed(p.x, 1) << "\" cy=\"" << format_fixed(p.y, 1)
          << "\" r=\"3.2\" fill=\"" << xml_escape(color)
          << "\" stroke=\"white\" stroke-width=\"1\"/>\n";
  svg << "</g>\n";
}

struct LegendEntry {
  std::string label, color;
  bool markers = false, dashed = false;
};

// Top right of the plot area, where a falling loss curve leaves room.
void draw_legend(std::ostringstream& svg, const std::vector<LegendEntry>& entries) {
  if (entries.empty()) return;
  size_t longest = 0;
  for (const auto& e : entries) longest = std::max(longest, e.label.size());
  const double width = 44 + kLegendCharWidth * static_cast<double>(longest);
  const double height = 8 + kLegendRowHeight * static_cast<double>(entries.size());
  const double left = kPlotRight - width - 10, top = kPlotTop + 10;
  svg << "<g>\n<rect x=\"" << format_fixed(left, 1) << "\" y=\"" << top << "\" width=\""
      << format_fixed(width, 1) << "\" height=\"" << height
      << "\" rx=\"4\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#cccccc\"/>\n";
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const double y = top + 4 + kLegendRowHeight * (static_cast<double>(i) + 0.5);
    svg << "<line x1=\"" << format_fixed(left + 8, 1) << "\" y1=\"" << y << "\" x2=\""
        << format_fixed(left + 32, 1) << "\" y2=\"" << y << "\" stroke=\"" << xml_escape(e.color)
        << "\" stroke-width=\"1.6\"" << (e.dashed ? " stroke-dasharray=\"6 4\"" : "") << "/>\n";
    if (e.markers)
      svg << "<circle cx=\"" << format_fixed(left + 20, 1) << "\" cy=\"" << y
          << "\" r=\"3.2\" fill=\"" << xml_escape(e.color)
          << "\" stroke=\"white\" stroke-width=\"1\"/>\n";
    svg << "<text x=\"" << format_fixed(left + 38, 1) << "\" y=\"" << y + 4
        << "\" fill=\"#333333\">" << xml_escape(e.label) << "</text>\n";
  }
  svg << "</g>\n";
}

}  // namespace

std::string render_line_chart_svg(const std::vector<Series>& series, const std::string& title,
                                  const std::string& x_label, const std::string& y_label,
                                  std::optional<double> reference_line_y,
                                  std::string reference_label) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double x_min = inf, x_max = -inf, y_min = inf, y_max = -inf;
  for (const Series& s : series) {
    if (s.x.size() != s.y.size())
      throw_error("line chart '", title, "' series '", s.label, "': ", s.x.size(), " x values but ",
                  s.y.size(), " y values, expected as many of each");
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_min = std::min(x_min, s.x[i]), x_max = std::max(x_max, s.x[i]);
      y_min = std::min(y_min, s.y[i]), y_max = std::max(y_max, s.y[i]);
    }
  }
  const bool has_reference = reference_line_y && std::isfinite(*reference_line_y);
  if (has_reference)
    y_min = std::min(y_min, *reference_line_y), y_max = std::max(y_max, *reference_line_y);
  const Frame frame{make_nice_axis(x_min, x_max, kTargetTicksX),
                    make_nice_axis(y_min, y_max, kTargetTicksY)};

  std::ostringstream svg;
  svg << svg_document_start(kWidth, kHeight) << "<text x=\"" << (kPlotLeft + kPlotRight) / 2
      << "\" y=\"30\" text-anchor=\"middle\" font-size=\"16\""
      << " font-weight=\"bold\" fill=\"#222222\">" << xml_escape(title) << "</text>\n";
  draw_axes(svg, frame, x_label, y_label);

  std::vector<LegendEntry> legend;
  if (has_reference) {
    const double py = frame.to_pixel(frame.x.lo, *reference_line_y).y;
    svg << "<line x1=\"" << kPlotLeft << "\" y1=\"" << format_fixed(py, 1) << "\" x2=\""
        << kPlotRight << "\" y2=\"" << format_fixed(py, 1) << "\" stroke=\"" << kReferenceColor
        << "\" stroke-width=\"1.4\" stroke-dasharray=\"6 4\"/>\n";
  }
  size_t palette_index = 0;
  for (const Series& s : series) {
    const std::string color =
        s.color.empty() ? kPalette[palette_index++ % std::size(kPalette)] : s.color;
    draw_series(svg, series_pixels(s, frame), color, s.markers);
    if (!s.label.empty()) legend.push_back({s.label, color, s.markers, false});
  }
  // The reference goes last in the legend: the curves are what the reader came for.
  if (has_reference && !reference_label.empty())
    legend.push_back({reference_label, kReferenceColor, false, true});
  draw_legend(svg, legend);
  svg << "</svg>\n";
  return svg.str();
}

namespace {

// The field as a number; NaN when absent or null (a NaN loss is logged as null).
double number_or_nan(const nlohmann::json& record, const char* key) {
  const auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>()
                                               : std::numeric_limits<double>::quiet_NaN();
}

bool has_kind(const nlohmann::json& record, const char* kind) {
  const auto it = record.find("kind");
  return it != record.end() && it->is_string() && it->get<std::string>() == kind;
}

// "val loss (last 3.412)"; empty, leaving it out of the legend, while the series has no point yet.
std::string legend_label(const std::string& name, const Series& series) {
  for (size_t i = series.y.size(); i-- > 0;)
    if (std::isfinite(series.x[i]) && std::isfinite(series.y[i]))
      return name + " (last " + format_fixed(series.y[i], 3) + ")";
  return "";
}

}  // namespace

void write_loss_plot_svg(const std::string& path,
                         const std::vector<nlohmann::json>& metrics_records,
                         std::optional<double> unigram_baseline) {
  Series train{"", kPalette[0], {}, {}, false};
  Series val{"", kPalette[1], {}, {}, true};
  for (const nlohmann::json& record : metrics_records) {
    if (!record.is_object()) continue;
    // A skipped step's loss never reached the weights (and may be a spike that would flatten
    // the plot); a rollback undoes the steps after the checkpoint it returns to.
    if (has_kind(record, "rollback")) {
      const double to_step = number_or_nan(record, "to_step");
      for (Series* series : {&train, &val})
        while (!series->x.empty() && series->x.back() > to_step) {
          series->x.pop_back();
          series->y.pop_back();
        }
    } else if (has_kind(record, "train") && !(record.contains("skipped") && record["skipped"] == true)) {
      train.x.push_back(number_or_nan(record, "step"));
      train.y.push_back(number_or_nan(record, "loss"));
    } else if (has_kind(record, "val")) {
      val.x.push_back(number_or_nan(record, "step"));
      val.y.push_back(number_or_nan(record, "val_loss"));
    }
  }
  train.label = legend_label("train loss", train);
  val.label = legend_label("val loss", val);
  std::string reference_label;
  if (unigram_baseline)
    reference_label = "unigram baseline (" + format_fixed(*unigram_baseline, 3) + ")";
  write_svg_file(
      path, render_line_chart_svg({train, val}, "Training loss", "step",
                                  "cross-entropy (nats/token)", unigram_baseline, reference_label));
}

}  // namespace loom
