#pragma once
// Every CUDA runtime and cuBLAS call goes through one of these macros, so a failure becomes a
// loom::Error naming the call, the file and line, and the library's own error text instead of
// a silent wrong answer several kernels later.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "loom/core/error.hpp"

namespace loom::cuda::detail {

inline void check_cuda(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc != cudaSuccess)
    throw_error(call, " failed at ", file, ":", line, ": ", cudaGetErrorName(rc), " (",
                cudaGetErrorString(rc), ")");
}

inline void check_cublas(cublasStatus_t rc, const char* call, const char* file, int line) {
  if (rc != CUBLAS_STATUS_SUCCESS)
    throw_error(call, " failed at ", file, ":", line, ": ", cublasLtGetStatusName(rc), " (",
                cublasLtGetStatusString(rc), ")");
}

}  // namespace loom::cuda::detail

#define LOOM_CUDA_CHECK(call) ::loom::cuda::detail::check_cuda((call), #call, __FILE__, __LINE__)
#define LOOM_CUBLAS_CHECK(call) \
  ::loom::cuda::detail::check_cublas((call), #call, __FILE__, __LINE__)
// Kernel launches return nothing; a bad configuration shows up in cudaGetLastError. This does
// not wait for the kernel: faults inside it surface at the next synchronising call.
#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())
