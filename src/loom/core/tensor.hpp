#pragma once
// A Tensor is a contiguous, row-major view into reference-counted storage that belongs to one
// memory category on one device. Kernels take raw pointers; the Tensor carries shape, dtype
// and device so that modules, checkpoints and the ops' device dispatch can check what they
// are handed. On a CUDA tensor, raw()/f32()/bf16() are device pointers.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/allocator.hpp"
#include "loom/core/dtype.hpp"

namespace loom {

using Shape = std::vector<int64_t>;
std::string shape_to_string(const Shape& shape);
int64_t shape_numel(const Shape& shape);

// Bytes owned by one allocation; returned to the allocator when the last view dies.
class Storage {
 public:
  Storage(size_t bytes, MemCategory category, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemCategory category() const { return category_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, MemCategory category, Device device = Device::CPU);
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory category, Device device = Device::CPU);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const;
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU; }
  MemCategory category() const { return storage_->category(); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size_bytes(dtype_); }
  // Row-major strides in elements (tensors are always contiguous).
  std::vector<int64_t> strides() const;

  void* raw() const;
  float* f32() const;
  uint16_t* bf16() const;

  // Same storage, new shape with the same element count.
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) along the first axis: still contiguous, shares storage.
  Tensor narrow_rows(int64_t begin, int64_t end) const;
  // `shape`'s elements starting at element `offset` of this (flattened) tensor, sharing
  // storage: how ZeRO lays many parameters over one communication buffer.
  Tensor slice_as(int64_t offset, const Shape& shape) const;

  void zero_() const;  // handles: const means the view, not the values
  // Same numel; converts between f32 and bf16, and copies between devices (synchronously).
  void copy_from(const Tensor& other) const;
  Tensor clone(MemCategory category) const;            // same device
  Tensor to(Device device, MemCategory category) const;  // a copy on `device`
  std::vector<float> to_f32_vector() const;             // from any device

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::F32;
};

}  // namespace loom
