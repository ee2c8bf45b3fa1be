#include "loom/model/loss_sum.hpp"

#include "loom/core/device_memory.hpp"

namespace loom {

LossSum::LossSum(Device device)
    : device_(device), slot_(Tensor::zeros({2}, DType::F32, MemCategory::Workspace, device)) {
  static_assert(sizeof(double) == 2 * sizeof(float));
}

double LossSum::read() const {
  double device_part = 0.0;
  device_memory::copy(&device_part, Device::CPU, slot_.raw(), device_, sizeof device_part);
  return device_part + host_;
}

void LossSum::reset() {
  slot_.zero_();
  host_ = 0.0;
}

}  // namespace loom
