#include "loom/parallel/pipeline_schedule.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include "loom/core/error.hpp"

namespace loom {

const char* schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::AllForwardAllBackward: return "afab";
    case PipelineSchedule::OneFOneB: return "1f1b";
    case PipelineSchedule::Interleaved: return "interleaved";
    case PipelineSchedule::ZeroBubbleH1: return "zbh1";
    case PipelineSchedule::ZeroBubbleV: return "zbv";
    case PipelineSchedule::DualPipeV: return "dualpipev";
  }
  return "?";
}

const std::vector<PipelineSchedule>& all_pipeline_schedules() {
  static const std::vector<PipelineSchedule> all{
      PipelineSchedule::AllForwardAllBackward, PipelineSchedule::OneFOneB,
      PipelineSchedule::Interleaved, PipelineSchedule::ZeroBubbleH1, PipelineSchedule::ZeroBubbleV,
      PipelineSchedule::DualPipeV};
  return all;
}

bool splits_backward(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::ZeroBubbleH1 || schedule == PipelineSchedule::ZeroBubbleV ||
         schedule == PipelineSchedule::DualPipeV;
}

StagePlacement stage_placement(PipelineSchedule schedule) {
  const bool v = schedule == PipelineSchedule::ZeroBubbleV || schedule == PipelineSchedule::DualPipeV;
  return v ? StagePlacement::V : StagePlacement::RoundRobin;
}


