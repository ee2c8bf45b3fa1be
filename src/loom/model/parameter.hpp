#pragma once
// A trainable parameter: its value, its gradient, and what the optimizer and checkpoints
// need to know about it. `name` is the Hugging Face name, so checkpoints need no renaming
// table. Values are stored [out, in] for every linear layer; GPT-2's HF Conv1D layers are
// [in, out], so those parameters carry `hf_transposed` and checkpoints transpose them.
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom {

// How a parameter is laid out across the device mesh. Only single-process placement exists
// today; the distributed runtime adds sharded placements per mesh axis.
struct Placement {
  bool replicated = true;
};

struct Parameter {
  std::string name;
  Tensor value;  // f32; under bf16 mixed precision it holds bf16-rounded values and the
                 // fp32 masters live in the optimizer
  Tensor grad;   // f32 gradient accumulator, same shape
  bool weight_decay = true;
  bool hf_transposed = false;
  Placement placement;
};

using ParameterList = std::vector<Parameter*>;

}  // namespace loom
