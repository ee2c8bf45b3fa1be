#include "loom/core/tensor.hpp"

#include <cstring>

#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"

namespace loom {

std::string shape_to_string(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) throw_error("negative dimension in shape ", shape_to_string(shape));
    n *= s;
  }
  return n;
}

Storage::Storage(size_t bytes, MemCategory category, Device device)
    : bytes_(bytes), category_(category), device_(device) {
  data_ = device_memory::allocate(device, bytes, category);
}

Storage::~Storage() { device_memory::release(device_, data_, bytes_, category_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), category, device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory category, Device device) {
  Tensor t = empty(shape, dtype, category, device);
  t.zero_();
  return t;
}

int64_t Tensor::size(int64_t axis) const {
  if (axis < 0) axis += dim();
  LOOM_CHECK(axis >= 0 && axis < dim());
  return shape_[static_cast<size_t>(axis)];
}

std::vector<int64_t> Tensor::strides() const {
  std::vector<int64_t> out(shape_.size(), 1);
  for (int64_t i = dim() - 2; i >= 0; --i)
    out[static_cast<size_t>(i)] = out[static_cast<size_t>(i + 1)] * shape_[static_cast<size_t>(i + 1)];
  return out;
}

void* Tensor::raw() const {
  LOOM_CHECK(storage_ != nullptr, "tensor is undefined");
  return static_cast<char*>(storage_->data()) + offset_bytes_;
}

float* Tensor::f32() const {
  LOOM_CHECK(dtype_ == DType::F32, "tensor is ", dtype_name(dtype_));
  return static_cast<float*>(raw());
}

uint16_t* Tensor::bf16() const {
  LOOM_CHECK(dtype_ == DType::BF16, "tensor is ", dtype_name(dtype_));
  return static_cast<uint16_t*>(raw());
}

Tensor Tensor::view(const Shape& shape) const {
  if (shape_numel(shape) != numel_)
    throw_error("cannot view ", shape_to_string(shape_), " as ", shape_to_string(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::narrow_rows(int64_t begin, int64_t end) const {
  LOOM_CHECK(dim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0]);
  const int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  t.offset_bytes_ += static_cast<size_t>(begin * row) * dtype_size_bytes(dtype_);
  return t;
}

Tensor Tensor::slice_as(int64_t offset, const Shape& shape) const {
  const int64_t count = shape_numel(shape);
  LOOM_CHECK(offset >= 0 && count >= 0 && offset + count <= numel_);
  Tensor t = *this;
  t.shape_ = shape;
  t.numel_ = count;
  t.offset_bytes_ += static_cast<size_t>(offset) * dtype_size_bytes(dtype_);
  return t;
}

void Tensor::zero_() const { device_memory::fill_zero(raw(), device(), nbytes()); }

void Tensor::copy_from(const Tensor& other) const {
  if (other.numel_ != numel_)
    throw_error("copy between ", shape_to_string(other.shape_), " and ", shape_to_string(shape_));
  if (dtype_ == other.dtype_) {
    device_memory::copy(raw(), device(), other.raw(), other.device(), nbytes());
  } else if (device() != Device::CPU || other.device() != Device::CPU) {
    // A conversion touching a device goes through the host (setup and checkpoints only; the
    // ops convert on the device).
    const Tensor host_src = other.device() == Device::CPU ? other : other.to(Device::CPU, MemCategory::Workspace);
    Tensor host_dst = Tensor::empty(shape_, dtype_, MemCategory::Workspace);
    host_dst.copy_from(host_src);
    copy_from(host_dst);
  } else if (dtype_ == DType::F32) {
    const uint16_t* src = other.bf16();
    float* dst = f32();
    for (int64_t i = 0; i < numel_; ++i) dst[i] = bf16_to_f32(src[i]);
  } else {
    const float* src = other.f32();
    uint16_t* dst = bf16();
    for (int64_t i = 0; i < numel_; ++i) dst[i] = f32_to_bf16(src[i]);
  }
}

Tensor Tensor::clone(MemCategory category) const {
  Tensor t = empty(shape_, dtype_, category, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device device, MemCategory category) const {
  Tensor t = empty(shape_, dtype_, category, device);
  t.copy_from(*this);
  return t;
}

std::vector<float> Tensor::to_f32_vector() const {
  if (device() != Device::CPU) return to(Device::CPU, MemCategory::Workspace).to_f32_vector();
  std::vector<float> out(static_cast<size_t>(numel_));
  if (dtype_ == DType::F32) {
    std::memcpy(out.data(), raw(), nbytes());
  } else {
    const uint16_t* src = bf16();
    for (int64_t i = 0; i < numel_; ++i) out[static_cast<size_t>(i)] = bf16_to_f32(src[i]);
  }
  return out;
}

}  // namespace loom
