#pragma once
// What every SVG chart in obs/ shares, written once: XML escaping, fixed-precision numbers,
// round-numbered axes, the document header and the atomic file write.
#include <string>
#include <vector>

namespace loom {

// Text and attribute values alike; characters XML 1.0 forbids (most controls) become '?'.
std::string xml_escape(const std::string& text);

// `value` with exactly `decimals` digits after the point, never "-0.0": charts print every
// coordinate through this, so the same input gives the same bytes.
std::string format_fixed(double value, int decimals);

// One axis: [lo, hi] are whole multiples of `step`, which is 1, 2 or 5 times a power of ten
// (Heckbert, "Nice Numbers for Graph Labels", Graphics Gems, 1990).
struct NiceAxis {
  double lo = 0, hi = 1, step = 0.2;
};

// About `target_ticks` intervals covering [data_min, data_max]; an empty or inverted range
// (no finite data) gives [0, 1], a single value gets room on both sides.
NiceAxis make_nice_axis(double data_min, double data_max, int target_ticks);

// lo, lo + step, ..., hi.
std::vector<double> nice_tick_values(const NiceAxis& axis);

// "0.5", "12", "20k", "1.5M": as many decimals as the step needs, thousands folded into a suffix.
std::string nice_tick_label(double value, const NiceAxis& axis);

// Decimals for a value read off the axis (a bar's total, a span's start in a tooltip): one more
// than the ticks show, so two values between the same ticks still differ.
int value_decimals(const NiceAxis& axis);

// The opening <svg> element and a white background; the caller appends the chart and
// "</svg>\n". `standalone` adds xmlns, which a file needs and an <svg> inside HTML does not.
std::string svg_document_start(double width, double height, bool standalone = true);

// Writes `svg` to path + ".tmp" and renames it over `path`, so a reader (a browser refreshing
// the plot mid-run) never sees half a file. No fsync: a plot lost to a power cut is redrawn,
// unlike a checkpoint (ckpt/atomic_file). Throws loom::Error naming the path on failure.
void write_svg_file(const std::string& path, const std::string& svg);

}  // namespace loom
