// `loom calibrate`: the machine profile `loom plan --profile` predicts loom's own engine from.
#include <cstdio>
#include <filesystem>

#include "loom/cli/commands.hpp"
#include "loom/core/error.hpp"
#include "loom/dist/runtime.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/plan/machine_calibration.hpp"

namespace loom::cli {

int run_calibrate(const CalibrateArgs& args) {
  // Everything that can be wrong with the output is found before minutes of measuring: an
  // existing file must be a profile of this machine, and the directory must exist.
  plan::MachineProfile profile;
  const std::string machine = plan::describe_machine();
  if (std::filesystem::exists(args.out)) {
    profile = plan::read_machine_profile(args.out);
    if (profile.machine != machine)
      throw_error("calibrate: ", args.out, " profiles another machine (", profile.machine, "; this is ", machine,
                  "); write a new file");
  }
  const std::filesystem::path dir = std::filesystem::path(args.out).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir))
    throw_error("calibrate: the directory of --out ", args.out, " does not exist");
  profile.machine = machine;
  profile.cores = plan::usable_cores();

  cpu::set_num_threads(args.threads);
  DistRuntime runtime;
  ProcessGroup& world = *runtime.world();
  plan::CalibrationOptions options;
  options.quick = args.quick;
  const plan::ProfileEntry entry = plan::calibrate_machine(world, options);
  if (world.rank() != 0) return 0;
  std::printf("%s, %lld rank%s x %lld thread%s: GEMM peak %.1f GFLOP/s per rank (fit: %.0f%% of it, half_dim %.0f), "
              "attention %.0f%% / %.0f%% (forward / backward, half_dim %.0f / %.0f), memory %.1f GB/s per rank\n",
              machine.c_str(), static_cast<long long>(entry.ranks), entry.ranks == 1 ? "" : "s",
              static_cast<long long>(entry.threads_per_rank), entry.threads_per_rank == 1 ? "" : "s", entry.peak_flops / 1e9,
              100 * entry.gemm.peak_fraction, entry.gemm.half_dim, 100 * entry.attention_forward.peak_fraction,
              100 * entry.attention_backward.peak_fraction, entry.attention_forward.half_dim,
              entry.attention_backward.half_dim, entry.memory_bytes_per_s / 1e9);
  if (entry.comm) {
    std::printf("  send/recv: %.1f us + bytes / %.2f GB/s\n", entry.comm->p2p.latency_s * 1e6, entry.comm->p2p.bytes_per_s / 1e9);
    for (const plan::CollectiveFit& fit : entry.comm->collectives)
      std::printf("  %-14s over %lld: %.1f us + bytes / %.2f GB/s\n", plan::collective_name(fit.op),
                  static_cast<long long>(fit.group), fit.cost.latency_s * 1e6, fit.cost.bytes_per_s / 1e9);
  }
  plan::merge_profile_entry(profile, entry);
  plan::write_machine_profile(profile, args.out);
  std::printf("wrote %s (entries for", args.out.c_str());
  for (const plan::ProfileEntry& e : profile.entries) std::printf(" %lld", static_cast<long long>(e.ranks));
  std::printf(" ranks)\n");
  return 0;
}

}  // namespace loom::cli
