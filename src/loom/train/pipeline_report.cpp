#include "loom/train/pipeline_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loom/dist/tensor_comm.hpp"
#include "loom/ckpt/atomic_file.hpp"
#include "loom/core/error.hpp"
#include "loom/obs/timeline_svg.hpp"

namespace loom {

double textbook_bubble(PipelineSchedule schedule, int64_t p, int64_t m, int64_t v) {
  const double idle_slots = static_cast<double>(p - 1);
  switch (schedule) {
    case PipelineSchedule::Interleaved: return idle_slots / static_cast<double>(v * m);
    // Idle (p - 1)(F + B - W) against busy m (F + B + W) (Qi et al. 2023, sec 3.1), with the
    // three passes equally long: (p - 1) / 3m.
    case PipelineSchedule::ZeroBubbleH1: return idle_slots / static_cast<double>(3 * m);
    // Idle (p - 1) chunk passes against busy 6m (F, B and W of two chunks per micro-batch) with
    // the three equally long: the last rank's wait for the first activation down the V.
    case PipelineSchedule::ZeroBubbleV:
    case PipelineSchedule::DualPipeV: return idle_slots / static_cast<double>(6 * m);
    default: return idle_slots / static_cast<double>(m);
  }
}

double measured_bubble(const std::vector<std::vector<ActionTiming>>& ranks) {
  double first = 0, last = 0;
  bool any = false;
  for (const auto& rank : ranks)
    for (const ActionTiming& t : rank) {
      first = any ? std::min(first, t.start_s) : t.start_s;
      last = any ? std::max(last, t.end_s) : t.end_s;
      any = true;
    }
  if (!any) throw_error("pipeline report: no actions were timed");
  double sum = 0;
  for (const auto& rank : ranks) {
    double busy = 0;
    for (const ActionTiming& t : rank) busy += t.end_s - t.start_s;
    if (busy <= 0) throw_error("pipeline report: a rank has no busy time");
    sum += (last - first - busy) / busy;
  }
  return sum / static_cast<double>(ranks.size());
}

std::optional<PipelineBubble> report_pipeline_step(ProcessGroup& pp,
                                                   const std::vector<ActionTiming>& mine,
                                                   PipelineSchedule schedule, int64_t m, int64_t v,
                                                   const std::string& svg_path) {
  constexpr int64_t kFields = 5;  // op, micro-batch, chunk, start, end
  // Ranks may run different counts (DualPipeV splits only some backwards into B and W): every
  // rank sends the most, padded with rows of op -1.
  float most = static_cast<float>(mine.size());
  comm::all_reduce(pp, &most, 1, ReduceOp::Max)->wait();
  const auto actions = static_cast<int64_t>(most);
  std::vector<float> packed;
  for (const ActionTiming& t : mine)
    for (double x : {static_cast<double>(t.op), static_cast<double>(t.micro_batch),
                     static_cast<double>(t.chunk), t.start_s, t.end_s})
      packed.push_back(static_cast<float>(x));
  packed.resize(static_cast<size_t>(actions * kFields), -1.0f);
  std::vector<float> all(packed.size() * static_cast<size_t>(pp.size()));
  comm::all_gather(pp, packed.data(), all.data(), actions * kFields)->wait();
  if (pp.rank() != 0) return std::nullopt;

  std::vector<std::vector<ActionTiming>> ranks(static_cast<size_t>(pp.size()));
  std::vector<TimelineSpan> spans;
  for (int r = 0; r < pp.size(); ++r)
    for (int64_t a = 0; a < actions; ++a) {
      const float* f = all.data() + (r * actions + a) * kFields;
      if (f[0] < 0) continue;  // padding
      const ActionTiming t{static_cast<PipeOp>(std::lround(f[0])), static_cast<int64_t>(f[1]),
                           static_cast<int64_t>(f[2]), f[3], f[4]};
      ranks[static_cast<size_t>(r)].push_back(t);
      spans.push_back({r, t.op != PipeOp::Forward, t.micro_batch, t.chunk, t.start_s * 1e3,
                       t.end_s * 1e3, t.op == PipeOp::BackwardWeight});
    }
  PipelineBubble bubble;
  bubble.measured = measured_bubble(ranks);
  bubble.textbook = textbook_bubble(schedule, pp.size(), m, v);
  for (const auto& rank : ranks)
    for (const ActionTiming& t : rank) bubble.makespan_s = std::max(bubble.makespan_s, t.end_s);
  char subtitle[160];
  std::snprintf(subtitle, sizeof(subtitle),
                "p = %d, m = %lld, v = %lld: bubble measured %.1f%%, textbook %.1f%%", pp.size(),
                static_cast<long long>(m), static_cast<long long>(v), 100 * bubble.measured,
                100 * bubble.textbook);
  if (!svg_path.empty())
    atomic_write_file(svg_path, render_timeline_svg(
                                    spans, pp.size(),
                                    std::string("pipeline step (") + schedule_name(schedule) + ")",
                                    "ms", subtitle));
  return bubble;
}

}  // namespace loom
