// attention_cudnn.hpp where loom was configured without the cudnn-frontend headers
// (LOOM_CUDNN_FRONTEND_INCLUDE): every call says so.
#include "loom/kernels/cuda/attention_cudnn.hpp"

#if !defined(LOOM_HAVE_CUDNN)
#include "loom/core/error.hpp"

namespace loom::cuda::detail {

namespace {
const char* const kNotBuilt =
    "loom was built without cuDNN attention: configure with LOOM_CUDNN_FRONTEND_INCLUDE pointing "
    "at cudnn-frontend's include directory (tools/device/pack.sh puts it in "
    ".device/cudnn-frontend/include)";
}

std::string cudnn_attention_refusal(const cpu::AttentionShape&,
                                    std::initializer_list<const void*>) {
  return kNotBuilt;
}

void cudnn_attention_forward(__nv_bfloat16*, float*, const __nv_bfloat16*,
                             const cpu::AttentionShape&, cudaStream_t) {
  throw_error(kNotBuilt);
}

void cudnn_attention_backward(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                              const __nv_bfloat16*, const float*, const cpu::AttentionShape&,
                              cudaStream_t) {
  throw_error(kNotBuilt);
}

}  // namespace loom::cuda::detail
#endif  // !LOOM_HAVE_CUDNN
