#pragma once
// Line charts as standalone SVG, and the loss plot of a training run drawn from its metrics
// records. SVG because it needs no plotting library, opens in any browser and diffs as text.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct Series {
  std::string label;         // legend text; empty leaves the series out of the legend
  std::string color;         // any SVG colour; empty takes the next one of a default palette
  std::vector<double> x, y;  // same length; points with a NaN or infinite coordinate are skipped
  bool markers = false;      // also draw a dot at every point (sparse series such as val loss)
};

// An 800x500 chart with round-numbered axis ticks, gridlines and a legend; every text is
// XML-escaped. The axes span all finite points and the reference line, drawn dashed when given.
// Throws loom::Error if a series has x and y of different lengths.
std::string render_line_chart_svg(const std::vector<Series>& series, const std::string& title,
                                  const std::string& x_label, const std::string& y_label,
                                  std::optional<double> reference_line_y = {},
                                  std::string reference_label = "");

// Plots "loss" against "step" of the records with "kind":"train", "val_loss" against "step"
// of those with "kind":"val" (with markers), and the unigram baseline as a dashed line.
// Records of other kinds, or missing fields, are ignored. Written to path + ".tmp" and renamed
// over `path`, so a reader never sees half a file; throws loom::Error naming the path on failure.
void write_loss_plot_svg(const std::string& path,
                         const std::vector<nlohmann::json>& metrics_records,
                         std::optional<double> unigram_baseline);

}  // namespace loom
