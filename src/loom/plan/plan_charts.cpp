#include "loom/plan/plan_charts.hpp"

#include <cstdio>

#include "loom/core/error.hpp"
#include "loom/obs/bar_chart_svg.hpp"
#include "loom/obs/timeline_svg.hpp"
#include "loom/plan/pipeline_sim.hpp"

namespace loom::plan {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

std::string memory_chart_svg(const std::vector<Candidate>& candidates, double usable_bytes, const std::string& title) {
  std::vector<StackedBar> bars;
  for (const Candidate& c : candidates) {
    const MemoryBreakdown& m = c.memory;
    bars.push_back({c.layout.describe(),
                    {m.parameters / kGiB, m.gradients / kGiB, m.optimizer_state / kGiB, m.activations / kGiB,
                     m.comm_buffers / kGiB, m.workspace / kGiB}});
  }
  return render_stacked_bar_chart_svg(
      bars, {"parameters", "gradients", "optimizer state", "activations", "comm buffers", "workspace"}, title,
      "GiB per GPU", usable_bytes / kGiB, "usable HBM");
}

std::string pipeline_timeline_svg(const Candidate& candidate, const std::string& title, int64_t max_spans) {
  const PlanLayout& l = candidate.layout;
  const StepTime& t = candidate.time;
  const int64_t actions = 2 * l.pp * l.vp * t.micro_batches;
  if (actions > max_spans)
    throw_error("pipeline timeline: ", actions, " forward and backward passes in one step (pp ", l.pp, " x v ", l.vp, " x ",
                t.micro_batches, " micro-batches x 2) exceed the ", max_spans, " a readable chart can show");
  const PipelineTimeline timeline = simulate_pipeline(pipeline_actions(l.schedule, l.pp, t.micro_batches, l.vp), l.pp, l.vp,
                                                      t.chunk_forward_s, t.chunk_backward_s, l.pp > 1 ? t.p2p_s : 0,
                                                      stage_placement(l.schedule));
  std::vector<TimelineSpan> spans;
  for (const PipelineTimeline::Span& s : timeline.spans)
    spans.push_back({s.rank, s.op != PipeOp::Forward, s.micro_batch, s.chunk, 1e3 * s.start, 1e3 * s.end,
                     s.op == PipeOp::BackwardWeight});
  char subtitle[256];
  std::snprintf(subtitle, sizeof subtitle, "%s | %lld micro-batches | simulated bubble %.1f%% of the pipeline's time",
                l.describe().c_str(), static_cast<long long>(t.micro_batches), 100 * timeline.bubble_fraction);
  return render_timeline_svg(spans, l.pp, title, "ms", subtitle);
}

}  // namespace loom::plan
