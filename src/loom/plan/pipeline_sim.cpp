#include "loom/plan/pipeline_sim.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>

#include "loom/core/error.hpp"

namespace loom::plan {
namespace {

constexpr double kNotYet = std::numeric_limits<double>::quiet_NaN();

const char* op_name(PipeOp op) {
  switch (op) {
    case PipeOp::Forward: return "forward";
    case PipeOp::Backward: return "backward";
    case PipeOp::BackwardInput: return "input-gradient backward (B)";
    case PipeOp::BackwardWeight: return "weight-gradient backward (W)";
  }
  return "?";
}

// End times of every (kind, micro-batch, stage); NaN until that action has been simulated.
// A whole backward ends its gradient (what the previous stage waits for) and its weights at
// once; a split one, its gradient at B and its weights at W.
struct EndTimes {
  int64_t stages = 0;
  std::vector<double> forward, gradient, weights;
  EndTimes(int64_t m, int64_t stages_)
      : stages(stages_),
        forward(static_cast<size_t>(m * stages_), kNotYet),
        gradient(static_cast<size_t>(m * stages_), kNotYet),
        weights(static_cast<size_t>(m * stages_), kNotYet) {}
  static double& in(std::vector<double>& times, int64_t stages, int64_t mb, int64_t stage) {
    return times[static_cast<size_t>(mb * stages + stage)];
  }
  double& forward_end(int64_t mb, int64_t stage) { return in(forward, stages, mb, stage); }
  double& gradient_end(int64_t mb, int64_t stage) { return in(gradient, stages, mb, stage); }
  double& weights_end(int64_t mb, int64_t stage) { return in(weights, stages, mb, stage); }
};

// Each rank must run every (micro-batch, chunk) forward and backward exactly once; otherwise the
// timeline would silently describe a different amount of work. Returns m.
int64_t check_complete(const std::vector<std::vector<PipeAction>>& actions, int64_t v) {
  int64_t m = 0;
  for (size_t rank = 0; rank < actions.size(); ++rank)
    for (const PipeAction& a : actions[rank]) {
      if (a.chunk < 0 || a.chunk >= v)
        throw_error("simulate_pipeline: rank ", rank, " has chunk ", a.chunk, ", expected 0..",
                    v - 1);
      if (a.micro_batch < 0)
        throw_error("simulate_pipeline: rank ", rank, " has micro-batch ", a.micro_batch);
      m = std::max(m, a.micro_batch + 1);
    }
  if (m == 0) throw_error("simulate_pipeline: the action lists are empty, nothing to time");
  // Per (micro-batch, chunk): forwards, whole backwards, B's, W's, with a W only after its B.
  for (size_t rank = 0; rank < actions.size(); ++rank) {
    std::vector<std::array<int, 4>> seen(static_cast<size_t>(m * v), {0, 0, 0, 0});
    for (const PipeAction& a : actions[rank]) {
      auto& count = seen[static_cast<size_t>(a.micro_batch * v + a.chunk)];
      if (a.op == PipeOp::BackwardWeight && count[2] == 0)
        throw_error("simulate_pipeline: rank ", rank, " runs the W of micro-batch ", a.micro_batch, " chunk ",
                    a.chunk, " before its B");
      ++count[static_cast<size_t>(a.op)];
    }
    for (size_t i = 0; i < seen.size(); ++i) {
      const auto& c = seen[i];
      const bool whole = c[1] == 1 && c[2] == 0 && c[3] == 0, split = c[1] == 0 && c[2] == 1 && c[3] == 1;
      if (c[0] != 1 || !(whole || split)) {
        const auto idx = static_cast<int64_t>(i);
        throw_error("simulate_pipeline: rank ", rank, " runs micro-batch ", idx / v, " chunk ", idx % v, " with ",
                    c[0], " forward(s), ", c[1], " backward(s), ", c[2], " B and ", c[3],
                    " W, expected one forward and either one backward or one B and one W");
      }
    }
  }
  return m;
}

// What both simulations check before running: the shapes, one positive pass time per stage,
// and complete lists. Returns m.
int64_t check_arguments(const std::vector<std::vector<PipeAction>>& actions, int64_t p, int64_t v,
                        const std::vector<PassTimes>& stage_times, double p2p_s) {
  if (p < 1 || v < 1) throw_error("simulate_pipeline: p = ", p, ", v = ", v, ", expected >= 1");
  if (static_cast<int64_t>(actions.size()) != p)
    throw_error("simulate_pipeline: ", actions.size(), " action lists for p = ", p, " ranks");
  if (static_cast<int64_t>(stage_times.size()) != p * v)
    throw_error("simulate_pipeline: ", stage_times.size(), " stages' pass times for p x v = ", p * v, " stages");
  for (size_t stage = 0; stage < stage_times.size(); ++stage) {
    const PassTimes& times = stage_times[stage];
    // A stage may do no work of a kind (Llama 3's first stage holds the embedding alone: no input
    // gradient), never negative or unbounded work.
    auto valid = [](double t) { return t >= 0 && std::isfinite(t); };
    if (!valid(times.forward_s) || !valid(times.input_grad_s) || !valid(times.weight_grad_s) ||
        !valid(p2p_s))
      throw_error("simulate_pipeline: stage ", stage, ": forward ", times.forward_s,
                  " s, input-gradient backward ", times.input_grad_s,
                  " s, weight-gradient backward ", times.weight_grad_s, " s, p2p_s = ", p2p_s,
                  ", expected finite times >= 0");
  }
  return check_complete(actions, v);
}

}  // namespace

PipelineTimeline simulate_pipeline(const std::vector<std::vector<PipeAction>>& actions, int64_t p,
                                   int64_t v, double t_forward_s, double t_backward_s,
                                   double p2p_s, StagePlacement placement) {
  return simulate_pipeline(actions, p, v, PassTimes{t_forward_s, t_backward_s / 2, t_backward_s / 2}, p2p_s,
                           placement);
}

PipelineTimeline simulate_pipeline(const std::vector<std::vector<PipeAction>>& actions, int64_t p,
                                   int64_t v, const PassTimes& times, double p2p_s,
                                   StagePlacement placement) {
  if (p < 1 || v < 1) throw_error("simulate_pipeline: p = ", p, ", v = ", v, ", expected >= 1");
  return simulate_pipeline(actions, p, v, std::vector<PassTimes>(static_cast<size_t>(p * v), times), p2p_s,
                           placement);
}

PipelineTimeline simulate_pipeline(const std::vector<std::vector<PipeAction>>& actions, int64_t p,
                                   int64_t v, const std::vector<PassTimes>& stage_times,
                                   double p2p_s, StagePlacement placement, bool overlapped_pairs) {
  const int64_t m = check_arguments(actions, p, v, stage_times, p2p_s);
  for (size_t stage = 0; stage < stage_times.size(); ++stage) {
    const PassTimes& t = stage_times[stage];
    if (!(t.hidable_forward_s >= 0 && t.hidable_forward_s <= t.forward_s) ||
        !(t.hidable_backward_s >= 0 && t.hidable_backward_s <= t.input_grad_s))
      throw_error("simulate_pipeline: stage ", stage, ": hidable forward ", t.hidable_forward_s,
                  " s of ", t.forward_s, " s, hidable backward ", t.hidable_backward_s, " s of ",
                  t.input_grad_s, " s, expected each within its pass");
  }
  const int64_t stages = p * v;
  EndTimes end(m, stages);

  PipelineTimeline timeline;
  timeline.peak_in_flight.assign(static_cast<size_t>(p), 0);
  std::vector<size_t> next(static_cast<size_t>(p), 0);  // index of each rank's next action
  std::vector<double> free_at(static_cast<size_t>(p), 0.0);
  std::vector<double> busy(static_cast<size_t>(p), 0.0);
  std::vector<int64_t> in_flight(static_cast<size_t>(p), 0);

  // When the action could start given the other stages, or nullopt while a dependency is
  // pending. The step is transported by p2p only when it crosses ranks (p = 1 keeps it local).
  auto ready_at = [&](int64_t rank, const PipeAction& a) -> std::optional<double> {
    const int64_t stage = stage_of(a.chunk, rank, p, placement);
    double t = free_at[static_cast<size_t>(rank)];
    // A message crosses ranks unless both stages are on this one (p = 1, or the V's turn).
    auto hop = [&](int64_t other_stage) {
      return rank_of_stage(other_stage, p, placement) != rank ? p2p_s : 0.0;
    };
    if (a.op == PipeOp::Forward) {
      if (stage > 0) {
        const double prev = end.forward_end(a.micro_batch, stage - 1);
        if (std::isnan(prev)) return std::nullopt;
        t = std::max(t, prev + hop(stage - 1));
      }
    } else if (a.op == PipeOp::BackwardWeight) {
      const double input_grad = end.gradient_end(a.micro_batch, stage);
      if (std::isnan(input_grad)) return std::nullopt;
      t = std::max(t, input_grad);
    } else {
      const double own = end.forward_end(a.micro_batch, stage);
      if (std::isnan(own)) return std::nullopt;
      t = std::max(t, own);
      if (stage + 1 < stages) {
        const double later = end.gradient_end(a.micro_batch, stage + 1);
        if (std::isnan(later)) return std::nullopt;
        t = std::max(t, later + hop(stage + 1));
      }
    }
    return t;
  };

  // Start times depend only on end times of earlier actions, so any order that respects the
  // dependencies gives the same timeline: sweep the ranks, advancing each as far as it can.
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int64_t rank = 0; rank < p; ++rank) {
      const auto r = static_cast<size_t>(rank);
      while (next[r] < actions[r].size()) {
        const PipeAction& a = actions[r][next[r]];
        if (overlapped_pairs && starts_forward_backward_pair(actions[r], next[r])) {
          const PipeAction& b = actions[r][next[r] + 1];
          const std::optional<double> f_ready = ready_at(rank, a), b_ready = ready_at(rank, b);
          if (!f_ready || !b_ready) break;
          const double start = std::max(*f_ready, *b_ready);
          const int64_t f_stage = stage_of(a.chunk, rank, p, placement);
          const int64_t b_stage = stage_of(b.chunk, rank, p, placement);
          const PassTimes& ft = stage_times[static_cast<size_t>(f_stage)];
          const PassTimes& bt = stage_times[static_cast<size_t>(b_stage)];
          const double computing =
              ft.forward_s - ft.hidable_forward_s + bt.backward_s() - bt.hidable_backward_s;
          const double duration = std::max({computing, ft.forward_s, bt.backward_s()});
          const double finish = start + duration;
          end.forward_end(a.micro_batch, f_stage) = finish;
          end.gradient_end(b.micro_batch, b_stage) = end.weights_end(b.micro_batch, b_stage) =
              finish;
          free_at[r] = finish;
          busy[r] += duration;
          // The forward's set is taken before the backward's is given back.
          timeline.peak_in_flight[r] = std::max(timeline.peak_in_flight[r], ++in_flight[r]);
          --in_flight[r];
          timeline.spans.push_back({rank, a.op, a.micro_batch, a.chunk, start, finish});
          timeline.spans.push_back({rank, b.op, b.micro_batch, b.chunk, start, finish});
          timeline.makespan = std::max(timeline.makespan, finish);
          next[r] += 2;
          progressed = true;
          continue;
        }
        const std::optional<double> start = ready_at(rank, a);
        if (!start) break;
        const int64_t stage = stage_of(a.chunk, rank, p, placement);
        const PassTimes& times = stage_times[static_cast<size_t>(stage)];
        double duration = times.forward_s;
        switch (a.op) {
          case PipeOp::Forward: end.forward_end(a.micro_batch, stage) = *start + duration; break;
          case PipeOp::Backward:
            duration = times.backward_s();
            end.gradient_end(a.micro_batch, stage) = end.weights_end(a.micro_batch, stage) = *start + duration;
            break;
          case PipeOp::BackwardInput:
            duration = times.input_grad_s;
            end.gradient_end(a.micro_batch, stage) = *start + duration;
            break;
          case PipeOp::BackwardWeight:
            duration = times.weight_grad_s;
            end.weights_end(a.micro_batch, stage) = *start + duration;
            break;
        }
        const double finish = *start + duration;
        free_at[r] = finish;
        busy[r] += duration;
        if (a.op == PipeOp::Forward) ++in_flight[r];
        if (a.op == PipeOp::Backward || a.op == PipeOp::BackwardWeight) --in_flight[r];
        timeline.peak_in_flight[r] = std::max(timeline.peak_in_flight[r], in_flight[r]);
        timeline.spans.push_back({rank, a.op, a.micro_batch, a.chunk, *start, finish});
        timeline.makespan = std::max(timeline.makespan, finish);
        ++next[r];
        progressed = true;
      }
    }
  }
  for (int64_t rank = 0; rank < p; ++rank) {
    const auto r = static_cast<size_t>(rank);
    if (next[r] < actions[r].size()) {
      const PipeAction& a = actions[r][next[r]];
      throw_error("simulate_pipeline: deadlock: rank ", rank, " waits forever at action ", next[r],
                  " (", op_name(a.op), " of micro-batch ", a.micro_batch, " chunk ", a.chunk,
                  "), whose input is produced after some rank's own blocked action");
    }
  }
  // The first action to run can only be a stage-0 forward, which waits on nothing and so starts
  // at 0: the makespan is the last end time.
  double idle_fraction_sum = 0;
  for (double b : busy) idle_fraction_sum += (timeline.makespan - b) / timeline.makespan;
  timeline.bubble_fraction = idle_fraction_sum / static_cast<double>(p);
  return timeline;
}

