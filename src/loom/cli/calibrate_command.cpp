// `loom calibrate`: the machine profile `loom plan --profile` predicts loom's own engine from.
#include <cstdio>
#include <filesystem>

#include "loom/cli/commands.hpp"
#include "loom/core/device_memory.hpp"
#include "loom/core/error.hpp"
#include "loom/dist/runtime.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/plan/cuda_calibration.hpp"
#include "loom/plan/machine_calibration.hpp"

namespace loom::cli {
namespace {

// --device cuda where this loom cannot run it, refused before anything else with the reason.
void check_cuda_calibration() {
  if (!device_memory::built_with(Device::CUDA))
    throw_error(
        "calibrate --device cuda: this loom was built without CUDA (no nvcc at configure time, or "
        "-DLOOM_WITH_CUDA=OFF); rebuild where nvcc is found, or calibrate the CPU engine (--device "
        "cpu)");
  if (device_memory::cuda_device_count() == 0)
    throw_error(
        "calibrate --device cuda: no CUDA device is visible to this process (check nvidia-smi and "
        "CUDA_VISIBLE_DEVICES); run on a machine with a GPU, or calibrate the CPU engine (--device "
        "cpu)");
}

void print_entry(const std::string& machine, Device device, const plan::ProfileEntry& entry) {
  const long long ranks = static_cast<long long>(entry.ranks);
  if (device == Device::CUDA)
    std::printf(
        "%s, %lld rank%s, bf16: GEMM peak %.1f TFLOP/s per rank (fit: %.0f%% of it, half_dim "
        "%.0f), "
        "attention %.0f%% / %.0f%% (forward / backward, half_dim %.0f / %.0f), memory %.0f GB/s "
        "(norms, activations) and %.0f GB/s (adds, AdamW) per rank\n",
        machine.c_str(), ranks, ranks == 1 ? "" : "s", entry.peak_flops / 1e12,
        100 * entry.gemm.peak_fraction, entry.gemm.half_dim,
        100 * entry.attention_forward.peak_fraction, 100 * entry.attention_backward.peak_fraction,
        entry.attention_forward.half_dim, entry.attention_backward.half_dim,
        entry.memory_bytes_per_s / 1e9, entry.stream_bytes_per_s / 1e9);
  else
    std::printf(
        "%s, %lld rank%s x %lld thread%s: GEMM peak %.1f GFLOP/s per rank (fit: %.0f%% of it, "
        "half_dim %.0f), "
        "attention %.0f%% / %.0f%% (forward / backward, half_dim %.0f / %.0f), memory %.1f GB/s "
        "per rank\n",
        machine.c_str(), ranks, ranks == 1 ? "" : "s",
        static_cast<long long>(entry.threads_per_rank), entry.threads_per_rank == 1 ? "" : "s",
        entry.peak_flops / 1e9, 100 * entry.gemm.peak_fraction, entry.gemm.half_dim,
        100 * entry.attention_forward.peak_fraction, 100 * entry.attention_backward.peak_fraction,
        entry.attention_forward.half_dim, entry.attention_backward.half_dim,
        entry.memory_bytes_per_s / 1e9);
  if (entry.fp8.measured())
    std::printf(
        "  FP8 emulation: %.1f ns an element quantised per tensor, %.1f / %.1f per 1 x 128 / 128 x "
        "1 tile, %.1f per 128 x 128 block\n",
        entry.fp8.tensor_s * 1e9, entry.fp8.row_tiles_s * 1e9, entry.fp8.column_tiles_s * 1e9,
        entry.fp8.blocks_s * 1e9);
  if (entry.comm) {
    std::printf("  send/recv: %.1f us + bytes / %.2f GB/s\n", entry.comm->p2p.latency_s * 1e6,
                entry.comm->p2p.bytes_per_s / 1e9);
    for (const plan::CollectiveFit& fit : entry.comm->collectives)
      std::printf("  %-14s over %lld: %.1f us + bytes / %.2f GB/s\n", plan::collective_name(fit.op),
                  static_cast<long long>(fit.group), fit.cost.latency_s * 1e6,
                  fit.cost.bytes_per_s / 1e9);
  }
}

}  // namespace

int run_calibrate(const CalibrateArgs& args) {
  const Device device = args.device == "cuda" ? Device::CUDA : Device::CPU;
  if (device == Device::CUDA) check_cuda_calibration();
  // Everything that can be wrong with the output is found before minutes of measuring: an
  // existing file must be a profile of this machine and engine, and the directory must exist.
  // On CUDA the machine is world rank 0's GPU, device 0 of its node (select_cuda_device below),
  // which is the rank that writes the file.
  plan::MachineProfile profile;
  plan::CudaMachine gpus;
  if (device == Device::CUDA) gpus = plan::describe_cuda_machine(0);
  const std::string machine = device == Device::CUDA ? gpus.name : plan::describe_machine();
  if (std::filesystem::exists(args.out)) {
    profile = plan::read_machine_profile(args.out);
    if (profile.device != device)
      throw_error("calibrate: ", args.out, " profiles loom's ", device_name(profile.device),
                  " engine (", profile.machine, "), not the ", device_name(device),
                  " one this run measures; write a new file");
    if (profile.machine != machine)
      throw_error("calibrate: ", args.out, " profiles another machine (", profile.machine, "; this is ", machine,
                  "); write a new file");
  }
  const std::filesystem::path dir = std::filesystem::path(args.out).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir))
    throw_error("calibrate: the directory of --out ", args.out, " does not exist");
  profile.machine = machine;
  profile.device = device;
  profile.cores = device == Device::CUDA ? gpus.gpus : plan::usable_cores();
  profile.gpu_memory_bytes = device == Device::CUDA ? gpus.memory_bytes : 0;

  cpu::set_num_threads(args.threads);
  DistRuntime runtime;
  ProcessGroup& world = *runtime.world();
  // The ranks of a node spread over its GPUs, or share them, as `loom train --device cuda` does.
  if (device == Device::CUDA) (void)device_memory::select_cuda_device(runtime.local_rank());
  plan::CalibrationOptions options;
  options.quick = args.quick;
  options.device = device;
  const plan::ProfileEntry entry = plan::calibrate_machine(world, options);
  if (world.rank() != 0) return 0;
  print_entry(machine, device, entry);
  plan::merge_profile_entry(profile, entry);
  plan::write_machine_profile(profile, args.out);
  std::printf("wrote %s (entries for", args.out.c_str());
  for (const plan::ProfileEntry& e : profile.entries) std::printf(" %lld", static_cast<long long>(e.ranks));
  std::printf(" ranks)\n");
  return 0;
}

}  // namespace loom::cli
