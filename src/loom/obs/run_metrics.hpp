#pragma once
// A training run's metrics.jsonl turned into what `loom report` draws: per chart (loss, lr,
// gradient norm, throughput, MFU, memory by category, wire bytes, communication time, compute
// time across ranks, and every other numeric field), the lines over steps; the skipped steps
// and rollbacks; the figures of the run's summary. Records after a rollback replace the steps
// they redo, as in the loss plot.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom {

// How a chart's values read: plain numbers, or bytes (the page picks KiB, MiB or GiB).
enum class MetricUnit { Plain, Bytes };

struct StepSeries {
  std::string name;                   // "train loss", "parameters", "dp", "median", ...
  std::vector<double> steps, values;  // same length; a NaN value was logged as null
  bool markers = false;               // sparse series (val loss, log points): dots too
};

struct MetricChart {
  std::string id;  // "loss", "lr", ..., "memory", "comm_bytes", or "field_<name>"
  std::string title, y_label;
  MetricUnit unit = MetricUnit::Plain;
  bool marks_skipped_steps = false;  // skipped steps drawn as vertical marks (loss, grad norm)
  std::vector<StepSeries> lines;
};

struct StepEvent {
  int64_t step = 0;
  std::string what;  // why the step was skipped; the checkpoint a rollback returned to
};

struct RunMetrics {
  // The charts that have data, in the order of metric_chart_order().
  std::vector<MetricChart> charts;
  std::vector<StepEvent> skipped_steps, rollbacks;
  int64_t train_records = 0;      // steps logged (after rollbacks)
  int64_t last_step = 0;          // the highest step logged
  int64_t total_steps = 0;        // train.steps as the run logged it
  double step_seconds_total = 0;  // sum of the logged step times
  // tokens_per_s x step_ms of a step: the global tokens per step (rounded), when logged.
  std::optional<int64_t> tokens_per_step;
};

// The fixed charts' ids in drawing order; "field_<name>" charts follow, sorted by name.
const std::vector<std::string>& metric_chart_order();

// `records` are a metrics log's records and `line_numbers` their lines (MetricsLog::read_all).
// Records of unknown kinds are ignored; a record that is not an object, a train or val record
// without an integer step, or a known field of the wrong type (a string loss, a non-object
// memory_peak_bytes) throws loom::Error naming `source`, the line and the field.
RunMetrics extract_run_metrics(const std::vector<nlohmann::json>& records,
                               const std::vector<int64_t>& line_numbers, const std::string& source);

}  // namespace loom
