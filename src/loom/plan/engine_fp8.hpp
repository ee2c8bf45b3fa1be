#pragma once
// What FP8 training costs loom's CPU engine, which emulates it (model/fp8_linear.hpp): every FP8
// linear layer quantises its operands to FP8 and back in f32 before the engine's f32 GEMMs run
// on them, so the GEMMs cost what they cost in f32 and the quantisations come on top. Counted
// from the engine's own FP8 layers (Transformer::enable_fp8): GPT-2's c_attn, attention c_proj,
// c_fc and MLP c_proj; Llama's q, k, v, o, gate, up and down; a mixture-of-experts layer's
// shared experts' gate, up and down and each local expert's, whole on every tp rank. Per layer
// and micro-batch, on the shapes a rank holds (column-parallel layers split their outputs over
// tp, row-parallel ones their inputs; under sequence parallelism both see the gathered rows):
//   forward   the input and the weight (per tensor; blockwise: 1 x 128 tiles, 128 x 128 blocks);
//   backward  the output gradient and the weight for the input gradient, and the input again
//             for the weight gradient (blockwise: the output gradient and the input again in
//             128 x 1 tiles). A column-parallel layer under tp > 1 runs the two halves apart
//             (its input-gradient all-reduce between them); a per-tensor recipe's weight half
//             takes the output gradient its input half quantised (Fp8Linear::
//             backward_input_half), so it is quantised once. A layer with a bias copies the
//             output gradient once more
//             for the bias gradient (Fp8Linear::backward), except a row-parallel one under tp with
// sequence parallelism (RowParallelLinear sums its bias gradient apart).
// The current recipe reduces each quantisation's amax (max) over the layer's amax group before
// it becomes a scale: the ranks of a pipeline stage (dp x cp x tp) for the dense layers, those
// holding the same experts (dp x cp x tp / ep) for the experts. One all-reduce of one float each;
// the delayed recipe makes them only in its first step (an empty history), which a steady step
// does not, and the blockwise recipe never. Every recipe also reduces the step's amaxes once a
// step (Fp8Training::finish_step: one all-reduce of 3 floats a layer per group), not charged.
#include "loom/model/config.hpp"
#include "loom/plan/hardware.hpp"
#include "loom/plan/layout.hpp"
#include "loom/plan/time_model.hpp"

namespace loom::plan {

struct EngineFp8Cost {
  double forward_s = 0, backward_s = 0;  // the quantisations (compute)
  // The current recipe's amax all-reduces each pass waits for.
  double forward_reduce_s = 0, backward_reduce_s = 0;
  // Elements quantised, per tensor or per tile kind (tests and the profile's evidence).
  double tensor_elements = 0, row_tile_elements = 0, column_tile_elements = 0, block_elements = 0;
  double bias_copy_elements = 0;
  double forward_reductions = 0, backward_reductions = 0;  // dense group's plus experts'
};

// One mean layer (its share of MoE layers weighted as time_model's layer_cost weighs them), one
// micro-batch, on a rank of `l`. Zero where job.engine_fp8.recipe is Off. Throws loom::Error
// for a hybrid model (the engine builds none) or a recipe without measured rates.
EngineFp8Cost engine_fp8_layer_cost(const ModelConfig& m, const PlanLayout& l,
                                    const ClusterSpec& cluster, const TrainingJob& job);

}  // namespace loom::plan
