#pragma once
// Stacked bar charts as standalone SVG: one bar per item, split into named segments that add
// up to its height. Drawn for the per-GPU memory breakdown (parameters, gradients, optimizer
// state, activations, ...) of the planner's best layouts, against the usable HBM.
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct StackedBar {
  std::string label;           // x tick text; may be long ("tp=8 pp=2 ... recompute=full")
  std::vector<double> values;  // one per segment label, bottom segment first; finite, >= 0
};

// Bars in the given order, segments coloured by index (bottom first) with a legend of
// `segment_labels`, the total written above each bar, round-numbered y ticks from 0, and
// `limit_line` (e.g. usable HBM) drawn dashed across the plot and named in the legend by
// `limit_label`. Tick labels wrap at spaces under their bar, or turn 45 degrees when a word
// would not fit. Each segment is a <rect class="segment"> with a <title> tooltip; every text
// is XML-escaped and the same input gives the same bytes.
// Throws loom::Error if a bar has a different number of values than `segment_labels`, a value
// is negative or not finite, or the limit is negative or not finite.
std::string render_stacked_bar_chart_svg(const std::vector<StackedBar>& bars,
                                         const std::vector<std::string>& segment_labels,
                                         const std::string& title, const std::string& y_label,
                                         std::optional<double> limit_line = {},
                                         std::string limit_label = "");

}  // namespace loom
