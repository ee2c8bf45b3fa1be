#pragma once
// The planner's two pictures: per-GPU memory by category for each candidate layout (stacked
// bars against the usable HBM), and the predicted pipeline timeline of one layout, replayed
// from the same schedule action lists and chunk times the step-time prediction used.
#include <string>
#include <vector>

#include "loom/plan/search.hpp"

namespace loom::plan {

// Memory in GiB per candidate, bottom to top: parameters, gradients, optimizer state,
// activations, communication buffers, workspace; a dashed line at `usable_bytes`.
std::string memory_chart_svg(const std::vector<Candidate>& candidates, double usable_bytes, const std::string& title);

// Every forward and backward of every pipeline rank over one step, in milliseconds, with the
// simulated bubble fraction in the subtitle. Throws loom::Error when the step has more than
// `max_spans` actions (a picture nobody can read; the JSON output has the numbers).
std::string pipeline_timeline_svg(const Candidate& candidate, const std::string& title, int64_t max_spans = 20000);

}  // namespace loom::plan
