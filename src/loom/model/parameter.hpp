#pragma once
// A trainable parameter: its value, its gradient, and what the optimizer and checkpoints
// need to know about it. `name` is the Hugging Face name, so checkpoints need no renaming
// table. Values are stored [out, in] for every linear layer; GPT-2's HF Conv1D layers are
// [in, out], so those parameters carry `hf_transposed` and checkpoints transpose them.
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom {

// How a parameter is laid out over the tensor-parallel ranks: the same whole tensor on every
// rank (replicated), or one rank's shard of a whole tensor of `full_shape`. A shard is cut
// along `axis` (0: rows, as a column-parallel weight or the vocabulary; 1: columns, as a
// row-parallel weight). Each of `segments` (extents along the axis that add up to the full
// one; empty means one segment) is cut on its own into `ranks` blocks of ceil(extent / ranks),
// the last possibly shorter, and the rank's blocks are concatenated in segment order: a fused
// q|k|v weight gives rank r its heads of q, of k and of v. model/tensor_shard.hpp cuts and
// pastes shards; initialisation, clipping and checkpoints read the placement.
struct Placement {
  bool replicated = true;
  Shape full_shape;
  int axis = 0;
  std::vector<int64_t> segments;
  int rank = 0, ranks = 1;
};

struct Parameter {
  std::string name;
  Tensor value;  // f32; under bf16 mixed precision it holds bf16-rounded values and the
                 // fp32 masters live in the optimizer
  Tensor grad;   // f32 gradient accumulator, same shape
  bool weight_decay = true;
  bool hf_transposed = false;
  Placement placement;
  // A replica of a parameter an earlier pipeline stage owns (the last stage's copy of a tied
  // token embedding): its gradient is summed with the owner's, and the owner alone counts it
  // in the gradient norm and writes it to checkpoints.
  bool pipeline_copy = false;
  // A routed expert's weight under expert parallelism: held by one rank of the ep group (the
  // others hold other experts), so its gradient is averaged over the expert-data-parallel
  // ranks (dp x cp) instead of every replica, and its square counts once per ep rank in the norm.
  bool expert_sharded = false;
};

using ParameterList = std::vector<Parameter*>;

}  // namespace loom
