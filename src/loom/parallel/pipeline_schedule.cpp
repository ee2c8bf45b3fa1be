#include "loom/parallel/pipeline_schedule.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom {

const char* schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::AllForwardAllBackward: return "afab";
    case PipelineSchedule::OneFOneB: return "1f1b";
    case PipelineSchedule::Interleaved: return "interleaved";
  }
  return "?";
}

namespace {

void validate(PipelineSchedule schedule, int64_t p, int64_t m, int64_t v) {
  const char* name = schedule_name(schedule);
  if (p < 1)
    throw_error("pipeline schedule ", name, ": p (pipeline ranks) = ", p, ", expected >= 1");
  if (m < 1)
    throw_error("pipeline schedule ", name, ": m (micro-batches) = ", m, ", expected >= 1");
  if (v < 1)
    throw_error("pipeline schedule ", name, ": v (chunks per rank) = ", v, ", expected >= 1");
  if (schedule == PipelineSchedule::Interleaved) {
    if (v < 2)
      throw_error("pipeline schedule interleaved: v (chunks per rank) = ", v,
                  ", expected >= 2 (with one chunk use 1f1b)");
    // Micro-batches enter each chunk in groups of p; a partial group would leave ranks waiting
    // on a micro-batch that never comes (Megatron-LM asserts the same).
    if (m % p != 0)
      throw_error("pipeline schedule interleaved: m (micro-batches) = ", m,
                  " is not a multiple of p (pipeline ranks) = ", p);
  } else if (v != 1) {
    throw_error("pipeline schedule ", name, ": v (chunks per rank) = ", v,
                ", expected 1 (only interleaved splits a rank's layers into chunks)");
  }
}

// The k-th forward (or backward) of a rank under the interleaved schedule, k in 0..m*v-1.
// Megatron-LM's get_model_chunk_id: p micro-batches go through chunk 0, then the same p through
// chunk 1, ..., then the next group of p. Backwards visit chunks in reverse, since the gradient
// enters the model at its last stage.
PipeAction interleaved_action(PipeOp op, int64_t k, int64_t p, int64_t v) {
  const int64_t in_group = k % (p * v);
  int64_t chunk = in_group / p;
  if (op == PipeOp::Backward) chunk = v - 1 - chunk;
  return {op, (k / (p * v)) * p + in_group % p, chunk};
}

// Warm-up forwards, then pairs (forward k + warmup, backward k), then the remaining backwards:
// the shape shared by 1F1B (v = 1) and interleaved 1F1B.
std::vector<PipeAction> one_f_one_b(int64_t warmup, int64_t p, int64_t m, int64_t v) {
  const int64_t total = m * v;
  warmup = std::min(warmup, total);
  std::vector<PipeAction> actions;
  actions.reserve(static_cast<size_t>(2 * total));
  for (int64_t k = 0; k < warmup; ++k)
    actions.push_back(interleaved_action(PipeOp::Forward, k, p, v));
  for (int64_t k = 0; k < total - warmup; ++k) {
    actions.push_back(interleaved_action(PipeOp::Forward, k + warmup, p, v));
    actions.push_back(interleaved_action(PipeOp::Backward, k, p, v));
  }
  for (int64_t k = total - warmup; k < total; ++k)
    actions.push_back(interleaved_action(PipeOp::Backward, k, p, v));
  return actions;
}

}  // namespace

std::vector<std::vector<PipeAction>> pipeline_actions(PipelineSchedule schedule, int64_t p,
                                                      int64_t m, int64_t v) {
  validate(schedule, p, m, v);
  std::vector<std::vector<PipeAction>> ranks(static_cast<size_t>(p));
  for (int64_t rank = 0; rank < p; ++rank) {
    auto& actions = ranks[static_cast<size_t>(rank)];
    switch (schedule) {
      case PipelineSchedule::AllForwardAllBackward:
        // Every micro-batch's activations stay alive until the backwards start (GPipe's cost).
        for (int64_t mb = 0; mb < m; ++mb) actions.push_back({PipeOp::Forward, mb, 0});
        for (int64_t mb = 0; mb < m; ++mb) actions.push_back({PipeOp::Backward, mb, 0});
        break;
      case PipelineSchedule::OneFOneB:
        // Rank r's first backward needs micro-batch 0 to cross the p - r - 1 later ranks, so it
        // forwards that many ahead, then keeps at most p - r in flight.
        actions = one_f_one_b(p - rank - 1, p, m, 1);
        break;
      case PipelineSchedule::Interleaved:
        // Megatron-LM: (v - 1) * p forwards fill this rank's earlier chunks before the first
        // micro-batch reaches its last chunk, plus 2 per later rank for the round trip there.
        actions = one_f_one_b((p - rank - 1) * 2 + (v - 1) * p, p, m, v);
        break;
    }
  }
  return ranks;
}

}  // namespace loom
