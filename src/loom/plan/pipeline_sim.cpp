#include "loom/plan/pipeline_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "loom/core/error.hpp"

namespace loom::plan {
namespace {

constexpr double kNotYet = std::numeric_limits<double>::quiet_NaN();

const char* op_name(PipeOp op) { return op == PipeOp::Forward ? "forward" : "backward"; }

// End times of every (op, micro-batch, stage); NaN until that action has been simulated.
struct EndTimes {
  int64_t stages = 0;
  std::vector<double> forward, backward;
  EndTimes(int64_t m, int64_t stages_)
      : stages(stages_),
        forward(static_cast<size_t>(m * stages_), kNotYet),
        backward(static_cast<size_t>(m * stages_), kNotYet) {}
  double& at(PipeOp op, int64_t mb, int64_t stage) {
    auto& times = op == PipeOp::Forward ? forward : backward;
    return times[static_cast<size_t>(mb * stages + stage)];
  }
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
  for (size_t rank = 0; rank < actions.size(); ++rank) {
    std::vector<int> seen(static_cast<size_t>(2 * m * v), 0);
    for (const PipeAction& a : actions[rank])
      ++seen[static_cast<size_t>(((a.op == PipeOp::Forward ? 0 : m) + a.micro_batch) * v +
                                 a.chunk)];
    for (size_t i = 0; i < seen.size(); ++i)
      if (seen[i] != 1) {
        const auto idx = static_cast<int64_t>(i);
        throw_error("simulate_pipeline: rank ", rank, " runs ",
                    op_name(idx / v < m ? PipeOp::Forward : PipeOp::Backward), " of micro-batch ",
                    (idx / v) % m, " chunk ", idx % v, " ", seen[i], " times, expected once");
      }
  }
  return m;
}

}  // namespace

PipelineTimeline simulate_pipeline(const std::vector<std::vector<PipeAction>>& actions, int64_t p,
                                   int64_t v, double t_forward_s, double t_backward_s,
                                   double p2p_s) {
  if (p < 1 || v < 1) throw_error("simulate_pipeline: p = ", p, ", v = ", v, ", expected >= 1");
  if (static_cast<int64_t>(actions.size()) != p)
    throw_error("simulate_pipeline: ", actions.size(), " action lists for p = ", p, " ranks");
  if (!(t_forward_s > 0) || !(t_backward_s > 0) || !(p2p_s >= 0))
    throw_error("simulate_pipeline: t_forward_s = ", t_forward_s, ", t_backward_s = ", t_backward_s,
                ", p2p_s = ", p2p_s, ", expected times > 0 and p2p_s >= 0");
  const int64_t m = check_complete(actions, v);
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
    const int64_t stage = a.chunk * p + rank;
    double t = free_at[static_cast<size_t>(rank)];
    const double hop = p > 1 ? p2p_s : 0.0;
    if (a.op == PipeOp::Forward) {
      if (stage > 0) {
        const double prev = end.at(PipeOp::Forward, a.micro_batch, stage - 1);
        if (std::isnan(prev)) return std::nullopt;
        t = std::max(t, prev + hop);
      }
    } else {
      const double own = end.at(PipeOp::Forward, a.micro_batch, stage);
      if (std::isnan(own)) return std::nullopt;
      t = std::max(t, own);
      if (stage + 1 < stages) {
        const double later = end.at(PipeOp::Backward, a.micro_batch, stage + 1);
        if (std::isnan(later)) return std::nullopt;
        t = std::max(t, later + hop);
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
        const std::optional<double> start = ready_at(rank, a);
        if (!start) break;
        const double duration = a.op == PipeOp::Forward ? t_forward_s : t_backward_s;
        const double finish = *start + duration;
        end.at(a.op, a.micro_batch, a.chunk * p + rank) = finish;
        free_at[r] = finish;
        busy[r] += duration;
        in_flight[r] += a.op == PipeOp::Forward ? 1 : -1;
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

}  // namespace loom::plan
