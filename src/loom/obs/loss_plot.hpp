#pragma once
// The loss plot of a training run drawn from its metrics records, as standalone SVG: it needs
// no plotting library, opens in any browser and diffs as text.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/obs/line_chart_svg.hpp"

namespace loom {

// Plots "loss" against "step" of the records with "kind":"train", "val_loss" against "step"
// of those with "kind":"val" (with markers), and the unigram baseline as a dashed line.
// Records of other kinds, or missing fields, are ignored. Written to path + ".tmp" and renamed
// over `path`, so a reader never sees half a file; throws loom::Error naming the path on failure.
void write_loss_plot_svg(const std::string& path,
                         const std::vector<nlohmann::json>& metrics_records,
                         std::optional<double> unigram_baseline);

}  // namespace loom
