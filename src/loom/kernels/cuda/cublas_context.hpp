#pragma once
// One cuBLASLt handle and one matmul workspace per device, created on first use and kept for
// the life of the process. The workspace (and the small bias-gradient scratch) is shared by
// every matmul on the device, so matmuls must not run concurrently on two streams of one
// device; today every caller uses one stream per device.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace loom::cuda {

// NVIDIA's cuBLAS guide recommends 32 MiB of workspace on Hopper (4 MiB suffices on Ampere);
// one size for both keeps the algorithm choice independent of the GPU generation.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

struct CublasContext {
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  float* bias_grad_scratch = nullptr;  // [bias_grad_capacity] f32, for the BGRADB epilogue
  int64_t bias_grad_capacity = 0;
};

// The context of the current device (cudaGetDevice), created on first use.
CublasContext& cublas_context();

// The device's bias-gradient scratch with room for `elements` floats, grown when too small.
float* bias_grad_scratch(CublasContext& context, int64_t elements);

// Whether linear layers use cuBLASLt's fused bias epilogues (BIAS forward, BGRADB backward)
// or plain matmuls plus loom's own bias kernels. On by default; the tests turn it off to check
// the fallback path that runs whenever cuBLASLt has no algorithm for an epilogue.
void set_bias_epilogues_enabled(bool enabled);
bool bias_epilogues_enabled();

}  // namespace loom::cuda
