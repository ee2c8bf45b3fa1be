#pragma once
// A model's parameters on one GPU: fp32 masters (what AdamW updates and checkpoints hold), a
// bf16 working copy when the compute dtype is bf16 (what the kernels read: llm.c's mixed
// precision), and fp32 gradients. Each kind lives in one flat buffer, parameter after parameter
// in the host model's order, so zeroing every gradient and their global norm are one kernel
// each. Every parameter starts on a 256-byte boundary in each buffer, cuBLASLt's preferred
// operand alignment.
#include <cuda_bf16.h>

#include <string>
#include <type_traits>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/core/tensor.hpp"
#include "loom/gpu/device_buffer.hpp"
#include "loom/model/parameter.hpp"

namespace loom::gpu {

using bf16 = __nv_bfloat16;

struct GpuParameter {
  std::string name;  // the host parameter's (HF) name
  Shape shape;
  int64_t numel = 0;
  int64_t offset = 0;  // elements into each flat buffer
  bool weight_decay = true;
  float* master = nullptr;
  bf16* working = nullptr;  // bf16 compute only
  float* grad = nullptr;
  // What the kernels read: the master itself (f32), or its bf16 working copy.
  template <typename T>
  const T* value() const {
    if constexpr (std::is_same_v<T, bf16>)
      return working;
    else
      return master;
  }
};

class GpuParameterSet {
 public:
  // Allocates (zeroed) device storage shaped like `host`; upload_from fills it.
  GpuParameterSet(const ParameterList& host, DType compute_dtype);
  std::vector<GpuParameter>& all() { return params_; }
  const std::vector<GpuParameter>& all() const { return params_; }
  // The device twin of `host`, one of the parameters this set was built from.
  const GpuParameter& of(const Parameter& host) const;
  DType compute_dtype() const { return compute_dtype_; }
  int64_t padded_elements() const { return padded_elements_; }  // of each flat buffer

  // Masters from the host values (copied as they are), then the working copies from them.
  void upload_from(const ParameterList& host);
  // Host values from the weights the model computes with: the masters (f32) or the bf16 working
  // copies (bf16), which is what loom::AdamW leaves in Parameter::value under mixed precision.
  void download_to(const ParameterList& host) const;
  // working = bf16(master), round to nearest even, after the masters were written directly.
  void refresh_working_copies();

  void zero_grads();
  // Sum of the squares of every gradient, in double (the padding between parameters is zero).
  double grad_sum_of_squares() const;

 private:
  void check_matches(const ParameterList& host) const;
  std::vector<GpuParameter> params_;
  std::vector<const Parameter*> host_of_;  // params_[i] was built from host_of_[i]
  DType compute_dtype_;
  int64_t padded_elements_ = 0;
  DeviceBuffer masters_, working_, grads_;
};

}  // namespace loom::gpu
