#pragma once
// Pipeline timelines (Gantt charts) as standalone SVG: one row per pipeline rank, one bar per
// forward or backward pass of a micro-batch, so the bubble shows as blank space. Generic over
// where the times come from: the planner's simulated schedule or a measured training step.
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

struct TimelineSpan {
  int64_t lane = 0;         // pipeline rank, drawn as row `lane` from the top
  bool backward = false;    // forward and backward passes get different colours
  int64_t micro_batch = 0;  // written inside the bar when it is wide enough
  int64_t chunk = 0;        // model chunk of an interleaved schedule (0 otherwise); shades the bar
  double start = 0, end = 0;  // in the caller's time unit; any origin
  bool weight = false;  // a zero-bubble schedule's weight-gradient pass (W): its own colour
};

// A 1000-pixel-wide chart with rows "rank 0" ... "rank lanes-1", a time axis with round ticks
// spanning the spans, and a legend. Each span is a <rect class="span forward|backward"> whose x
// and width are proportional to start and end, with a tooltip such as
// "F mb 3 chunk 1: 1.20-2.40 ms" (the chunk only when some span has chunk > 0). Every text is
// XML-escaped and the same input gives the same bytes.
// Throws loom::Error if lanes < 1, or a span has a lane outside [0, lanes), a negative chunk,
// a non-finite time, or end < start.
std::string render_timeline_svg(const std::vector<TimelineSpan>& spans, int64_t lanes,
                                const std::string& title, const std::string& time_unit_label,
                                const std::string& subtitle = "");

}  // namespace loom
