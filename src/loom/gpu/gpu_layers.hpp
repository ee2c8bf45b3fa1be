#pragma once
// The GPU model's layers, twins of model/linear, model/norm and the one-process projections of
// model/parallel_plan: each holds its parameters' device twins and calls the CUDA kernels with
// the arguments the CPU layer gives the CPU kernels. T is the compute dtype (float or bf16):
// activations and their gradients are T, parameter gradients always f32.
#include <vector>

#include "loom/gpu/gpu_parameters.hpp"
#include "loom/model/norm.hpp"
#include "loom/model/parallel_plan.hpp"

namespace loom::gpu {

// y = x W^T (+ b), W [out, in]; output written into a column block of a wider buffer (out_ld).
struct GpuLinear {
  const GpuParameter* weight = nullptr;
  const GpuParameter* bias = nullptr;  // null: no bias
  int64_t in_features = 0, out_features = 0;

  template <typename T>
  void forward(T* out, int64_t out_ld, const T* input, int64_t rows) const;
  // d_input written (or accumulated); weight and bias gradients accumulated.
  template <typename T>
  void backward(T* d_input, bool accumulate_input, const T* d_out, int64_t d_out_ld, const T* input,
                int64_t rows) const;
};

// Projections of one input whose outputs sit side by side (q|k|v, gate|up): LocalFanOut.
struct GpuFanOut {
  std::vector<GpuLinear> linears;
  int64_t width = 0;

  template <typename T>
  void forward(T* out, int64_t out_ld, const T* input, int64_t rows) const;
  // d_input written; parameter gradients accumulated.
  template <typename T>
  void backward(T* d_input, const T* d_out, int64_t d_out_ld, const T* input, int64_t rows) const;
};

// LayerNorm (with bias) or RMSNorm over rows of `dim`; mean (LayerNorm) and rstd are f32.
struct GpuNorm {
  bool layer_norm = true;
  const GpuParameter* weight = nullptr;
  const GpuParameter* bias = nullptr;  // LayerNorm only
  int64_t dim = 0;
  float eps = 0;

  template <typename T>
  void forward(T* out, float* mean, float* rstd, const T* input, int64_t rows) const;
  // d_input accumulated; weight (and bias) gradients accumulated.
  template <typename T>
  void backward(T* d_input, const T* d_out, const T* input, const float* mean, const float* rstd,
                int64_t rows) const;
};

// Device twins of host layers, found through the parameters they collect (weights [out, in],
// each followed by its bias when it has one). Only the one-process plan's layers qualify.
GpuFanOut gpu_fan_out(FanOutProjection& host, const GpuParameterSet& params);
GpuLinear gpu_fan_in(FanInProjection& host, const GpuParameterSet& params);
GpuNorm gpu_norm(Norm& host, int64_t dim, float eps, const GpuParameterSet& params);

}  // namespace loom::gpu
