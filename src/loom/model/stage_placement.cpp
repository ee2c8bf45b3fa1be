#include "loom/model/stage_placement.hpp"

#include "loom/core/error.hpp"

namespace loom {

int64_t stage_of(int64_t chunk, int64_t rank, int64_t p, StagePlacement placement) {
  if (placement == StagePlacement::V) return chunk == 0 ? rank : 2 * p - 1 - rank;
  return chunk * p + rank;
}

int64_t rank_of_stage(int64_t stage, int64_t p, StagePlacement placement) {
  if (placement == StagePlacement::V) return stage < p ? stage : 2 * p - 1 - stage;
  return stage % p;
}

std::vector<ModelChunk> pipeline_chunks(const std::vector<int64_t>& layers_per_stage, int64_t pp,
                                        int64_t rank, StagePlacement placement) {
  if (placement == StagePlacement::RoundRobin) return pipeline_chunks(layers_per_stage, pp, rank);
  const auto stages = static_cast<int64_t>(layers_per_stage.size());
  if (pp < 1 || stages != 2 * pp)
    throw_error("pipeline: the V placement cuts the model into 2 x pp = ", 2 * pp,
                " stages (two chunks per rank), not ", stages);
  if (rank < 0 || rank >= pp) throw_error("pipeline: rank ", rank, " is outside [0, ", pp, ")");
  std::vector<int64_t> first(static_cast<size_t>(stages) + 1, 0);
  for (int64_t s = 0; s < stages; ++s)
    first[static_cast<size_t>(s + 1)] =
        first[static_cast<size_t>(s)] + layers_per_stage[static_cast<size_t>(s)];
  std::vector<ModelChunk> chunks;
  for (int64_t chunk = 0; chunk < 2; ++chunk) {
    const int64_t stage = stage_of(chunk, rank, pp, placement);
    chunks.push_back(
        {stage, stages, first[static_cast<size_t>(stage)], first[static_cast<size_t>(stage + 1)]});
  }
  return chunks;
}

}  // namespace loom
