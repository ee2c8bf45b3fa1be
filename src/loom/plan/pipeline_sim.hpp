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
  std::vector<int64_t> peak_in_flight;  // per rank: most micro-batch-chunks forwarded whose
                                        // backward (its W, when split) has not ended
  struct Span {
    int64_t rank;
    PipeOp op;
    int64_t micro_batch, chunk;
    double start, end;
  };
  std::vector<Span> spans;  // every action, in the order it was scheduled; for drawing
};

// Times of one chunk's passes over one micro-batch. A whole backward (PipeOp::Backward) takes
// input_grad_s + weight_grad_s; a split one takes each part apart.
// hidable_*_s: the part of forward_s and of input_grad_s that is communication the pass waits
// for (tensor- and expert-parallel collectives, context-parallel exchanges), which another
// computation running beside it can hide (DualPipeV's overlapped pairs, below).
struct PassTimes {
  double forward_s = 0, input_grad_s = 0, weight_grad_s = 0;
  double hidable_forward_s = 0, hidable_backward_s = 0;
  double backward_s() const { return input_grad_s + weight_grad_s; }
};

// Each rank runs its actions in order, one at a time. Forward(mb, stage s) starts once
// Forward(mb, s - 1) has ended plus p2p_s; a backward of (mb, s) (whole, or its B) once the
// backward (or B) of (mb, s + 1) has ended plus p2p_s and Forward(mb, s) has ended (stage =
// stage_of(chunk, rank) under `placement`); a W once its B has. p2p_s is paid only between
// different ranks. Throws
// loom::Error on bad arguments, on lists that do not run every (micro-batch, chunk) forward and
// backward once per rank (whole, or as one B and one W after it), and on deadlock (an action
// whose dependencies can never be met).
PipelineTimeline simulate_pipeline(const std::vector<std::vector<PipeAction>>& actions, int64_t p,
                                   int64_t v, const PassTimes& times, double p2p_s,
                                   StagePlacement placement = StagePlacement::RoundRobin);
// The same with each stage's own pass times (p x v of them, by stage): a stage of more layers,
// or the last with the head, takes longer, and the timeline shows where that stalls the others.
//
// With overlapped_pairs, each forward/backward pair of a list (starts_forward_backward_pair:
// DualPipeV's steady state) runs as DeepSeek's DualPipe runs it: it starts once both inputs
// are there, the two computations share the device while each one's communication hides
// under the other's computation, and both outputs are ready when it ends. It lasts
// max(F - hidable_F + B - hidable_B, F, B), F and B the two passes' times.
PipelineTimeline simulate_pipeline(const std::vector<std::vector<PipeAction>>& actions, int64_t p,
                                   int64_t v, const std::vector<PassTimes>& stage_times,
                                   double p2p_s,
                                   StagePlacement placement = StagePlacement::RoundRobin,
                                   bool overlapped_pairs = false);
// The same on a machine whose `cores` are shared by the pipeline's p ranks and, beside each, the
// ranks_per_stage_rank - 1 data/tensor/context-parallel peers that run its list in lockstep
// (loom's engine under mpirun on a CPU with fewer cores than ranks). Stage times are at full
// speed (one core per process); while b of the pipeline's ranks are busy each runs at
// min(1, cores / (b x ranks_per_stage_rank)) of it (processor sharing), so a rank idle in the
// bubble lends its core to the busy ones. Messages (p2p_s) use no core. Same checks and errors.
PipelineTimeline simulate_pipeline_on_shared_cores(const std::vector<std::vector<PipeAction>>& actions,
                                                   int64_t p, int64_t v, const std::vector<PassTimes>& stage_times,
                                                   double p2p_s, StagePlacement placement, double cores,
                                                   int64_t ranks_per_stage_rank);
// The same with a whole backward of t_backward_s, split evenly where a list splits it.
PipelineTimeline simulate_pipeline(const std::vector<std::vector<PipeAction>>& actions, int64_t p,
                                   int64_t v, double t_forward_s, double t_backward_s,
                                   double p2p_s,
                                   StagePlacement placement = StagePlacement::RoundRobin);

// Activation memory of one rank's list, replayed in its order: a forward holds one activation
// set until its backward (whole, or B) ends; a B holds what its W reads (`deferred_bytes`) from
// its start until that W ends, while the set is still held. Returns the peak bytes.
int64_t peak_activation_bytes(const std::vector<PipeAction>& rank_actions, int64_t set_bytes,
                              int64_t deferred_bytes);

}  // namespace loom::plan