PipelineTimeline simulate_pipeline_on_shared_cores(const std::vector<std::vector<PipeAction>>& actions,
                                                   int64_t p, int64_t v, const std::vector<PassTimes>& stage_times,
                                                   double p2p_s, StagePlacement placement, double cores,
                                                   int64_t ranks_per_stage_rank) {
  if (!(cores > 0) || !std::isfinite(cores))
    throw_error("simulate_pipeline_on_shared_cores: cores = ", cores, ", expected a positive number");
  if (ranks_per_stage_rank < 1)
    throw_error("simulate_pipeline_on_shared_cores: ranks_per_stage_rank = ", ranks_per_stage_rank,
                ", expected >= 1");
  const int64_t m = check_arguments(actions, p, v, stage_times, p2p_s);
  const int64_t stages = p * v;
  EndTimes end(m, stages);
  PipelineTimeline timeline;
  timeline.peak_in_flight.assign(static_cast<size_t>(p), 0);
  struct Running {
    bool on = false;
    double left = 0, start = 0;  // full-speed seconds still to do; when it started
  };
  std::vector<Running> running(static_cast<size_t>(p));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> wall_busy(static_cast<size_t>(p), 0.0);
  std::vector<int64_t> in_flight(static_cast<size_t>(p), 0);

  // When the action's inputs are there (its own rank's order aside), or nullopt while one is
  // pending: the same dependencies as simulate_pipeline's.
  auto inputs_at = [&](int64_t rank, const PipeAction& a) -> std::optional<double> {
    const int64_t stage = stage_of(a.chunk, rank, p, placement);
    auto hop = [&](int64_t other) { return rank_of_stage(other, p, placement) != rank ? p2p_s : 0.0; };
    double t = 0;
    if (a.op == PipeOp::Forward) {
      if (stage > 0) {
        const double prev = end.forward_end(a.micro_batch, stage - 1);
        if (std::isnan(prev)) return std::nullopt;
        t = prev + hop(stage - 1);
      }
    } else if (a.op == PipeOp::BackwardWeight) {
      t = end.gradient_end(a.micro_batch, stage);
      if (std::isnan(t)) return std::nullopt;
    } else {
      t = end.forward_end(a.micro_batch, stage);
      if (std::isnan(t)) return std::nullopt;
      if (stage + 1 < stages) {
        const double later = end.gradient_end(a.micro_batch, stage + 1);
        if (std::isnan(later)) return std::nullopt;
        t = std::max(t, later + hop(stage + 1));
      }
    }
    return t;
  };
  auto work_of = [&](int64_t rank, const PipeAction& a) {
    const PassTimes& t = stage_times[static_cast<size_t>(stage_of(a.chunk, rank, p, placement))];
    switch (a.op) {
      case PipeOp::Forward: return t.forward_s;
      case PipeOp::Backward: return t.backward_s();
      case PipeOp::BackwardInput: return t.input_grad_s;
      case PipeOp::BackwardWeight: return t.weight_grad_s;
    }
    return 0.0;
  };

  // Processor sharing, event by event: every busy process runs at min(1, cores / busy
  // processes) of its full speed, the pipeline's ranks and the ranks_per_stage_rank - 1
  // replicas beside each (data, tensor, context parallel peers) in lockstep with it.
  double now = 0;
  for (;;) {
    double next_input = std::numeric_limits<double>::infinity();
    int64_t busy = 0;
    bool left_to_run = false;
    for (int64_t rank = 0; rank < p; ++rank) {
      const auto r = static_cast<size_t>(rank);
      if (!running[r].on && next[r] < actions[r].size()) {
        const PipeAction& a = actions[r][next[r]];
        if (const std::optional<double> at = inputs_at(rank, a)) {
          if (*at <= now) running[r] = {true, work_of(rank, a), now};
          else next_input = std::min(next_input, *at);
        }
      }
      left_to_run = left_to_run || next[r] < actions[r].size();
      busy += running[r].on ? 1 : 0;
    }
    if (!left_to_run) break;
    if (busy == 0 && !std::isfinite(next_input)) {
      for (int64_t rank = 0; rank < p; ++rank) {
        const auto r = static_cast<size_t>(rank);
        if (next[r] < actions[r].size()) {
          const PipeAction& a = actions[r][next[r]];
          throw_error("simulate_pipeline_on_shared_cores: deadlock: rank ", rank, " waits forever at action ",
                      next[r], " (", op_name(a.op), " of micro-batch ", a.micro_batch, " chunk ", a.chunk, ")");
        }
      }
    }
    const double rate = std::min(1.0, cores / static_cast<double>(busy * ranks_per_stage_rank));
    double step = next_input - now;
    for (const Running& run : running)
      if (run.on) step = std::min(step, run.left / rate);
    now += step;
    for (int64_t rank = 0; rank < p; ++rank) {
      const auto r = static_cast<size_t>(rank);
      Running& run = running[r];
      if (!run.on) continue;
      run.left -= rate * step;
      if (run.left > 1e-12 * std::max(1.0, now)) continue;
      const PipeAction& a = actions[r][next[r]];
      const int64_t stage = stage_of(a.chunk, rank, p, placement);
      switch (a.op) {
        case PipeOp::Forward: end.forward_end(a.micro_batch, stage) = now; break;
        case PipeOp::Backward: end.gradient_end(a.micro_batch, stage) = end.weights_end(a.micro_batch, stage) = now; break;
        case PipeOp::BackwardInput: end.gradient_end(a.micro_batch, stage) = now; break;
        case PipeOp::BackwardWeight: end.weights_end(a.micro_batch, stage) = now; break;
      }
      if (a.op == PipeOp::Forward) ++in_flight[r];
      if (a.op == PipeOp::Backward || a.op == PipeOp::BackwardWeight) --in_flight[r];
      timeline.peak_in_flight[r] = std::max(timeline.peak_in_flight[r], in_flight[r]);
      timeline.spans.push_back({rank, a.op, a.micro_batch, a.chunk, run.start, now});
      wall_busy[r] += now - run.start;
      run.on = false;
      ++next[r];
    }
  }
  timeline.makespan = now;
  double idle_fraction_sum = 0;
  for (double b : wall_busy) idle_fraction_sum += (now - b) / now;
  timeline.bubble_fraction = idle_fraction_sum / static_cast<double>(p);
  return timeline;
}

int64_t peak_activation_bytes(const std::vector<PipeAction>& rank_actions, int64_t set_bytes,
                              int64_t deferred_bytes) {
  int64_t sets = 0, deferred = 0, peak = 0;
  for (const PipeAction& a : rank_actions) {
    switch (a.op) {
      case PipeOp::Forward:
        ++sets;
        break;
      case PipeOp::Backward:
        --sets;
        break;
      case PipeOp::BackwardInput:
        ++deferred;  // W's copies are made during B, while its set is still held
        peak = std::max(peak, sets * set_bytes + deferred * deferred_bytes);
        --sets;
        break;
      case PipeOp::BackwardWeight:
        --deferred;
        break;
    }
    peak = std::max(peak, sets * set_bytes + deferred * deferred_bytes);
  }
  return peak;
}

}  // namespace loom::plan
