#pragma once
// `loom train --print-schedule`: one training step's pipeline as it really ran, drawn per
// rank (obs/timeline_svg), and its measured bubble next to the textbook one.
#include <optional>
#include <string>
#include <vector>

#include "loom/dist/process_group.hpp"
#include "loom/parallel/pipeline_executor.hpp"

namespace loom {

struct PipelineBubble {
  // Idle time over busy time, averaged over ranks, where a rank is idle between the step's
  // first action anywhere and its last action anywhere whenever it is not computing: the
  // quantity the textbook formula estimates.
  double measured = 0;
  double textbook = 0;  // (p - 1) / m, interleaved (p - 1) / (v m) (Narayanan et al. 2021 sec 2.2)
  double makespan_s = 0;
};

// The textbook bubble of `schedule` for p ranks, m micro-batches, v chunks per rank.
double textbook_bubble(PipelineSchedule schedule, int64_t p, int64_t m, int64_t v);

// Measured bubble of every rank's timings (outer index: pipeline rank).
double measured_bubble(const std::vector<std::vector<ActionTiming>>& ranks);

// Collective over `pp`: gathers every rank's timings of one step (same action count on every
// rank; times since a common start) to pp rank 0, which writes the timeline to `svg_path`
// (unless empty) and returns the bubble; other ranks return nothing.
std::optional<PipelineBubble> report_pipeline_step(ProcessGroup& pp,
                                                   const std::vector<ActionTiming>& mine,
                                                   PipelineSchedule schedule, int64_t m, int64_t v,
                                                   const std::string& svg_path);

}  // namespace loom
