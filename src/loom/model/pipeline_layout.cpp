#include "loom/model/pipeline_layout.hpp"

#include <numeric>

#include "loom/core/error.hpp"

namespace loom {

std::vector<int64_t> stage_layer_counts(int64_t n_layer, int64_t stages,
                                        const std::vector<int64_t>& given, const std::string& key) {
  if (stages < 1) throw_error("pipeline: ", stages, " stages, expected >= 1");
  if (stages > n_layer)
    throw_error("pipeline: ", stages,
                " stages (parallel.pp x parallel.pp_chunks) for model.n_layer = ", n_layer,
                " layers leaves a stage without a layer: use at most ", n_layer, " stages");
  if (given.empty()) {
    std::vector<int64_t> counts(static_cast<size_t>(stages), n_layer / stages);
    for (int64_t s = 0; s < n_layer % stages; ++s) ++counts[static_cast<size_t>(s)];
    return counts;
  }
  if (static_cast<int64_t>(given.size()) != stages)
    throw_error("config key '", key, "' lists ", given.size(), " stages, expected ", stages,
                " (parallel.pp x parallel.pp_chunks)");
  for (size_t s = 0; s < given.size(); ++s)
    if (given[s] < 1)
      throw_error("config key '", key, "' gives stage ", s, " ", given[s],
                  " layers, expected >= 1");
  const int64_t sum = std::accumulate(given.begin(), given.end(), int64_t{0});
  if (sum != n_layer)
    throw_error("config key '", key, "' adds up to ", sum,
                " layers, expected model.n_layer = ", n_layer);
  return given;
}

std::vector<ModelChunk> pipeline_chunks(const std::vector<int64_t>& layers_per_stage, int64_t pp,
                                        int64_t rank) {
  const auto stages = static_cast<int64_t>(layers_per_stage.size());
  if (pp < 1 || stages % pp != 0)
    throw_error("pipeline: ", stages, " stages do not split over pp = ", pp, " ranks");
  if (rank < 0 || rank >= pp) throw_error("pipeline: rank ", rank, " is outside [0, ", pp, ")");
  std::vector<int64_t> first(static_cast<size_t>(stages) + 1, 0);
  for (int64_t s = 0; s < stages; ++s)
    first[static_cast<size_t>(s + 1)] =
        first[static_cast<size_t>(s)] + layers_per_stage[static_cast<size_t>(s)];
  std::vector<ModelChunk> chunks;
  for (int64_t stage = rank; stage < stages; stage += pp)
    chunks.push_back(
        {stage, stages, first[static_cast<size_t>(stage)], first[static_cast<size_t>(stage + 1)]});
  return chunks;
}

std::vector<ModelChunk> whole_model(int64_t n_layer) { return {ModelChunk{0, 1, 0, n_layer}}; }

}  // namespace loom
