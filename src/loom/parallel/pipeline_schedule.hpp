#pragma once
// Pipeline schedules as data: for each pipeline rank, the ordered list of forward and backward
// actions it runs. The engine's pipeline executor (issue 5) and the planner's timeline
// simulation (plan/pipeline_sim) read the same lists, so what is predicted is what runs.
#include <cstdint>
#include <optional>
#include <string>
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

// Forwards only (evaluation): every rank takes (micro-batch, chunk) in increasing order, each
// stage's order of dependence on the one before.
std::vector<std::vector<PipeAction>> forward_only_actions(int64_t p, int64_t m, int64_t v);

// What travels between neighbouring stages: a forward's output activation to the next stage,
// a backward's input gradient to the previous one. Stage s lives on rank s % p, so activations
// go from rank r to (r + 1) % p and gradients from r to (r - 1 + p) % p: the pipeline's ring.
enum class PipeMessage { Activation, Gradient };

struct PipeTransfer {
  PipeMessage kind;
  int64_t micro_batch;
  int64_t stage;  // the receiving stage
  int64_t from_rank, to_rank;
  bool operator==(const PipeTransfer&) const = default;
};

// The transfer `action` of `rank` waits for before it runs (none on the first stage's forward
// and the last stage's backward), and the one it sends when done (none on the last stage's
// forward and the first stage's backward). v chunks per rank, p ranks.
std::optional<PipeTransfer> transfer_into(const PipeAction& action, int64_t rank, int64_t p,
                                          int64_t v);
std::optional<PipeTransfer> transfer_out_of(const PipeAction& action, int64_t rank, int64_t p,
                                            int64_t v);

// The order the pipeline executor guarantees its transfers (parallel/pipeline_channels): each
// message kind between two neighbours travels on its own channel, and a channel matches sends
// to receives in the order they are issued (NCCL has no tags; MPI keeps one tag per channel so
// it matches the same way). For the lists `actions` (one per rank) this checks that
//  1. on every channel the receiver receives in exactly the order the sender sends, and
//  2. the ranks cannot deadlock when sends never block and each receive blocks until the
//     matching send has been issued (what the executor does on either backend).
// Returns "" when both hold, else the first violation in words.
std::string pipeline_transfer_problem(const std::vector<std::vector<PipeAction>>& actions,
                                      int64_t p, int64_t v);

}  // namespace loom
