#pragma once
// What the published-runs tests share: the repository's copy of the shared file, predicting a
// file's every run, one figure of a run's check, and input files in a temporary directory.
#include <cstdio>
#include <string>
#include <vector>

#include "loom/plan/published_runs.hpp"
#include "test_support.hpp"

namespace loom::test {

inline const std::string kPublished = std::string(LOOM_SOURCE_DIR) + "/published/public_runs.json";

// One of the collections loom keeps beside the shared file (published/loom_*.json).
inline std::vector<plan::PublishedRun> loom_runs(const std::string& file) {
  return plan::read_published_runs(std::string(LOOM_SOURCE_DIR) + "/published/" + file);
}

// A summary's utilisation and throughput median and p90, in percent to one decimal: "5.8 19.5".
inline std::string median_and_p90(const plan::ValidationSummary& s) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1f %.1f", 100 * s.rates.median, 100 * s.rates.p90);
  return text;
}

// A fraction as a percent to one decimal, as the README prints it: 0.0462 -> "4.6".
inline std::string pct(double fraction) {
  char text[16];
  std::snprintf(text, sizeof text, "%.1f", 100 * fraction);
  return text;
}

inline std::vector<plan::RunCheck> check_all(const std::vector<plan::PublishedRun>& runs) {
  std::vector<plan::RunCheck> checks;
  for (const plan::PublishedRun& r : runs) checks.push_back(plan::check_published_run(r));
  return checks;
}

inline const plan::FigureCheck* figure(const plan::RunCheck& c, plan::Figure f) {
  for (const plan::FigureCheck& fc : c.figures)
    if (fc.measured.figure == f) return &fc;
  return nullptr;
}

// Input files of the tests below, in a directory removed after the test binary ends.
inline std::string write_file(const std::string& name, const std::string& text) {
  static const TempDir dir("plan_validate");
  write_text_file(dir.file(name), text);
  return dir.file(name);
}

// A one-run file of a small dense model on the hardware given as a JSON object, read back.
inline plan::PublishedRun record_on(const std::string& id, const std::string& hardware) {
  const std::string text = R"([{"id": ")" + id + R"(", "kind": "throughput", "source": "Doe 2024",
      "model": {"name": "x", "layers": 8, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 1000, "seq_len": 1024},
      "hardware": )" + hardware +
                           R"(, "parallelism": {"total_gpus": 8, "dp": 8},
      "micro_batch": 1, "global_batch": 64, "measured": {"mfu": 0.4}}])";
  return plan::read_published_runs(write_file(id + ".json", text)).front();
}

// The GPU preset a printed hardware.gpu reads as.
inline std::string gpu_of(const std::string& id, const std::string& gpu) {
  return record_on(id, R"({"gpu": ")" + gpu + R"(", "gpus_per_node": 8})").cluster.gpu.name;
}

}  // namespace loom::test
