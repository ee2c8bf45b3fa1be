// The one op-layer answer the config parser asks for (train_config.cpp checks head_dim against
// the CUDA attention kernel), as kernels/ops.cpp gives it in a build without CUDA. Linking
// ops.cpp itself would pull in every CPU kernel and OpenBLAS for one constant.
#include <limits>

#include "loom/kernels/ops.hpp"

namespace loom::ops {
int64_t max_attention_head_dim(Device device) {
  return device == Device::CPU ? std::numeric_limits<int64_t>::max() : 0;
}
}  // namespace loom::ops
