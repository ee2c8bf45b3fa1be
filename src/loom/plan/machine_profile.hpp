#pragma once
// A machine profile: what `loom calibrate` measured on the machine loom's own engine runs on
// (GEMM and attention rates by shape, memory bandwidth, MPI collective and send/recv costs), so
// that `loom plan --profile FILE` predicts the engine's step time there rather than a GPU
// datasheet's. One entry per rank count, since N ranks sharing a machine's cores (or GPUs) each
// compute, stream memory and communicate at rates that depend on N. A profile is of one engine:
// the CPU's (f32) or the CUDA one's (`--device cuda`, bf16), never both.
//
// Collective and send/recv costs are alpha-beta fits (Hockney): seconds = latency_s + bytes /
// bytes_per_s, with `bytes` in collective_time's convention (the whole buffer; collectives.hpp),
// fitted by least squares on relative error, so small and large messages weigh the same.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/dtype.hpp"
#include "loom/plan/collectives.hpp"
#include "loom/plan/gemm_calibration.hpp"
#include "loom/plan/time_model.hpp"

namespace loom::plan {

// One measured message size: `bytes` took `seconds`.
struct MessageTiming {
  double bytes = 0, seconds = 0;
};

// seconds = latency_s + bytes / bytes_per_s minimising sum ((fit - t) / t)^2 over the timings,
// with latency_s >= 0. Needs two distinct sizes; throws loom::Error naming what is wrong.
Link fit_alpha_beta(const std::vector<MessageTiming>& timings);

// The timings behind one fit of MeasuredComm (collectives.hpp): a collective at a group size,
// or the send/recv (`p2p` true).
struct CommTimings {
  bool p2p = false;
  Collective op = Collective::AllReduce;
  int64_t group = 2;
  std::vector<MessageTiming> timings;
};

// Everything measured with `ranks` processes computing and communicating at once.
struct ProfileEntry {
  int64_t ranks = 1;
  int64_t threads_per_rank = 1;
  // The best GEMM rate measured (FLOP/s): the peak the fitted efficiencies are fractions of.
  double peak_flops = 0;
  GemmEfficiency gemm;                      // linear layers: forward and backward products
  std::vector<GemmTiming> gemm_timings;     // one forward and one backward (per product) per shape
  // Attention as GEMM-shaped work per head and per matmul: m = tokens, n = mean keys a query
  // sees (causal), k = head_dim; backward in the forward's FLOPs (time_model's convention).
  GemmEfficiency attention_forward, attention_backward;
  std::vector<GemmTiming> attention_forward_timings, attention_backward_timings;
  double memory_bytes_per_s = 0;            // elementwise kernels streaming activations
  // CUDA: the plain streaming kernels (a residual-gradient add in bf16 and in f32: the loss's
  // passes and AdamW stream the same way), which run faster than the norms and activation
  // functions of memory_bytes_per_s; 0 (older profiles, the CPU): memory_bytes_per_s.
  double stream_bytes_per_s = 0;
  // The CPU engine's FP8 emulation (TrainingJob's Fp8QuantizeRates); zero in CUDA profiles and
  // in files written before calibrate measured it.
  Fp8QuantizeRates fp8;
  std::shared_ptr<const MeasuredComm> comm;  // null with one rank
  std::vector<CommTimings> comm_timings;
};

struct MachineProfile {
  // The CPU model and core count, or the GPU model and count, as calibrate found them.
  std::string machine;
  // The engine measured: the CPU's, in f32, or the CUDA engine's, in bf16 (threads_per_rank 1:
  // a rank computes on one GPU). Files written before the field are CPU profiles.
  Device device = Device::CPU;
  // The processors the ranks share: on the CPU the cores the ranks may run on (calibrate's CPU
  // affinity), on CUDA the GPUs visible (more ranks than GPUs take turns on them); 0 when the
  // file does not say (profiles written before the field), which predicts every rank count from
  // its own entry.
  int64_t cores = 0;
  // CUDA: one GPU's memory (cudaDeviceProp::totalGlobalMem); 0 on the CPU.
  int64_t gpu_memory_bytes = 0;
  std::vector<ProfileEntry> entries;
  // The entry measured at `ranks`; throws loom::Error listing the rank counts the file has.
  const ProfileEntry& entry(int64_t ranks) const;
  // Whether there is one.
  bool has_entry(int64_t ranks) const;
};

// JSON (format "loom-machine-profile/1"; "device" and "gpu_memory_bytes" were added later and
// default to a CPU profile). read_machine_profile throws loom::Error naming the file and the
// field for a missing, malformed or non-positive value, and refits nothing: the fits are read as
// written, the timings kept only as evidence.
MachineProfile read_machine_profile(const std::string& path);
void write_machine_profile(const MachineProfile& profile, const std::string& path);
// Adds `entry` to `profile`, replacing one of the same rank count.
void merge_profile_entry(MachineProfile& profile, ProfileEntry entry);

// The cluster and job settings that make the planner predict loom's engine on this machine:
// one node of `ranks` "GPUs" whose peak is the measured GEMM peak (bf16_tflops holds it,
// whatever the precision, so MFU is against it), whose HBM is the measured stream bandwidth and
// whose links are the measured MPI costs. The CPU engine (`device` CPU): f32 state and
// activations, no GPU workspace. The CUDA engine: bf16 working weights and activations, f32
// gradient accumulators (model/parameter.hpp), f32 masters and moments (optim/adamw), and the
// GPU model's workspace allowance (CUDA context, cuBLASLt workspace).
struct ProfiledMachine {
  ClusterSpec cluster;
  TrainingJob job;
};
ProfiledMachine profiled_machine(const ProfileEntry& entry, double memory_bytes_per_rank,
                                 Device device = Device::CPU);
// The same for `ranks` ranks from a whole profile. With more ranks than the profile's cores can
// run at once (cores / threads per rank), the ranks take turns: compute, attention and memory
// rates come from the entry at that many ranks (full speed, no turns taken), cluster.cores says
// how many run at once, and the time model shares them out; collectives and send/recv come
// from the entry at `ranks`, measured with every rank running. Otherwise profiled_machine of
// entry(ranks). Throws loom::Error as entry() does.
ProfiledMachine profiled_machine(const MachineProfile& profile, int64_t ranks, double memory_bytes_per_rank);

// The memory each of `ranks` ranks may hold: on the CPU `host_bytes` (the RAM of the machine
// the plan is for) over the ranks; on CUDA one GPU's memory, shared out where the ranks
// outnumber the profile's GPUs.
double memory_bytes_per_rank(const MachineProfile& profile, int64_t ranks, double host_bytes);

}  // namespace loom::plan
