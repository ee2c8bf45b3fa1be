#pragma once
// Checking the planner against training runs others have measured and published
// (published/public_runs.json: Narayanan et al. 2021, the ZeRO paper, MosaicML's tables).
// Each run is rebuilt as a model, a cluster and a layout; the planner predicts it and the
// prediction is compared with the published figure in the source's own metric, since sources
// count FLOPs differently (Narayanan's TFLOP/s include the recomputation pass; MosaicML's MFU
// does not).
#include <optional>
#include <string>
#include <vector>

#include "loom/model/config.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/layout.hpp"

namespace loom::plan {

// How the source turns throughput into a utilisation figure.
enum class PublishedMetric {
  // Narayanan et al. 2021 eq. 3: F = 96 B s l h^2 (1 + s/6h + V/16lh) per step, counting the
  // recomputed forward; "% of peak" = F / (step time x GPUs x peak).
  HfuNarayananEq3,
  // PaLM-style MFU as MosaicML computes it: (6 N + 12 L d s) FLOPs per token, no recompute.
  MfuSixN,
  // Model-state bytes per GPU (parameters + gradients + optimizer), the ZeRO paper's Fig. 1.
  ModelStateGigabytes,
};
const char* published_metric_name(PublishedMetric metric);

struct PublishedRun {
  std::string id, source;
  bool uncertain = false;
  PublishedMetric metric = PublishedMetric::MfuSixN;
  double published = 0;   // the figure in `metric` (a fraction, or GB)
  double params = 0;      // parameter count the source states (its N), 0 when not stated
  ModelConfig model;      // unset dimensions stay at defaults for memory-only runs
  ClusterSpec cluster;
  PlanLayout layout;
  // What the source leaves out, the planner picks (the fastest choice that fits).
  bool micro_batch_stated = true, vp_stated = true;
  int64_t seq_len = 0, global_batch = 0;
  bool flash_attention = true;  // "attention": "materialized" for stacks before FlashAttention
  double published_tokens_per_s_per_gpu = 0;  // 0 when not stated
};

// Reads a JSON array of runs in the schema of published/README.md. Throws loom::Error naming
// the run id and the field for a missing or malformed value and for an unknown GPU.
std::vector<PublishedRun> read_published_runs(const std::string& path);

struct RunCheck {
  const PublishedRun* run = nullptr;
  PlanLayout layout;            // with the planner's picks for the unstated fields
  double predicted = 0;         // in the run's metric
  double relative_error = 0;    // predicted / published - 1
  double tokens_per_s_per_gpu = 0;
  double memory_gib = 0;        // predicted per-GPU memory of the layout (throughput runs)
  bool fits = true;             // predicted memory within the usable HBM
};

RunCheck check_published_run(const PublishedRun& run);

struct ValidationSummary {
  int64_t throughput_runs = 0, within_15_percent = 0;
  double median_abs_error = 0;  // over throughput runs (the utilisation metrics)
  int64_t memory_runs = 0;
  double worst_memory_abs_error = 0;
};
ValidationSummary summarize(const std::vector<RunCheck>& checks);

}  // namespace loom::plan
