// `loom report RUN_DIR... -o report.html`: every run directory is read and checked before the
// page is written, and the page replaces the output file atomically.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "loom/ckpt/atomic_file.hpp"
#include "loom/ckpt/checkpoint_files.hpp"
#include "loom/ckpt/hf_config.hpp"
#include "loom/cli/commands.hpp"
#include "loom/cli/run_manifest.hpp"
#include "loom/core/error.hpp"
#include "loom/obs/metrics_log.hpp"
#include "loom/obs/progress.hpp"
#include "loom/obs/run_report_html.hpp"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kMetricsFile = "metrics.jsonl";
constexpr const char* kPipelineFile = "pipeline.svg";

std::string read_text(const fs::path& path) {
  const std::vector<uint8_t> bytes = read_file_bytes(path.string());
  return std::string(bytes.begin(), bytes.end());
}

// Runs from before run.json: the newest checkpoint under the run directory (or a folder in it)
// still says what the model was, the precision and the tokens per step.
std::optional<fs::path> newest_checkpoint_under(const fs::path& run_dir) {
  std::vector<fs::path> roots = {run_dir};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir, ec))
    if (entry.is_directory(ec)) roots.push_back(entry.path());
  std::optional<ckpt_files::StepDir> newest;
  for (const fs::path& root : roots)
    for (const ckpt_files::StepDir& dir : ckpt_files::list_step_dirs(root))
      if (!newest || dir.step > newest->step) newest = dir;
  if (!newest) return std::nullopt;
  return newest->path;
}

std::vector<std::pair<std::string, std::string>> rows_from_checkpoint(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> rows;
  const fs::path config = dir / ckpt_files::kConfigFile,
                 state = dir / ckpt_files::kTrainerStateFile;
  const ModelConfig model = model_config_from_hf_json(
      ckpt_files::parse_json_file(read_file_bytes(config.string()), config));
  rows.emplace_back("model", describe_model(model_summary_json(model)));
  if (fs::exists(state)) {
    const nlohmann::json trainer =
        ckpt_files::parse_json_file(read_file_bytes(state.string()), state);
    if (trainer.contains("precision") && trainer["precision"].is_string())
      rows.emplace_back("precision", trainer["precision"].get<std::string>());
    if (trainer.contains("tokens_per_step") && trainer["tokens_per_step"].is_number())
      rows.emplace_back("tokens/step", trainer["tokens_per_step"].dump());
  }
  rows.emplace_back("checkpoints", dir.parent_path().string());
  return rows;
}

bool has_row(const std::vector<std::pair<std::string, std::string>>& rows,
             const std::string& label) {
  return std::any_of(rows.begin(), rows.end(), [&](const auto& row) { return row.first == label; });
}

bool has_pipeline(const RunMetrics& metrics) {
  for (const MetricChart& chart : metrics.charts)
    if (chart.id == "comm_bytes")
      for (const StepSeries& line : chart.lines)
        if (line.name == "pp") return true;
  return false;
}

// Everything the page needs from one run directory; a loom::Error names the file at fault.
ReportRun read_run(const std::string& given, const std::string& name) {
  const fs::path dir = given;
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw_error("report: run directory '", given, "' does not exist");
  if (!fs::is_directory(dir, ec))
    throw_error("report: '", given,
                "' is not a directory; give a run directory (a training run's log.dir)");
  const fs::path metrics_path = dir / kMetricsFile;
  if (!fs::is_regular_file(metrics_path, ec))
    throw_error("report: run directory '", given, "' has no ", kMetricsFile,
                " (a training run writes it into its log.dir)");

  ReportRun run;
  run.name = name;
  std::vector<int64_t> lines;
  const std::vector<nlohmann::json> records = MetricsLog::read_all(metrics_path.string(), &lines);
  run.metrics = extract_run_metrics(records, lines, metrics_path.string());
  if (run.metrics.train_records == 0)
    throw_error("report: metrics log '", metrics_path.string(), "' holds no training steps yet");

  const fs::path manifest_path = dir / kRunManifestFile;
  if (fs::exists(manifest_path, ec)) {
    const nlohmann::json manifest =
        ckpt_files::parse_json_file(read_file_bytes(manifest_path.string()), manifest_path);
    if (!manifest.is_object())
      throw_error("run manifest '", manifest_path.string(), "': expected a JSON object");
    run.summary = run_manifest_rows(manifest, manifest_path.string());
  } else if (const std::optional<fs::path> checkpoint = newest_checkpoint_under(dir)) {
    run.summary = rows_from_checkpoint(*checkpoint);
    run.notes.push_back(
        "No run.json (loom train writes it): the model, precision and tokens/step are read from "
        "the "
        "checkpoint " +
        checkpoint->string() + "; the layout is unknown.");
  } else {
    run.notes.push_back(
        "No run.json (loom train writes it) and no checkpoint in the directory: the configuration "
        "is unknown beyond what metrics.jsonl says.");
  }
  if (!has_row(run.summary, "steps") && run.metrics.total_steps > 0)
    run.summary.emplace_back("steps", std::to_string(run.metrics.total_steps));
  if (!has_row(run.summary, "tokens/step") && run.metrics.tokens_per_step)
    run.summary.emplace_back("tokens/step", std::to_string(*run.metrics.tokens_per_step) +
                                                " (from tokens/s x step time)");

  const fs::path pipeline_path = dir / kPipelineFile;
  if (fs::exists(pipeline_path, ec)) {
    const std::string svg = read_text(pipeline_path);
    if (svg.rfind("<svg", 0) == 0 || svg.rfind("<?xml", 0) == 0)
      run.pipeline_svg = svg;
    else
      run.notes.push_back(pipeline_path.string() + " is not an SVG document; it is left out.");
  } else if (has_pipeline(run.metrics)) {
    run.notes.push_back(
        "A pipeline-parallel run without pipeline.svg: loom train --print-schedule draws the last "
        "step's timeline into the run directory.");
  }
  return run;
}

}  // namespace

int run_report(const ReportArgs& args) {
  if (args.run_dirs.empty()) throw_error("report: give at least one run directory");
  // The output's directory must exist before any work, and the output must not be a directory.
  std::error_code ec;
  const fs::path output = args.output;
  const fs::path parent = output.has_parent_path() ? output.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    throw_error("report: cannot write '", args.output, "': directory '", parent.string(),
                "' does not exist");
  if (fs::is_directory(output, ec))
    throw_error("report: cannot write '", args.output,
                "': it is a directory; give a file name such as report.html");

  std::vector<ReportRun> runs;
  for (const std::string& given : args.run_dirs) {
    std::string name = given;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    // The same directory twice still needs two legend entries.
    const std::string base = name;
    for (int copy = 2;
         std::any_of(runs.begin(), runs.end(), [&](const ReportRun& r) { return r.name == name; });
         ++copy)
      name = base + " (" + std::to_string(copy) + ")";
    runs.push_back(read_run(given, name));
  }
  const std::string html = render_run_report_html(runs);
  atomic_write_file(args.output, html);
  size_t charts = 0;
  for (size_t at = html.find("<figure class=\"chart\""); at != std::string::npos;
       at = html.find("<figure class=\"chart\"", at + 1))
    ++charts;
  std::printf("wrote %s: %zu run%s, %zu charts, %s\n", args.output.c_str(), runs.size(),
              runs.size() == 1 ? "" : "s", charts,
              format_bytes(static_cast<int64_t>(html.size())).c_str());
  return 0;
}

}  // namespace loom::cli
