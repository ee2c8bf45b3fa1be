#pragma once
// What CUDA devices this process can use. Never throws for a missing GPU or driver: a
// CPU-only machine gets count 0 and the runtime's reason in `error`, so callers (and the GPU
// tests, which skip) can decide what to do.
#include <cstdint>
#include <string>
#include <vector>

namespace loom::cuda {

struct DeviceProperties {
  std::string name;
  int compute_major = 0, compute_minor = 0;  // compute capability, e.g. 9.0 for H100
  int64_t total_memory_bytes = 0;
  int multiprocessors = 0;
};

struct DeviceInfo {
  int count = 0;
  int driver_version = 0;   // cudaDriverGetVersion: 1000 * major + 10 * minor; 0 without a driver
  int runtime_version = 0;  // cudaRuntimeGetVersion, same encoding
  std::string error;        // why count is 0, when the runtime said why
  std::vector<DeviceProperties> devices;
};

DeviceInfo device_info();

}  // namespace loom::cuda
