#pragma once
// `loom calibrate --device cuda`: the rates of loom's CUDA engine on the GPU this process
// computes on, measured through the engine's own device-neutral ops (kernels/ops.hpp) on bf16
// tensors, the GPU training precision, into the ProfileEntry machine_calibration.hpp describes:
// - GEMMs: ops::linear_forward / linear_backward (cuBLASLt, bf16 in, f32 accumulation and f32
//   weight gradients) over rows 1024-16384 x in 512-8192 x out 512-8192, fitted to the time
//   model's efficiency curve against the best rate measured (the peak the fractions are of);
// - attention: ops::attention_forward / backward (causal, whichever kernels LOOM_CUDA_ATTENTION
//   picks, auto by default) at head_dim 64 (12 heads) and 128 (16 heads), sequences 256-4096 at
//   16384 tokens, fitted per head and matmul as on the CPU;
// - memory-bound work: layer norm forward and backward, GELU forward and backward and the
//   residual add over a [16384, 2048] bf16 activation (67 MB a tensor, beyond an H100's 50 MB
//   L2), as bytes moved per second;
// - communication: with several ranks, MPI's collectives and send/recv on f32 device buffers
//   staged through host memory, as the MPI backend carries GPU tensors. NCCL's collectives are
//   not calibrated yet: they need a GPU per rank (2+ GPUs), which no machine this was written
//   for had, so a profile of a multi-GPU node predicts its collectives from MPI's costs.
// A GPU op returns once queued, so every timed loop ends with a device synchronise before the
// host clock is read (calibration_loops.hpp). Before the first figure the largest GEMM runs for
// a moment so the GPU's clocks have ramped up. Expected to take about 15 s on an H100 (`quick`:
// about 2 s); not yet run on a GPU.
#include <cstdint>
#include <string>

#include "loom/dist/process_group.hpp"
#include "loom/plan/machine_calibration.hpp"
#include "loom/plan/machine_profile.hpp"

namespace loom::plan {

// The GPUs a CUDA profile is measured on, as the profile records them.
struct CudaMachine {
  std::string name;          // "<GPU name> (<n> GPU(s))": the name cudaGetDeviceProperties reports
  int64_t gpus = 0;          // CUDA devices visible to this process
  int64_t memory_bytes = 0;  // device `device`'s memory (cudaDeviceProp::totalGlobalMem)
};
// Device `device` (an index among the visible ones) and how many there are. Throws loom::Error
// naming the problem in a loom built without CUDA or where no GPU is visible.
CudaMachine describe_cuda_machine(int device);

// calibrate_machine for CalibrationOptions::device == CUDA (same contract); the ops run on the
// current CUDA device.
ProfileEntry calibrate_cuda(ProcessGroup& world, const CalibrationOptions& options);

}  // namespace loom::plan
