#pragma once
// What the CUDA branch of the op layer's files share: raw pointers of Tensors by dtype and the
// one dtype check of a call's activations.
#include <cuda_bf16.h>

#include <initializer_list>

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

}  // namespace loom::ops::cuda_impl
