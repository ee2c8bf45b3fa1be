#pragma once
// The playbook's three steps over every layout of a job: (1) fit the model in GPU memory,
// (2) reach the global batch, (3) maximise throughput. Every valid (tp, pp, v, dp, cp, ZeRO
// stage, micro-batch, recomputation) for the cluster's GPU count is enumerated, pruned by
// memory, and ranked by predicted tokens/s. Layouts this engine does not run yet are ranked
// too (the planner plans for any engine) and carry a note saying what is missing.
#include <string>
#include <vector>

#include "loom/plan/time_model.hpp"

namespace loom::plan {

struct Candidate {
  PlanLayout layout;
  MemoryBreakdown memory;
  StepTime time;
  std::string engine_note;  // "" when loom's engine runs the layout (engine_support_note)
};

struct SearchResult {
  int64_t valid = 0;        // layouts the model and the GPU count allow
  int64_t fitting = 0;      // step 1: of those, within usable memory
  int64_t batch_ok = 0;     // step 2: of those, splitting the global batch
  Candidate least_memory;   // the valid layout needing the least memory (step 1's witness)
  std::vector<Candidate> ranked;  // step 3: fitting, batch-splitting, fastest first
  double usable_bytes = 0;        // HBM minus the fragmentation allowance
  // When nothing fits: the smallest GPU count of this kind with a fitting layout (0 if none up
  // to 2^22 GPUs), so the error can say what would.
  int64_t gpus_needed = 0;
};

// Fraction of HBM the planner lets a layout use: the rest is left to the allocator's
// fragmentation (the ZeRO paper, sec. 3.2, reports OOMs with over 30% free; PyTorch's caching
// allocator typically loses 5-10%).
constexpr double kUsableMemoryFraction = 0.9;

// Whether a rank's predicted peak fits in `hbm_bytes`: the whole of it within
// kUsableMemoryFraction of HBM. With `contiguous_states` (Megatron-Core: parameters and
// gradients live in the ParamAndGradBuffer and the distributed optimizer's shards in buffers
// allocated once at start, docs/source/api-guide/dist_optimizer.md) the model states and the
// workspace do not fragment: the allowance falls on the activations and communication buffers
// the allocator hands out and takes back each step.
bool fits_in_hbm(const MemoryBreakdown& memory, double hbm_bytes, bool contiguous_states);

// What loom's engine lacks to run `layout` on `gpu`: engine_support_note's missing features, and
// that loom's GPU engine is CUDA, so an AMD part runs none of it, and that it trains every weight
// (a frozen base, TrainingJob::frozen_base, is LoRA's), and that it trains FP8 but neither
// MXFP8 nor NVFP4 (`job`'s precision). "" when it runs.
std::string engine_note_on(const GpuSpec& gpu, const PlanLayout& layout, const ModelConfig& model,
                           int64_t seq_len, const TrainingJob& job);

SearchResult search_layouts(const ModelConfig& model, const ClusterSpec& cluster, const TrainingJob& job,
                            int64_t simulate_top = 32);

// One line on why the winner beats the runner-up: the step-time component that differs most.
std::string explain_winner(const SearchResult& result);

}  // namespace loom::plan
