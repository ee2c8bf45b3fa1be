#pragma once
// The planner's layouts are the engine's (parallel/parallel_layout): one struct, one parser and
// one check_layout, so a layout `loom plan` prints runs as `--layout` and in the [parallel]
// table. The planner ranks layouts that pass LayoutRules::Valid and marks those the engine
// does not run yet (engine_support_note).
#include "loom/parallel/parallel_layout.hpp"

namespace loom::plan {

using PlanLayout = loom::ParallelLayout;
using loom::check_layout;
using loom::engine_support_note;
using loom::LayoutRules;
using loom::parse_layout;
using loom::PipelineSchedule;

}  // namespace loom::plan
