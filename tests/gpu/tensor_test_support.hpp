#pragma once
// Tensors for the GPU tests that go through kernels/ops: host f32 tensors from values, copies on
// the GPU in f32 or bf16, zeros on either device, and the values a bf16 copy holds.
#include <cstring>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/ops.hpp"

namespace loom::cuda::test {

inline Tensor host_tensor(const std::vector<float>& values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::F32, MemCategory::Workspace);
  std::memcpy(t.f32(), values.data(), values.size() * sizeof(float));
  return t;
}
inline Tensor host_zeros(const Shape& shape) {
  return Tensor::zeros(shape, DType::F32, MemCategory::Workspace);
}
inline Tensor on_cuda(const Tensor& t, DType dtype = DType::F32) {
  Tensor d = Tensor::empty(t.shape(), dtype, MemCategory::Activations, Device::CUDA);
  d.copy_from(t);
  return d;
}
inline Tensor cuda_zeros(const Shape& shape, DType dtype = DType::F32) {
  return Tensor::zeros(shape, dtype, MemCategory::Activations, Device::CUDA);
}
// The host tensor with every value rounded to bf16 (what a bf16 device copy holds).
inline Tensor rounded(const Tensor& t) {
  Tensor r = t.clone(MemCategory::Workspace);
  ops::round_to_bf16_(r);
  return r;
}

}  // namespace loom::cuda::test
