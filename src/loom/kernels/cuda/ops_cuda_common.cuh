#pragma once
// What the CUDA branch of the op layer's files share: raw pointers of Tensors by dtype, the
// one dtype check of a call's activations, and host ids uploaded for the kernels.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::ops::cuda_impl {

using bf16 = __nv_bfloat16;

inline bf16* b16(const Tensor& t) {
  return t.defined() ? reinterpret_cast<bf16*>(t.bf16()) : nullptr;
}
inline float* f32(const Tensor& t) { return t.defined() ? t.f32() : nullptr; }
inline float* f32(const Tensor* t) { return t != nullptr && t->defined() ? t->f32() : nullptr; }
inline bf16* b16(const Tensor* t) { return t != nullptr && t->defined() ? b16(*t) : nullptr; }

// Whether the activations of one call are bf16 (else f32); every one of them must agree.
inline bool is_bf16(const char* op, std::initializer_list<const Tensor*> activations) {
  const Tensor* first = nullptr;
  for (const Tensor* t : activations) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr)
      first = t;
    else if (t->dtype() != first->dtype())
      throw_error("ops::", op, " (cuda): activations and weights mix ", dtype_name(first->dtype()),
                  " and ", dtype_name(t->dtype()));
  }
  return first != nullptr && first->dtype() == DType::BF16;
}

// Host ids to a device copy for the kernels queued after it on the current stream. The copy is
// asynchronous: from pageable memory, cudaMemcpyAsync returns once the ids are staged, so the
// caller may reuse its array at once and the host never waits for the device. The buffer goes
// back to the caching allocator when this dies, before the kernels have run: its next user is
// queued on the same stream, behind them (the allocator's stream rule). Null host ids (an
// optional argument left out) give a null device pointer.
class DeviceIds {
 public:
  DeviceIds(const int32_t* ids, int64_t n) {
    static_assert(sizeof(int32_t) == sizeof(float));
    if (ids == nullptr || n <= 0) return;
    ids_ = Tensor::empty({n}, DType::F32, MemCategory::Workspace, Device::CUDA);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(ids_.raw(), ids, static_cast<size_t>(n) * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, cuda::current_stream()));
  }
  DeviceIds(const DeviceIds&) = delete;
  DeviceIds& operator=(const DeviceIds&) = delete;
  const int32_t* get() const {
    return ids_.defined() ? static_cast<const int32_t*>(ids_.raw()) : nullptr;
  }

 private:
  Tensor ids_;
};

}  // namespace loom::ops::cuda_impl