const char* op_letter(PipeOp op) {
  switch (op) {
    case PipeOp::Forward: return "F";
    case PipeOp::Backward:
    case PipeOp::BackwardInput: return "B";
    case PipeOp::BackwardWeight: return "W";
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
  } else if (stage_placement(schedule) == StagePlacement::V) {
    if (v != 2)
      throw_error("pipeline schedule ", name, ": v (chunks per rank) = ", v,
                  ", expected 2 (the V holds two chunks on every rank)");
    // The warm-up forwards 2p - 1 micro-batches of chunk 0 on rank 0 before its first B; with
    // fewer the steady state never forms and the schedule is not the paper's (DualPipeV
    // asserts the same).
    if (m < 2 * p)
      throw_error("pipeline schedule ", name, ": m (micro-batches) = ", m, " with p (pipeline ranks) = ", p,
                  ", expected m >= 2p = ", 2 * p, " (or use zbh1 or 1f1b, which need m >= p)");
  } else if (v != 1) {
    throw_error("pipeline schedule ", name, ": v (chunks per rank) = ", v,
                ", expected 1 (only interleaved, zbv and dualpipev split a rank's layers into chunks)");
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

// ZB-H1 on one rank: 1F1B's p - rank - 1 warm-up forwards, then per step a forward (while
// any remain), the B of the oldest forwarded micro-batch and the W of the one `rank` B's
// earlier; the held-back W's close the list. The forwards and B's keep 1F1B's order, so the
// gradients travel as under 1F1B, only sooner: a B is a backward without its weight GEMMs.
std::vector<PipeAction> zero_bubble_h1(int64_t rank, int64_t p, int64_t m) {
  const int64_t warmup = std::min(p - rank - 1, m);
  std::vector<PipeAction> actions;
  actions.reserve(static_cast<size_t>(3 * m));
  for (int64_t k = 0; k < warmup; ++k) actions.push_back({PipeOp::Forward, k, 0});
  int64_t weights_done = 0;
  for (int64_t k = 0; k < m; ++k) {
    if (k + warmup < m) actions.push_back({PipeOp::Forward, k + warmup, 0});
    actions.push_back({PipeOp::BackwardInput, k, 0});
    if (k - rank >= 0) actions.push_back({PipeOp::BackwardWeight, weights_done++, 0});
  }
  while (weights_done < m) actions.push_back({PipeOp::BackwardWeight, weights_done++, 0});
  return actions;
}

// ZB-V on one rank (Qi et al. 2024 sec 3, fig. 5; the order of PyTorch's ScheduleZBVZeroBubble).
// Chunk 0 is stage `rank`, chunk 1 stage 2p - 1 - rank. Micro-batch k reaches rank r's chunk 1
// after 2(p - r) - 1 chunk passes beyond its chunk 0, so rank r forwards that many of chunk 0
// first; the r pairs that follow fill the time until the first gradient comes back up the V,
// and from then each F is followed by a B and its W, keeping 2p passes in flight on every rank.
std::vector<PipeAction> zero_bubble_v(int64_t rank, int64_t p, int64_t m) {
  std::vector<PipeAction> actions;
  actions.reserve(static_cast<size_t>(6 * m));
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  auto add = [&](PipeOp op, int64_t chunk, int64_t& counter) {
    actions.push_back({op, counter++, chunk});
  };
  auto b_then_w = [&](int64_t chunk, int64_t& counter) {
    actions.push_back({PipeOp::BackwardInput, counter, chunk});
    actions.push_back({PipeOp::BackwardWeight, counter++, chunk});
  };
  for (int64_t i = 0; i < 2 * (p - rank) - 1; ++i) add(PipeOp::Forward, 0, f0);
  for (int64_t i = 0; i < rank; ++i) {
    add(PipeOp::Forward, 1, f1);
    add(PipeOp::Forward, 0, f0);
  }
  for (int64_t i = 0; i < p - rank; ++i) {
    add(PipeOp::Forward, 1, f1);
    b_then_w(1, b1);
  }
  while (f1 < m) {  // m >= 2p, so chunk 0 still has forwards left when this starts
    if (f0 < m) add(PipeOp::Forward, 0, f0);
    b_then_w(0, b0);
    add(PipeOp::Forward, 1, f1);
    b_then_w(1, b1);
  }
  // Cool-down: the B's the previous rank waits for first, their W's after.
  int64_t w0 = b0, w1 = b1;
  for (int64_t i = 0; i < rank; ++i) {
    actions.push_back({PipeOp::BackwardInput, b0++, 0});
    actions.push_back({PipeOp::BackwardInput, b1++, 1});
  }
  for (int64_t i = 0; i < p - rank; ++i) {
    actions.push_back({PipeOp::BackwardInput, b0++, 0});
    actions.push_back({PipeOp::BackwardWeight, w0++, 0});
  }
  while (w1 < m) actions.push_back({PipeOp::BackwardWeight, w1++, 1});
  while (w0 < m) actions.push_back({PipeOp::BackwardWeight, w0++, 0});
  return actions;
}

// DualPipeV on one rank (DeepSeek's DualPipe folded into the V, as in its dualpipev.py; torchtitan
// ships the same as ScheduleDualPipeV). Chunk 0 is stage `rank`, chunk 1 stage 2p - 1 - rank.
// Its steady state pairs the forward of one micro-batch with the whole backward of another on
// the other chunk ("F0 B1", "F1 B0"), which a device overlaps (one's compute under the other's
// communication); this engine runs each pair's two actions one after the other, F first. Only
// the warm-up's chunk-1 backwards and the cool-down's second half split into B and W (its
// WeightGradStore queue, run in order).
std::vector<PipeAction> dual_pipe_v(int64_t rank, int64_t p, int64_t m) {
  std::vector<PipeAction> actions;
  actions.reserve(static_cast<size_t>(6 * m));
  int64_t forwards[2] = {0, 0}, backwards[2] = {0, 0};
  std::deque<std::pair<int64_t, int64_t>> weights;  // (micro-batch, chunk) whose W waits
  auto forward = [&](int64_t c) { actions.push_back({PipeOp::Forward, forwards[c]++, c}); };
  auto backward = [&](int64_t c, bool split) {
    if (split) {
      actions.push_back({PipeOp::BackwardInput, backwards[c], c});
      weights.emplace_back(backwards[c], c);
    } else {
      actions.push_back({PipeOp::Backward, backwards[c], c});
    }
    ++backwards[c];
  };
  auto weight = [&] {
    actions.push_back({PipeOp::BackwardWeight, weights.front().first, weights.front().second});
    weights.pop_front();
  };
  for (int64_t i = 0; i < 2 * (p - rank - 1); ++i) forward(0);  // 1: nF0
  for (int64_t i = 0; i < rank + 1; ++i) {                         // 2: nF0F1
    forward(0);
    forward(1);
  }
  for (int64_t i = 0; i < p - rank - 1; ++i) {  // 3: nB1W1F1, zero bubble
    backward(1, true);
    weight();
    forward(1);
  }
  for (int64_t i = 0; i < m - 2 * p + rank + 1; ++i) {  // 4: nF0B1F1B0, the overlapped pairs
    forward(0);
    backward(1, false);
    forward(1);
    backward(0, false);
  }
  for (int64_t i = 0; i < p - rank - 1; ++i) {  // 5: nB1F1B0
    backward(1, false);
    forward(1);
    backward(0, false);
  }
  // 6: nB1B0, the second half split (odd ranks from chunk 1's backward, even from chunk 0's).
  bool split = false;
  for (int64_t i = 0; i < rank + 1; ++i) {
    if (i == (rank + 1) / 2 && rank % 2 == 1) split = true;
    backward(1, split);
    if (i == (rank + 1) / 2 && rank % 2 == 0) split = true;
    backward(0, split);
  }
  for (int64_t i = 0; i < p - rank - 1; ++i) {  // 7: nWB0
    weight();
    backward(0, true);
  }
  while (!weights.empty()) weight();  // 8: nW
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
      case PipelineSchedule::ZeroBubbleH1:
        actions = zero_bubble_h1(rank, p, m);
        break;
      case PipelineSchedule::ZeroBubbleV:
        actions = zero_bubble_v(rank, p, m);
        break;
      case PipelineSchedule::DualPipeV:
        actions = dual_pipe_v(rank, p, m);
        break;
    }
  }
  return ranks;
}

