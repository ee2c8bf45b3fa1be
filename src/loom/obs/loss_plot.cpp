#include "loom/obs/loss_plot.hpp"

#include <cmath>
#include <limits>

#include "loom/obs/svg_support.hpp"

namespace loom {

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
  Series train{"", kChartPalette[0], {}, {}, false};
  Series val{"", kChartPalette[1], {}, {}, true};
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
