#pragma once
// One cuBLASLt handle per device, and per stream of it one matmul workspace and one small
// bias-gradient scratch, created on first use and kept for the life of the process. A
// workspace is shared by the matmuls queued on its stream, which run one after another;
// matmuls on two streams overlap, so each stream has its own.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace loom::cuda {

// NVIDIA's cuBLAS guide recommends 32 MiB of workspace on Hopper (4 MiB suffices on Ampere);
// one size for both keeps the algorithm choice independent of the GPU generation.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

struct CublasStreamScratch {
  void* workspace = nullptr;           // [workspace_bytes]
  float* bias_grad_scratch = nullptr;  // [bias_grad_capacity] f32, for the BGRADB epilogue
  int64_t bias_grad_capacity = 0;
};

struct CublasContext {
  int device = 0;
  cublasLtHandle_t handle = nullptr;
  size_t workspace_bytes = 0;  // of every stream's workspace
  std::unordered_map<cudaStream_t, CublasStreamScratch> streams;
};

// The context of the current device (cudaGetDevice), created on first use.
CublasContext& cublas_context();

// The matmul workspace of `stream` (workspace_bytes), allocated on its first use.
void* cublas_workspace(CublasContext& context, cudaStream_t stream);
// The bias-gradient scratch of `stream` with room for `elements` floats, grown when too small.
float* bias_grad_scratch(CublasContext& context, int64_t elements, cudaStream_t stream);

// Whether linear layers use cuBLASLt's fused bias epilogues (BIAS forward, BGRADB backward)
// or plain matmuls plus loom's own bias kernels. On by default; the tests turn it off to check
// the fallback path that runs whenever cuBLASLt has no algorithm for an epilogue.
void set_bias_epilogues_enabled(bool enabled);
bool bias_epilogues_enabled();

}  // namespace loom::cuda
