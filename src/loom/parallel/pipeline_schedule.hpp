#pragma once
// Pipeline schedules as data: for each pipeline rank, the ordered list of forward and backward
// actions it runs. The engine's pipeline executor (issue 5) and the planner's timeline
// simulation (plan/pipeline_sim) read the same lists, so what is predicted is what runs.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/model/stage_placement.hpp"

namespace loom {

enum class PipelineSchedule {
  AllForwardAllBackward,
  OneFOneB,
  Interleaved,
  ZeroBubbleH1,
  ZeroBubbleV,
  DualPipeV
};
// "afab", "1f1b", "interleaved", "zbh1", "zbv", "dualpipev"
const char* schedule_name(PipelineSchedule schedule);
// Every schedule, in the order the names above list them.
const std::vector<PipelineSchedule>& all_pipeline_schedules();
// Whether the schedule splits backwards into B (BackwardInput) and W (BackwardWeight).
bool splits_backward(PipelineSchedule schedule);

// Backward is the whole backward of a micro-batch's chunk. Zero-bubble schedules split it
// (Qi et al. 2023, sec 2): BackwardInput (B) computes the gradient the previous stage waits
// for; BackwardWeight (W) the parameter gradients, which wait for nothing but B.
enum class PipeOp { Forward, Backward, BackwardInput, BackwardWeight };
const char* op_letter(PipeOp op);  // "F", "B", "B", "W"
// A backward that carries the gradient to the previous stage (Backward or BackwardInput).
inline bool sends_gradient(PipeOp op) { return op == PipeOp::Backward || op == PipeOp::BackwardInput; }

// The placement of stages over ranks a schedule runs (model/stage_placement): V for
// ZeroBubbleV and DualPipeV, else RoundRobin.
StagePlacement stage_placement(PipelineSchedule schedule);

// One step of one rank. chunk is the model chunk held by this rank, 0..v-1; stage_of says
// which global stage it is.
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
// - ZeroBubbleH1 (ZB-H1, Qi et al. 2023 sec 3.1): 1F1B's warm-up and order of forwards and
//   input-gradient backwards, with each W after its B but rank r holding back r of them, which
//   fill the tail where 1F1B idles. Every rank then keeps at most p micro-batches between F and
//   W, 1F1B's peak on rank 0, and the bubble falls from (p - 1)(F + B + W) to (p - 1)(F + B - W)
//   in units of one chunk's pass times (a third when the three are equal).
// - ZeroBubbleV (ZB-V, Qi et al. 2024 sec 3; the order PyTorch's ScheduleZBVZeroBubble
//   generates): V placement, v = 2, m >= 2p. Rank r warms up with 2(p - r) - 1 forwards of
//   chunk 0, r pairs (F chunk 1, F chunk 0), then p - r triples (F, B, W) of chunk 1; the
//   steady state repeats (F, B, W) of chunk 0 then of chunk 1; the cool-down runs the last B's
//   (r pairs of both chunks without W, then p - r of chunk 0 with W) and the held-back W's.
//   Every rank keeps at most 2p chunk passes (p micro-batches of its layers) between F and W,
//   1F1B's peak, and with F = B = W the bubble is (p - 1) chunk passes per rank at either end.
// - DualPipeV (DeepSeek's DualPipe folded into the V, the order of its dualpipev.py): V
//   placement, v = 2, m >= 2p. Rank r forwards 2(p - r - 1) micro-batches of chunk 0, r + 1
//   pairs (F chunk 0, F chunk 1), p - r - 1 of (B, W, F) on chunk 1; its steady state pairs
//   the forward of one micro-batch with the whole backward of another on the other chunk
//   (F0 B1, F1 B0), which a GPU overlaps and this engine runs one after the other; the
//   cool-down splits the second half of its backwards into B and W to fill the tail. 2p + 1
//   chunk passes stay in flight per rank; with F = B = W the makespan is ZB-V's 6m + p - 1.
// v must be 1 unless Interleaved (v >= 2), ZeroBubbleV or DualPipeV (v = 2). Throws loom::Error naming the
// argument at fault and what would work.
std::vector<std::vector<PipeAction>> pipeline_actions(PipelineSchedule schedule, int64_t p,
                                                      int64_t m, int64_t v);

// Forwards only (evaluation): every rank takes (micro-batch, chunk) in increasing order, each
// stage's order of dependence on the one before.
std::vector<std::vector<PipeAction>> forward_only_actions(int64_t p, int64_t m, int64_t v);

// What travels between neighbouring stages: a forward's output activation to the next stage,
// a backward's input gradient to the previous one. Round-robin: stage s lives on rank s % p, so
// activations go from rank r to (r + 1) % p and gradients from r to (r - 1 + p) % p, the
// pipeline's ring. V: chunk 0's go down the ranks, chunk 1's up, and at the turn (rank p - 1)
// from_rank == to_rank: the executor hands those over locally.
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
                                          int64_t v,
                                          StagePlacement placement = StagePlacement::RoundRobin);
std::optional<PipeTransfer> transfer_out_of(const PipeAction& action, int64_t rank, int64_t p,
                                            int64_t v,
                                            StagePlacement placement = StagePlacement::RoundRobin);

// The order the pipeline executor guarantees its transfers (parallel/pipeline_channels): each
// message kind between two neighbours travels on its own channel, and a channel matches sends
// to receives in the order they are issued (NCCL has no tags; MPI keeps one tag per channel so
// it matches the same way). For the lists `actions` (one per rank) this checks that
//  1. on every channel the receiver receives in exactly the order the sender sends, and
//  2. the ranks cannot deadlock when sends never block and each receive blocks until the
//     matching send has been issued (what the executor does on either backend).
// Returns "" when both hold, else the first violation in words.
// A transfer within one rank (the V's turn) is a channel of its own, matched in order too.
// With overlapped_pairs, each rank issues a forward/backward pair's transfers as its executor
// then does: both receives, then both sends (starts_forward_backward_pair below).
std::string pipeline_transfer_problem(const std::vector<std::vector<PipeAction>>& actions,
                                      int64_t p, int64_t v,
                                      StagePlacement placement = StagePlacement::RoundRobin,
                                      bool overlapped_pairs = false);

// DualPipeV's overlapped pairs (DeepSeek's dualpipev.py, _forward_backward_chunk): a forward
// immediately followed by a whole backward of the other chunk ("F0 B1", "F1 B0" in its steady
// state). True when `list[i]` starts one. An executor that overlaps a pair receives both
// inputs, runs both, then sends both outputs (the forward's first);
// pipeline_transfer_problem(..., overlapped_pairs = true) checks the lists in that order.
bool starts_forward_backward_pair(const std::vector<PipeAction>& list, size_t i);

}  // namespace loom
