#pragma once
// A stand-in for the CUDA runtime header, for tools/cuda_emulation on machines without the CUDA
// toolkit (CI): the types and declarations loom's kernel headers name, nothing that runs on a
// GPU. Every runtime call aborts: the emulated kernels never make one.
#include <cstddef>
#include <cstdio>
#include <cstdlib>

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
using cudaStream_t = struct CUstream_st*;
using cudaEvent_t = struct CUevent_st*;
enum cudaDeviceAttr { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaMemcpyKind {
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3
};

[[noreturn]] inline cudaError_t cuda_emulation_no_runtime(const char* call) {
  std::fprintf(stderr, "emulation: %s has no CUDA runtime here\n", call);
  std::abort();
}
inline const char* cudaGetErrorName(cudaError_t) { return "cudaError"; }
inline const char* cudaGetErrorString(cudaError_t) { return "no CUDA runtime under emulation"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int*) { return cuda_emulation_no_runtime("cudaGetDevice"); }
inline cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int) {
  return cuda_emulation_no_runtime("cudaDeviceGetAttribute");
}
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int) {
  return cuda_emulation_no_runtime("cudaFuncSetAttribute");
}
inline cudaError_t cudaMemcpyAsync(void*, const void*, size_t, cudaMemcpyKind, cudaStream_t) {
  return cuda_emulation_no_runtime("cudaMemcpyAsync");
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cuda_emulation_no_runtime("cudaStreamSynchronize");
}

#define __host__
#define __device__
#define __forceinline__ inline
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
