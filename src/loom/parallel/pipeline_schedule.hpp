#pragma once
// Pipeline schedules as data: for each pipeline rank, the ordered list of forward and backward
// actions it runs. The engine's pipeline executor (issue 5) and the planner's timeline
// simulation (plan/pipeline_sim) read the same lists, so what is predicted is what runs.
#include <cstdint>
#include <vector>

namespace loom {

enum class PipelineSchedule { AllForwardAllBackward, OneFOneB, Interleaved };
const char* schedule_name(PipelineSchedule schedule);  // "afab", "1f1b", "interleaved"

enum class PipeOp { Forward, Backward };

// One step of one rank. chunk is the model chunk held by this rank, 0..v-1; the model is cut
// into v * p stages laid out round-robin, so global stage = chunk * p + rank (Narayanan et al.
// 2021 sec 2.2.2: rank r holds stages r, r + p, r + 2p, ...).
struct PipeAction {
  PipeOp op;
  int64_t micro_batch;
  int64_t chunk;
};

// Ordered actions of every pipeline rank (outer index = rank) for p ranks, m micro-batches and
// v chunks per rank:
// - AllForwardAllBackward (GPipe): m forwards, then m backwards.
// - OneFOneB (PipeDream-Flush, Narayanan et al. 2021 sec 2.2.1): min(p - rank - 1, m) warm-up
//   forwards, then forward/backward pairs, then the remaining backwards.
// - Interleaved (sec 2.2.2, Megatron-LM's order): needs m % p == 0 and v >= 2; micro-batches go
//   through each chunk in groups of p; (p - rank - 1) * 2 + (v - 1) * p warm-up forwards.
// v must be 1 unless Interleaved. Throws loom::Error naming the argument at fault.
std::vector<std::vector<PipeAction>> pipeline_actions(PipelineSchedule schedule, int64_t p,
                                                      int64_t m, int64_t v);

}  // namespace loom
