#include "loom/obs/svg_support.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "loom/core/error.hpp"

namespace loom {

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        const bool forbidden =
            static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r';
        out += forbidden ? '?' : c;
    }
  }
  return out;
}

std::string format_fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  std::string text = buffer;
  // A tiny negative value rounds to "-0.00"; the sign would only be noise in a chart.
  if (text[0] == '-' && text.find_first_not_of("-0.") == std::string::npos) text.erase(0, 1);
  return text;
}

NiceAxis make_nice_axis(double data_min, double data_max, int target_ticks) {
  if (!(data_min <= data_max)) data_min = 0, data_max = 1;  // no finite data at all
  const double scale = std::max(std::abs(data_min), std::abs(data_max));
  if (data_max - data_min <= 1e-9 * scale) {  // one value (or nearly): give it room
    const double pad = scale > 0 ? 0.1 * scale : 1.0;
    data_min -= pad, data_max += pad;
  }
  const double raw_step = (data_max - data_min) / target_ticks;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw_step)));
  const double fraction = raw_step / magnitude;
  const double nice = fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10;
  NiceAxis axis;
  axis.step = nice * magnitude;
  axis.lo = std::floor(data_min / axis.step) * axis.step;
  axis.hi = std::ceil(data_max / axis.step) * axis.step;
  return axis;
}

std::vector<double> nice_tick_values(const NiceAxis& axis) {
  std::vector<double> ticks;
  const auto count = static_cast<int64_t>(std::llround((axis.hi - axis.lo) / axis.step));
  for (int64_t i = 0; i <= count; ++i)
    ticks.push_back(axis.lo + static_cast<double>(i) * axis.step);
  return ticks;
}

std::string nice_tick_label(double value, const NiceAxis& axis) {
  const double largest = std::max(std::abs(axis.lo), std::abs(axis.hi));
  double unit = 1;
  const char* suffix = "";
  if (largest >= 1e6 && axis.step >= 1e5)
    unit = 1e6, suffix = "M";
  else if (largest >= 1e4 && axis.step >= 100)
    unit = 1e3, suffix = "k";
  const int decimals =
      std::max(0, static_cast<int>(std::ceil(-std::log10(axis.step / unit) - 1e-9)));
  // Zero reads as "0", not "0k".
  if (std::abs(value) < axis.step * 1e-6) return format_fixed(0, unit == 1 ? decimals : 0);
  return format_fixed(value / unit, decimals) + suffix;
}

int value_decimals(const NiceAxis& axis) {
  constexpr int kMostDecimals = 9;  // beyond double's ~15 digits for any sensible magnitude
  return std::clamp(static_cast<int>(std::ceil(-std::log10(axis.step) - 1e-9)), 0, kMostDecimals) +
         1;
}

std::string svg_document_start(double width, double height, bool standalone) {
  const std::string w = format_fixed(width, 0), h = format_fixed(height, 0);
  return std::string("<svg") + (standalone ? " xmlns=\"http://www.w3.org/2000/svg\"" : "") +
         " width=\"" + w + "\" height=\"" + h +
         "\" viewBox=\"0 0 " + w + ' ' + h +
         "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n<rect width=\"" + w +
         "\" height=\"" + h + "\" fill=\"white\"/>\n";
}

void write_svg_file(const std::string& path, const std::string& svg) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << svg;
    out.close();
    if (!out) {
      const int write_errno = errno;
      std::remove(temporary.c_str());
      throw_error("SVG file '", path, "': cannot write '", temporary,
                  "': ", std::strerror(write_errno));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temporary.c_str());
    throw_error("SVG file '", path, "': cannot rename '", temporary,
                "' over it: ", std::strerror(rename_errno));
  }
}

}  // namespace loom
