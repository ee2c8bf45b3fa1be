#pragma once
// `loom calibrate`: measures the machine loom's engine runs on, with every rank of `world`
// working at once (as they do in training), into one ProfileEntry. On the CPU (f32):
// - GEMMs: the engine's linear_forward / linear_backward (OpenBLAS SGEMM) over a grid of
//   (rows, in, out) shapes, fitted to the time model's efficiency curve;
// - attention: the engine's flash-style causal kernels forward and backward at several
//   sequence lengths and head widths, fitted the same way per head and matmul;
// - memory-bound work: the engine's layer norm, GELU and residual add over an activation,
//   as bytes moved per second;
// - FP8's emulation: quantising an operand to FP8 and back per tensor, per 1 x 128 and 128 x 1
//   tile and per 128 x 128 block, as seconds per element;
// - MPI: all-reduce, reduce-scatter, all-gather, all-to-all and broadcast over every group
//   size dividing the world (all groups of that size busy together), and send/recv between
//   pairs, each at message sizes from 4 KiB to 8 MiB, fitted to alpha-beta.
// On a GPU (`device` CUDA) the same quantities through the engine's CUDA ops in bf16, the GPU
// training precision, over shapes sized for a GPU (cuda_calibration.hpp).
// Each compute figure is timed from a barrier until the last rank is done: on the CPU the
// median of `repeats` rounds that time each of a measurement's kernels once in turn (the
// machine's typical speed, where other tenants' load comes and goes), on a GPU the best of
// `repeats` loops; each communication figure is the best of `repeats` loops, averaged over the
// ranks.
#include <cstdint>
#include <string>

#include "loom/core/dtype.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/plan/machine_profile.hpp"

namespace loom::plan {

struct CalibrationOptions {
  int repeats = 7;                 // timed loops per measurement (CPU compute: rounds)
  double min_loop_seconds = 0.02;  // a loop repeats its operation until it lasts this long
  bool quick = false;              // fewer shapes and sizes (for tests): same fields, rougher fits
  // The engine measured: the CPU's kernels, or the CUDA ops on the GPU this process selected
  // (device_memory::select_cuda_device) in a loom built with CUDA.
  Device device = Device::CPU;
};

// Collective over `world` (every rank calls it); returns the same entry on every rank. Throws
// loom::Error for bad options, or for `device` CUDA without CUDA or without a visible GPU.
ProfileEntry calibrate_machine(ProcessGroup& world, const CalibrationOptions& options);

// "<CPU model> (<n> cores)" from /proc/cpuinfo, or "unknown CPU".
std::string describe_machine();
// The cores this process may run on (its CPU affinity; the machine's count if that is unknown):
// what ranks started together on this machine share.
int64_t usable_cores();

}  // namespace loom::plan
