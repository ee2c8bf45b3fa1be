#pragma once
// What the op implementations (ops.cpp, ops_shard.cpp) share: the argument checks and the
// dispatch to the CUDA implementation. Internal to kernels/.
#include <initializer_list>
#include <span>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#ifdef LOOM_HAVE_CUDA
#include "loom/kernels/cuda/ops_cuda.hpp"
#endif

namespace loom::ops::detail {

// The device every defined tensor of one call lives on; a mix is an error naming the op.
inline Device device_of(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr)
      first = t;
    else if (t->device() != first->device())
      throw_error("ops::", op, ": tensors on ", device_name(first->device()), " and ",
                  device_name(t->device()),
                  " in one call (every tensor of an op must be on one device)");
  }
  if (first == nullptr) throw_error("ops::", op, ": no tensor given");
  return first->device();
}

// The CPU computes in f32 (bf16 is emulated by rounding f32 values), so its tensors are F32.
inline void require_cpu_f32(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t != nullptr && t->defined() && t->dtype() != DType::F32)
      throw_error("ops::", op, ": a ", dtype_name(t->dtype()), " tensor ",
                  shape_to_string(t->shape()),
                  " on the CPU, which computes in f32 (bf16 is emulated in f32 storage there)");
}

inline void require_2d(const char* op, const char* what, const Tensor& t) {
  if (t.dim() != 2)
    throw_error("ops::", op, ": ", what, " must be 2-D, got ", shape_to_string(t.shape()));
}

inline float* f32_or_null(const Tensor& t) { return t.defined() ? t.f32() : nullptr; }

// Position ids for `rows` rows (from `first` of the whole batch), each below `table_rows`,
// checked on the host (a device kernel indexes its table with them). Returns the whole batch's
// ids, the pointer the kernels take (null: each row's index).
inline const int32_t* checked_positions(const char* op, std::span<const int32_t> positions,
                                        int64_t first, int64_t rows, int64_t table_rows) {
  if (positions.empty()) return nullptr;
  if (static_cast<int64_t>(positions.size()) < first + rows)
    throw_error("ops::", op, ": ", positions.size(), " position ids for rows up to ", first + rows);
  for (int64_t r = first; r < first + rows; ++r)
    if (positions[static_cast<size_t>(r)] < 0 || positions[static_cast<size_t>(r)] >= table_rows)
      throw_error("ops::", op, ": position ", positions[static_cast<size_t>(r)], " of row ", r,
                  " is outside the table's [0, ", table_rows, ")");
  return positions.data();
}
inline float* f32_or_null(const Tensor* t) {
  return t != nullptr && t->defined() ? t->f32() : nullptr;
}

}  // namespace loom::ops::detail

// Returns cuda_impl::call when `device` is CUDA (in a loom built with it).
#ifdef LOOM_HAVE_CUDA
#define LOOM_OPS_ON_CUDA(device, call) \
  if ((device) == Device::CUDA) return cuda_impl::call;
#else
#define LOOM_OPS_ON_CUDA(device, call) (void)(device);
#endif