std::vector<std::vector<PipeAction>> forward_only_actions(int64_t p, int64_t m, int64_t v) {
  if (p < 1 || m < 1 || v < 1)
    throw_error("forward-only pipeline: p = ", p, ", m = ", m, ", v = ", v, ", expected each >= 1");
  std::vector<std::vector<PipeAction>> ranks(static_cast<size_t>(p));
  for (auto& actions : ranks)
    for (int64_t mb = 0; mb < m; ++mb)
      for (int64_t c = 0; c < v; ++c) actions.push_back({PipeOp::Forward, mb, c});
  return ranks;
}

std::optional<PipeTransfer> transfer_into(const PipeAction& action, int64_t rank, int64_t p,
                                          int64_t v, StagePlacement placement) {
  const int64_t stage = stage_of(action.chunk, rank, p, placement), stages = p * v;
  if (action.op == PipeOp::Forward) {
    if (stage == 0) return std::nullopt;
    return PipeTransfer{PipeMessage::Activation, action.micro_batch, stage,
                        rank_of_stage(stage - 1, p, placement), rank};
  }
  if (!sends_gradient(action.op) || stage == stages - 1) return std::nullopt;
  return PipeTransfer{PipeMessage::Gradient, action.micro_batch, stage,
                      rank_of_stage(stage + 1, p, placement), rank};
}

std::optional<PipeTransfer> transfer_out_of(const PipeAction& action, int64_t rank, int64_t p,
                                            int64_t v, StagePlacement placement) {
  const int64_t stage = stage_of(action.chunk, rank, p, placement), stages = p * v;
  if (action.op == PipeOp::Forward) {
    if (stage == stages - 1) return std::nullopt;
    return PipeTransfer{PipeMessage::Activation, action.micro_batch, stage + 1, rank,
                        rank_of_stage(stage + 1, p, placement)};
  }
  if (!sends_gradient(action.op) || stage == 0) return std::nullopt;
  return PipeTransfer{PipeMessage::Gradient, action.micro_batch, stage - 1, rank,
                      rank_of_stage(stage - 1, p, placement)};
}

namespace {

const char* message_name(PipeMessage kind) {
  return kind == PipeMessage::Activation ? "activation" : "gradient";
}

std::string describe(const PipeTransfer& t) {
  std::ostringstream out;
  out << message_name(t.kind) << " of micro-batch " << t.micro_batch << " for stage " << t.stage
      << " (rank " << t.from_rank << " -> " << t.to_rank << ")";
  return out.str();
}

// A channel: one message kind from one rank to the other.
using Channel = std::tuple<PipeMessage, int64_t, int64_t>;
Channel channel_of(const PipeTransfer& t) { return {t.kind, t.from_rank, t.to_rank}; }

struct Step {
  bool receive;
  PipeTransfer transfer;
};

}  // namespace

