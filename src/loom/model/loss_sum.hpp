#pragma once
// The summed token loss of a step's micro-batches, kept on the device that computes it. The
// fused head adds each micro-batch's sum into slot() (a double on the device, added in the
// order the heads were queued), so the host does not wait for the device once per
// micro-batch; read() waits once, after the step's other work is queued. A head that holds its
// loss on the host already adds it with add(); read() returns both.
#include "loom/core/tensor.hpp"

namespace loom {

class LossSum {
 public:
  explicit LossSum(Device device);
  Device device() const { return device_; }
  // One double on device(), zero after reset(); the fused head adds into it.
  double* slot() const { return static_cast<double*>(slot_.raw()); }
  // A loss the host holds.
  void add(double value) { host_ += value; }
  // Everything added since reset(); waits for the device's queued work.
  double read() const;
  // Back to zero: the device's part on the current stream, behind what reads it.
  void reset();

 private:
  Device device_;
  Tensor slot_;  // 8 bytes: one double in two f32 elements (Tensor has no f64)
  double host_ = 0.0;
};

}  // namespace loom
