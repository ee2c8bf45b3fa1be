#pragma once
// Which global pipeline stage each of a rank's model chunks is. The model is cut into v * p
// stages of consecutive layers (model/pipeline_layout); a schedule decides how they are dealt
// over the p ranks (parallel/pipeline_schedule's stage_placement), and everything that moves
// data between stages (the executor's transfers and channels, the activation pool, the tied
// embedding's owners, the planner's simulation and memory model) asks here.
// - RoundRobin: stage = chunk * p + rank (Narayanan et al. 2021 sec 2.2.2: rank r holds stages
//   r, r + p, r + 2p, ...), so activations go round the ring r -> r + 1 (mod p).
// - V (v = 2; Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", sec 3): rank r
//   holds stage r (chunk 0) and stage 2p - 1 - r (chunk 1). Activations go down the ranks
//   0..p-1 and back up p-1..0, so the first and last stage share rank 0 (a tied embedding needs
//   no second copy) and the turn at rank p - 1 passes between its own two chunks locally.
#include <cstdint>
#include <vector>

#include "loom/model/pipeline_layout.hpp"

namespace loom {

enum class StagePlacement { RoundRobin, V };

int64_t stage_of(int64_t chunk, int64_t rank, int64_t p, StagePlacement placement);
// The rank holding `stage` (of v * p stages).
int64_t rank_of_stage(int64_t stage, int64_t p, StagePlacement placement);

// pipeline_chunks under `placement`: the chunks rank `rank` of `pp` holds, in chunk order.
// The V placement needs exactly 2 pp stages; throws loom::Error otherwise.
std::vector<ModelChunk> pipeline_chunks(const std::vector<int64_t>& layers_per_stage, int64_t pp,
                                        int64_t rank, StagePlacement placement);

}  // namespace loom
