#pragma once
// The page `loom report` writes: one self-contained HTML file (no scripts, no fonts, stylesheets
// or images from elsewhere) with a header per run, one inline SVG line chart per metric with
// every run's lines on the same axes (a colour per run), and each run's pipeline timeline.
#include <string>
#include <utility>
#include <vector>

#include "loom/obs/run_metrics.hpp"

namespace loom {

struct ReportRun {
  std::string name;  // the run directory as given; legend and header text
  // The configuration rows of the run's header (label, value): model, layout, precision, ...
  std::vector<std::pair<std::string, std::string>> summary;
  std::vector<std::string> notes;  // what the run directory lacks, one sentence each
  RunMetrics metrics;
  // The run's pipeline.svg as read; embedded as an image (a data: URI), so that nothing in the
  // file runs or loads. Empty: none.
  std::string pipeline_svg;
};

// Size of every chart on the page, in SVG user units (the page scales them to its columns);
// the plot area inside follows kLineChartMargin* (line_chart_svg.hpp).
inline constexpr double kReportChartWidth = 640, kReportChartHeight = 360;

// Line styles that tell a run's lines of one chart apart when several runs share it (the
// first solid); lines beyond them repeat the styles.
inline constexpr const char* kReportLineDashes[] = {"", "7 4", "2 3", "9 3 2 3", "4 2 1 2", "1 4"};

// One <figure class="chart" id="chart-<id>"> per chart id any run has (metric_chart_order(),
// then "field_" charts by name). With one run, each line of a chart gets its own colour and a
// legend row saying its last value; with several, run i is drawn in kChartPalette[i] and the
// lines of a chart by kReportLineDashes, with a legend of runs (and of lines). Skipped steps are
// vertical marks on the loss and gradient-norm charts. Every text from the runs is escaped; the
// same input gives the same bytes.
std::string render_run_report_html(const std::vector<ReportRun>& runs);

}  // namespace loom
