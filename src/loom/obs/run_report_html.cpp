#include "loom/obs/run_report_html.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "loom/obs/line_chart_svg.hpp"
#include "loom/obs/progress.hpp"
#include "loom/obs/svg_support.hpp"

namespace loom {
namespace {

// Legend rows naming a line style rather than a run are drawn in this neutral grey.
constexpr const char* kLineKeyColor = "#555555";
// Skipped steps of a single run: red against the first line's blue.
constexpr const char* kSkipMarkColor = "#d62728";
// The most skipped steps and rollbacks a run's header lists one by one.
constexpr size_t kListedEvents = 8;
// Beyond this many points a series' dots would merge into a thick line: it is drawn without.
constexpr size_t kMostMarkedPoints = 200;

// Plain CSS, system fonts only: the page must render the same with no network.
constexpr const char* kStyle = R"(
body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222;background:#f6f6f6}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:24px 0 10px}
p.lead{margin:0;color:#555;font-size:13px}
.runs{display:flex;flex-wrap:wrap;gap:16px}
.run{background:#fff;border:1px solid #ddd;border-radius:6px;padding:12px 16px;flex:1 1 360px}
.run h3{font-size:15px;margin:0 0 8px;overflow-wrap:anywhere}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:8px}
table.summary{border-collapse:collapse;font-size:13px}
table.summary th{text-align:left;font-weight:normal;color:#666;padding:2px 14px 2px 0;vertical-align:top;white-space:nowrap}
table.summary td{padding:2px 0;overflow-wrap:anywhere}
table.summary tr.part th{color:#222;font-weight:bold;padding-top:8px}
p.note{color:#8a5a00;font-size:13px;margin:6px 0 0}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(540px,1fr));gap:16px}
figure{margin:0;background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px}
figure.chart svg{display:block;width:100%;height:auto}
figure.timeline{margin-bottom:16px}
figure.timeline img{display:block;max-width:100%;height:auto}
figcaption{font-size:13px;color:#555;margin:0 0 6px}
)";

std::string format_plain(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.4g", value);
  return buffer;
}

std::string format_value(double value, MetricUnit unit) {
  if (!std::isfinite(value)) return "--";
  return unit == MetricUnit::Bytes ? format_bytes(std::llround(value)) : format_plain(value);
}

std::optional<double> last_finite(const StepSeries& series) {
  for (size_t i = series.values.size(); i-- > 0;)
    if (std::isfinite(series.values[i])) return series.values[i];
  return std::nullopt;
}

std::optional<double> median_finite(const StepSeries& series) {
  std::vector<double> values;
  for (const double v : series.values)
    if (std::isfinite(v)) values.push_back(v);
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

const MetricChart* find_chart(const RunMetrics& metrics, const std::string& id) {
  for (const MetricChart& chart : metrics.charts)
    if (chart.id == id) return &chart;
  return nullptr;
}

const StepSeries* find_line(const MetricChart* chart, const std::string& name) {
  if (!chart) return nullptr;
  for (const StepSeries& line : chart->lines)
    if (line.name == name) return &line;
  return nullptr;
}

// Bytes are drawn in the binary unit of the chart's largest value.
struct ByteScale {
  double divisor = 1;
  const char* unit = "B";
};
ByteScale byte_scale(double largest) {
  if (largest >= 1024.0 * 1024 * 1024) return {1024.0 * 1024 * 1024, "GiB"};
  if (largest >= 1024.0 * 1024) return {1024.0 * 1024, "MiB"};
  if (largest >= 1024.0) return {1024.0, "KiB"};
  return {};
}

std::string base64(const std::string& bytes) {
  static constexpr char kDigits[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t group = 0;
    for (size_t k = 0; k < 3; ++k)
      group = group << 8 | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? kDigits[(group >> (18 - 6 * k)) & 63] : '=';
  }
  return out;
}

std::string events_text(const std::vector<StepEvent>& events) {
  std::string text = std::to_string(events.size());
  if (events.empty()) return text;
  text += ": ";
  for (size_t i = 0; i < events.size() && i < kListedEvents; ++i)
    text +=
        (i ? "; step " : "step ") + std::to_string(events[i].step) + " (" + events[i].what + ")";
  if (events.size() > kListedEvents) text += "; ...";
  return text;
}

// What the run's metrics say, below its configuration.
std::vector<std::pair<std::string, std::string>> result_rows(const RunMetrics& m) {
  std::vector<std::pair<std::string, std::string>> rows;
  std::string steps = std::to_string(m.last_step);
  if (m.total_steps > 0) steps += " of " + std::to_string(m.total_steps);
  rows.emplace_back("steps logged", steps);
  const MetricChart* loss = find_chart(m, "loss");
  if (const StepSeries* train = find_line(loss, "train loss"))
    if (const auto v = last_finite(*train)) rows.emplace_back("last train loss", format_plain(*v));
  if (const StepSeries* val = find_line(loss, "val loss"))
    if (const auto v = last_finite(*val)) rows.emplace_back("last val loss", format_plain(*v));
  if (const StepSeries* t = find_line(find_chart(m, "tokens_per_s"), "tokens/s"))
    if (const auto v = median_finite(*t))
      rows.emplace_back("throughput (median)", format_count(*v) + " tokens/s");
  if (const StepSeries* mfu = find_line(find_chart(m, "mfu"), "MFU"))
    if (const auto v = median_finite(*mfu))
      rows.emplace_back("MFU (median)", format_plain(*v) + "%");
  if (const StepSeries* total = find_line(find_chart(m, "memory"), "total")) {
    double peak = 0;
    for (const double v : total->values)
      if (std::isfinite(v)) peak = std::max(peak, v);
    rows.emplace_back("peak memory", format_bytes(std::llround(peak)));
  }
  if (const MetricChart* comm = find_chart(m, "comm_bytes")) {
    std::string text;
    for (const StepSeries& line : comm->lines)
      if (const auto v = median_finite(line))
        text += (text.empty() ? "" : ", ") + line.name + " " + format_bytes(std::llround(*v));
    rows.emplace_back("wire bytes per step (median)", text);
  }
  if (m.step_seconds_total > 0)
    rows.emplace_back("time in logged steps", format_duration(m.step_seconds_total));
  rows.emplace_back("skipped steps", events_text(m.skipped_steps));
  if (!m.rollbacks.empty()) rows.emplace_back("rollbacks", events_text(m.rollbacks));
  return rows;
}

void write_run_header(std::ostringstream& html, const ReportRun& run, size_t index) {
  html << "<div class=\"run\" id=\"run-" << index
       << "\">\n<h3><span class=\"swatch\" style=\"background:"
       << kChartPalette[index % std::size(kChartPalette)] << "\"></span>" << xml_escape(run.name)
       << "</h3>\n<table class=\"summary\">\n";
  auto write_rows = [&](const std::vector<std::pair<std::string, std::string>>& rows) {
    for (const auto& [label, value] : rows)
      html << "<tr><th>" << xml_escape(label) << "</th><td>" << xml_escape(value) << "</td></tr>\n";
  };
  html << "<tr class=\"part\"><th colspan=\"2\">configuration</th></tr>\n";
  write_rows(run.summary);
  html << "<tr class=\"part\"><th colspan=\"2\">results</th></tr>\n";
  write_rows(result_rows(run.metrics));
  html << "</table>\n";
  for (const std::string& note : run.notes)
    html << "<p class=\"note\">" << xml_escape(note) << "</p>\n";
  html << "</div>\n";
}

// One chart id over every run that has it.
std::string chart_svg(const std::vector<ReportRun>& runs, const std::string& id) {
  const MetricChart* first = nullptr;
  std::vector<std::string> line_names;  // every run's lines of this chart, in first-seen order
  double largest = 0;
  for (const ReportRun& run : runs)
    if (const MetricChart* chart = find_chart(run.metrics, id)) {
      if (!first) first = chart;
      for (const StepSeries& line : chart->lines) {
        if (std::find(line_names.begin(), line_names.end(), line.name) == line_names.end())
          line_names.push_back(line.name);
        for (const double v : line.values)
          if (std::isfinite(v)) largest = std::max(largest, std::abs(v));
      }
    }
  const ByteScale scale = first->unit == MetricUnit::Bytes ? byte_scale(largest) : ByteScale{};
  LineChartOptions options;
  options.title = first->title;
  options.x_label = "step";
  options.y_label =
      first->unit == MetricUnit::Bytes ? first->y_label + " (" + scale.unit + ")" : first->y_label;
  options.width = kReportChartWidth;
  options.height = kReportChartHeight;
  options.standalone = false;
  const bool several_runs = runs.size() > 1;

  std::vector<Series> series;
  for (size_t r = 0; r < runs.size(); ++r) {
    const MetricChart* chart = find_chart(runs[r].metrics, id);
    if (!chart) continue;
    const std::string run_color = kChartPalette[r % std::size(kChartPalette)];
    for (const StepSeries& line : chart->lines) {
      const size_t k = static_cast<size_t>(
          std::find(line_names.begin(), line_names.end(), line.name) - line_names.begin());
      std::vector<double> values = line.values;
      for (double& v : values) v /= scale.divisor;
      const std::string last = format_value(last_finite(line).value_or(NAN), chart->unit);
      const bool markers = line.markers && line.steps.size() <= kMostMarkedPoints;
      Series s{"", several_runs ? run_color : kChartPalette[k % std::size(kChartPalette)],
               line.steps, std::move(values), markers};
      s.tooltip = runs[r].name + ": " + line.name + " (last " + last + ")";
      if (several_runs)
        s.dash = kReportLineDashes[k % std::size(kReportLineDashes)];
      else
        s.label = line.name + " (last " + last + ")";
      series.push_back(std::move(s));
    }
    if (first->marks_skipped_steps)
      for (const StepEvent& skipped : runs[r].metrics.skipped_steps)
        options.marks.push_back({static_cast<double>(skipped.step),
                                 several_runs ? run_color : kSkipMarkColor,
                                 runs[r].name + ": step " + std::to_string(skipped.step) +
                                     " skipped (" + skipped.what + ")"});
  }
  if (!options.marks.empty()) options.marks_label = "skipped step";
  if (several_runs) {
    for (size_t r = 0; r < runs.size(); ++r)
      if (find_chart(runs[r].metrics, id))
        options.legend.push_back(
            {runs[r].name, kChartPalette[r % std::size(kChartPalette)], "", false});
    if (line_names.size() > 1)
      for (size_t k = 0; k < line_names.size(); ++k) {
        bool markers = false;
        for (const ReportRun& run : runs)
          if (const StepSeries* line = find_line(find_chart(run.metrics, id), line_names[k]))
            markers = markers || line->markers;
        options.legend.push_back({line_names[k], kLineKeyColor,
                                  kReportLineDashes[k % std::size(kReportLineDashes)], markers});
      }
  }
  return render_line_chart_svg(series, options);
}

// Chart ids in page order: the fixed ones, then every run's "field_" charts by name.
std::vector<std::string> chart_ids(const std::vector<ReportRun>& runs) {
  std::vector<std::string> ids;
  for (const std::string& id : metric_chart_order())
    for (const ReportRun& run : runs)
      if (find_chart(run.metrics, id)) {
        ids.push_back(id);
        break;
      }
  std::vector<std::string> fields;
  for (const ReportRun& run : runs)
    for (const MetricChart& chart : run.metrics.charts)
      if (chart.id.rfind("field_", 0) == 0 &&
          std::find(fields.begin(), fields.end(), chart.id) == fields.end())
        fields.push_back(chart.id);
  std::sort(fields.begin(), fields.end());
  ids.insert(ids.end(), fields.begin(), fields.end());
  return ids;
}

}  // namespace

std::string render_run_report_html(const std::vector<ReportRun>& runs) {
  std::ostringstream html;
  std::string names;
  for (const ReportRun& run : runs) names += (names.empty() ? "" : ", ") + run.name;
  html << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
       << "<title>loom report: " << xml_escape(names) << "</title>\n<style>" << kStyle
       << "</style>\n</head>\n<body>\n<header>\n<h1>loom training report</h1>\n<p class=\"lead\">"
       << runs.size() << (runs.size() == 1 ? " run" : " runs")
       << ", drawn from each run directory's metrics.jsonl by <code>loom report</code>.</p>\n"
       << "</header>\n<h2>Runs</h2>\n<section class=\"runs\">\n";
  for (size_t r = 0; r < runs.size(); ++r) write_run_header(html, runs[r], r);
  html << "</section>\n<h2>Metrics over steps</h2>\n<section class=\"charts\">\n";
  for (const std::string& id : chart_ids(runs))
    html << "<figure class=\"chart\" id=\"chart-" << xml_escape(id) << "\" data-metric=\""
         << xml_escape(id) << "\">\n"
         << chart_svg(runs, id) << "</figure>\n";
  html << "</section>\n";
  bool any_timeline = false;
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].pipeline_svg.empty()) continue;
    if (!any_timeline) html << "<h2>Pipeline timeline</h2>\n<section class=\"timelines\">\n";
    any_timeline = true;
    html << "<figure class=\"timeline\" id=\"timeline-" << r << "\">\n<figcaption>"
         << xml_escape(runs[r].name)
         << ": pipeline.svg, the last step of each pipeline rank as the trainer measured it "
            "(loom train --print-schedule)</figcaption>\n<img alt=\"pipeline timeline of "
         << xml_escape(runs[r].name) << "\" src=\"data:image/svg+xml;base64,"
         << base64(runs[r].pipeline_svg) << "\">\n</figure>\n";
  }
  if (any_timeline) html << "</section>\n";
  html << "</body>\n</html>\n";
  return html.str();
}

}  // namespace loom
