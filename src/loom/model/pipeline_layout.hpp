#pragma once
// How the model's layers are cut into pipeline stages and which stages a pipeline rank holds.
// The model is cut into pp * v stages of consecutive layers; rank r holds stages r, r + pp,
// ..., r + (v - 1) pp (its v "chunks", Narayanan et al. 2021 sec 2.2.2), so with v = 1 rank r
// is stage r. The first stage also holds the embeddings, the last the final norm and the
// output head; with tied embeddings the last stage holds a copy of the token embedding, kept
// in sync with the first stage's by summing their gradients (Megatron-LM's embedding group).
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

// One pipeline stage held by a rank: layers [first_layer, end_layer).
struct ModelChunk {
  int64_t stage = 0, stages = 1;
  int64_t first_layer = 0, end_layer = 0;
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == stages - 1; }
  int64_t layers() const { return end_layer - first_layer; }
};

// Layers of each of `stages` stages. `given` empty: as even as possible, the first
// n_layer % stages stages taking one layer more (the last stage also runs the output head, the
// largest GEMM, so it is never the one given an extra layer). Otherwise `given` is used as is.
// Throws loom::Error, naming `key` (the config key of `given`) and what would work, when a stage
// would have no layer (stages > n_layer) or `given` has the wrong count or sum.
std::vector<int64_t> stage_layer_counts(int64_t n_layer, int64_t stages,
                                        const std::vector<int64_t>& given = {},
                                        const std::string& key = "parallel.pp_layers");

// The chunks pipeline rank `rank` of `pp` holds, in chunk order, for `layers_per_stage`
// (pp * v entries).
std::vector<ModelChunk> pipeline_chunks(const std::vector<int64_t>& layers_per_stage, int64_t pp,
                                        int64_t rank);

// The whole model as one stage: what a process without pipeline parallelism holds.
std::vector<ModelChunk> whole_model(int64_t n_layer);

}  // namespace loom
