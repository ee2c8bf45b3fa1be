#include <cuda_runtime.h>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_info.hpp"

namespace loom::cuda {

DeviceInfo device_info() {
  DeviceInfo info;
  // Without a driver these report errors (cudaErrorInsufficientDriver / NoDevice); that is an
  // answer ("no GPU here"), not a failure, so nothing below throws on it.
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  if (cudaRuntimeGetVersion(&info.runtime_version) != cudaSuccess) info.runtime_version = 0;
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    info.error = std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
    (void)cudaGetLastError();  // clear it so the next checked call does not report it
    return info;
  }
  info.count = count;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    info.devices.push_back({prop.name, prop.major, prop.minor,
                            static_cast<int64_t>(prop.totalGlobalMem), prop.multiProcessorCount});
  }
  return info;
}

}  // namespace loom::cuda