bool starts_forward_backward_pair(const std::vector<PipeAction>& list, size_t i) {
  return i + 1 < list.size() && list[i].op == PipeOp::Forward &&
         list[i + 1].op == PipeOp::Backward && list[i].chunk != list[i + 1].chunk;
}

std::string pipeline_transfer_problem(const std::vector<std::vector<PipeAction>>& actions,
                                      int64_t p, int64_t v, StagePlacement placement,
                                      bool overlapped_pairs) {
  if (static_cast<int64_t>(actions.size()) != p) {
    std::ostringstream out;
    out << actions.size() << " action lists for " << p << " pipeline ranks";
    return out.str();
  }
  // Each rank's transfers in the order it issues them: an action's input, then its output.
  std::vector<std::vector<Step>> program(static_cast<size_t>(p));
  std::map<Channel, std::vector<PipeTransfer>> sent, received;
  for (int64_t rank = 0; rank < p; ++rank) {
    const std::vector<PipeAction>& list = actions[static_cast<size_t>(rank)];
    for (size_t i = 0; i < list.size(); ++i) {
      // One action, or an overlapped pair: both inputs, then both outputs.
      const size_t n = overlapped_pairs && starts_forward_backward_pair(list, i) ? 2 : 1;
      for (size_t k = i; k < i + n; ++k)
        if (list[k].chunk < 0 || list[k].chunk >= v) {
          std::ostringstream out;
          out << "rank " << rank << " runs chunk " << list[k].chunk << " of " << v;
          return out.str();
        }
      for (size_t k = i; k < i + n; ++k)
        if (const auto in = transfer_into(list[k], rank, p, v, placement)) {
          program[static_cast<size_t>(rank)].push_back({true, *in});
          received[channel_of(*in)].push_back(*in);
        }
      for (size_t k = i; k < i + n; ++k)
        if (const auto out = transfer_out_of(list[k], rank, p, v, placement)) {
          program[static_cast<size_t>(rank)].push_back({false, *out});
          sent[channel_of(*out)].push_back(*out);
        }
      i += n - 1;
    }
  }
  // 1. Same order on both ends of every channel (and nothing sent that is never received).
  std::map<Channel, bool> channels;
  for (const auto& [channel, list] : sent) channels[channel] = true;
  for (const auto& [channel, list] : received) channels[channel] = true;
  for (const auto& [channel, unused] : channels) {
    const std::vector<PipeTransfer>& s = sent[channel];
    const std::vector<PipeTransfer>& r = received[channel];
    for (size_t i = 0; i < std::max(s.size(), r.size()); ++i) {
      if (i < s.size() && i < r.size() && s[i] == r[i]) continue;
      std::ostringstream out;
      out << "on the channel of " << message_name(std::get<0>(channel)) << "s from rank "
          << std::get<1>(channel) << " to rank " << std::get<2>(channel) << ", transfer " << i
          << " is sent as ";
      out << (i < s.size() ? describe(s[i]) : std::string("nothing"));
      out << " but received as " << (i < r.size() ? describe(r[i]) : std::string("nothing"));
      return out.str();
    }
  }
  // 2. Run the ranks: sends are posted without blocking, a receive blocks until the send it
  // matches (the next one on its channel) has been posted.
  std::map<Channel, size_t> posted, taken;
  std::vector<size_t> cursor(static_cast<size_t>(p), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t rank = 0; rank < program.size(); ++rank) {
      for (size_t& i = cursor[rank]; i < program[rank].size(); ++i) {
        const Step& step = program[rank][i];
        const Channel channel = channel_of(step.transfer);
        if (!step.receive) {
          ++posted[channel];
        } else if (posted[channel] > taken[channel]) {
          ++taken[channel];
        } else {
          break;
        }
        progress = true;
      }
    }
  }
  std::ostringstream stuck;
  for (size_t rank = 0; rank < program.size(); ++rank)
    if (cursor[rank] < program[rank].size())
      stuck << (stuck.tellp() > 0 ? "; " : "") << "rank " << rank << " waits for "
            << describe(program[rank][cursor[rank]].transfer);
  if (stuck.tellp() > 0) return "the ranks deadlock: " + stuck.str();
  return "";
}

}  // namespace loom
