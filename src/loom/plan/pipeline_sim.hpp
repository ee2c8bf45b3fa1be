#pragma once
// Timeline of a pipeline schedule: replays each rank's action list (parallel/pipeline_schedule)
// against the data dependencies between stages, so the planner predicts the bubble and the
// activation memory of the very order the executor runs, rather than a closed-form formula.
#include <cstdint>
#include <vector>

#include "loom/parallel/pipeline_schedule.hpp"

namespace loom::plan {

struct PipelineTimeline {
  double makespan = 0;                  // from the first forward's start to the last backward's end
  double bubble_fraction = 0;           // idle time / makespan, averaged over ranks
  std::vector<int64_t> peak_in_flight;  // per rank: most micro-batch-chunks forwarded but not
                                        // yet backwarded (activations held at once)
  struct Span {
    int64_t rank;
    PipeOp op;
    int64_t micro_batch, chunk;
    double start, end;
  };
  std::vector<Span> spans;  // every action, in the order it was scheduled; for drawing
};

// Each rank runs its actions in order, one at a time. Forward(mb, stage s) starts once
// Forward(mb, s - 1) has ended plus p2p_s; Backward(mb, s) once Backward(mb, s + 1) has ended
// plus p2p_s and Forward(mb, s) has ended (stage = chunk * p + rank). p2p_s is paid only between
// different ranks. t_forward_s / t_backward_s are per chunk per micro-batch. Throws loom::Error
// on bad arguments, on lists that do not run every (micro-batch, chunk) forward and backward
// once per rank, and on deadlock (an action whose dependencies can never be met).
PipelineTimeline simulate_pipeline(const std::vector<std::vector<PipeAction>>& actions, int64_t p,
                                   int64_t v, double t_forward_s, double t_backward_s,
                                   double p2p_s);

}  // namespace loom::plan
