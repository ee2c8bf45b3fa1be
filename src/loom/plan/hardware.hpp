#pragma once
// What the planner knows about the machines a job runs on: one GPU's datasheet peaks
// (GpuSpec, with named presets) and the infrastructure around the job (ClusterSpec: node
// size, network, power, reliability, storage, price). Every default carries its source, so
// an estimate can be traced back to a document rather than to a guess.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::plan {

struct MeasuredComm;  // collectives.hpp

// Dense (non-sparse) datasheet peaks of one GPU. NVIDIA datasheets print tensor-core FLOPS
// "with sparsity"; dense is half of that. Bandwidths are bytes/s in decimal units (1 TB/s =
// 1e12 B/s); hbm_bytes follows NVIDIA's "GB" for HBM, which is GiB (an "80 GB" H100 reports
// 81,559 MiB in nvidia-smi), so it is the datasheet figure times 2^30.
struct GpuSpec {
  std::string name;
  double bf16_tflops = 0;  // dense BF16 tensor-core peak, in TFLOPS
  double fp8_tflops = 0;   // dense FP8 peak, in TFLOPS; 0 where FP8 is not supported
  double hbm_bytes = 0;
  double hbm_bandwidth_bytes_per_s = 0;
  double nvlink_bytes_per_s = 0;  // per GPU, one direction (datasheets quote both summed)
  double tdp_watts = 0;
  // NVSwitch with NVLink SHARP (third-generation NVSwitch and later: HGX/DGX H100, H800, H200,
  // B200, GB200 NVL72), which NCCL's all-reduce uses within a node; not NVLink bridges (PCIe, NVL).
  bool nvls = false;
  // Dense FP4 (NVFP4 / MXFP4) peak, in TFLOPS; 0 where the tensor cores have no 4-bit mode
  // (everything before Blackwell).
  double fp4_tflops = 0;
  // The largest BF16 matmul rate measured on the part over its datasheet peak (Bekman's
  // "maximum achievable matmul FLOPS", MAMF: ml-engineering compute/accelerator/README.md, the
  // BF16 table's efficiency column); 0 where none was measured. Parts sustain different clocks
  // under a dense load (a GB200 reaches 72.9% of its 2.5 PF, a B200 77.6% of 2.25, an H100
  // 80.3% of 0.989): the planner's GEMM and attention rates, set on H100 runs, scale by this
  // share over the H100's (sustained_share in time_model.hpp).
  double mamf_share = 0;
};

// Presets: "v100-32gb", "v100-16gb", "a100-40gb", "a100-80gb", "h100-sxm", "h800-sxm", "h100-pcie",
// "h100-nvl", "a800-80gb", "h200", "gh200", "gh200-144gb", "h20", "b200", "b300", "gb200", "gb300",
// "mi250x", "mi250" (one GCD each), "mi300x", "mi325x", "mi350x", "mi355x". The name is matched
// case-insensitively; an unknown name throws a loom::Error that lists the valid ones.
const GpuSpec& gpu_preset(const std::string& name);
// An Ampere part (A100, A800): its GEMM and attention efficiencies and its network are the A100's.
bool ampere_part(const GpuSpec& gpu);
// An AMD Instinct part: its GEMM and attention efficiencies are the Hopper family's (no AMD run
// calibrates them; the assumption is printed with a prediction).
bool amd_part(const GpuSpec& gpu);
std::vector<std::string> gpu_preset_names();

// Inter-node bandwidth per GPU, one direction, of the reference server of the GPU's
// generation: DGX A100 has eight 200 Gb/s HDR compute NICs (25 GB/s per GPU; also MosaicML's
// "1600 Gbps node-node" A100 clusters and Selene in Narayanan et al. 2021); DGX H100/H200 and
// DGX B200 have eight 400 Gb/s NDR NICs (50 GB/s per GPU); DGX-2 (V100) eight 100 Gb/s EDR
// ports for 16 GPUs.
double default_inter_node_bytes_per_s(const GpuSpec& gpu);

// Bandwidth between a GPU and its host's memory, one direction: on a Grace superchip its share
// of NVLink-C2C (900 GB/s both ways per superchip: a GH200's one GPU 450 GB/s, a GB200's or
// GB300's two 225 GB/s each; the superchip datasheets), else the datasheet's PCIe link (Gen3
// 32 GB/s both ways on V100, Gen4 64 on A100/A800 and MI250X, Gen5 128 on H100 and later).
double host_link_bytes_per_s(const GpuSpec& gpu);

// A Grace superchip part (GH200, GB200, GB300): its host is an Arm Grace CPU beside it.
bool grace_part(const GpuSpec& gpu);

// Host memory per GPU on the part's reference system: the system's memory over its GPUs.
// GH200: one Grace's 480 GB of LPDDR5X a GPU; GB200 and GB300 NVL72: 480 GB a Grace shared
// by two GPUs (the racks' "up to 17 TB LPDDR5X" over 36 Grace CPUs), 240 GB; DGX H100, H200,
// B200 and B300: 2 TB over 8 GPUs, 256 GB (also the Hopper and AMD eight-GPU boards); DGX
// A100: 1 TB over 8, 128 GB; DGX-2: 1.5 TB over 16 V100s, 96 GB; a Frontier node: 512 GB over
// four MI250X, 64 GB a GCD. What activation offloading can hold there (GpuJob::offloaded_layers).
double host_memory_bytes_per_gpu(const GpuSpec& gpu);

// Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models", §3.3.4): 419 unexpected
// interruptions in a 54-day snapshot of pre-training on 16,384 H100s in 8-GPU servers, of
// which "GPU issues ... 58.7%" (faulty GPU, HBM3, SRAM, GPU system processor, silent data
// corruption, thermal interface); the rest are host, network and software. We charge the GPU
// share to GPUs and the rest to nodes, so a 16,384-GPU job reproduces 419 / 54 = 7.76/day.
inline constexpr double kLlama3GpuHours = 16384.0 * 54 * 24;
inline constexpr double kLlama3NodeHours = kLlama3GpuHours / 8;
inline constexpr double kLlama3Interruptions = 419;
inline constexpr double kLlama3GpuShare = 0.587;

struct ClusterSpec {
  GpuSpec gpu = gpu_preset("h100-sxm");  // the defaults below describe an H100 cluster
  int64_t gpus_per_node = 8;             // HGX/DGX baseboards hold 8 NVLink-connected GPUs
  int64_t nodes = 1;
  // Llama 3 §3.3.1: "400 Gbps interconnects between GPUs" (one NIC per GPU) = 50 GB/s.
  double inter_node_bytes_per_s_per_gpu = 50e9;
  // Non-GPU draw of an 8-GPU server (CPUs, DRAM, NVSwitches, NICs, fans, PSU loss): the NVIDIA
  // DGX H100 datasheet gives ~10.2 kW max system power, minus 8 x 700 W of GPUs = 4.6 kW. A
  // nameplate bound, so it also stands in for the switches and storage we do not model.
  double node_overhead_watts = 10200.0 - 8 * 700.0;
  // Facility power / IT power. Between Google's published fleet PUE (~1.10) and the Uptime
  // Institute 2023 survey average (1.58); 1.2 is a typical modern hyperscale figure.
  double pue = 1.2;
  double gpu_mtbf_hours = kLlama3GpuHours / (kLlama3GpuShare * kLlama3Interruptions);  // ~86k h
  double node_mtbf_hours =
      kLlama3NodeHours / ((1 - kLlama3GpuShare) * kLlama3Interruptions);  // ~15k h
  // Aggregate checkpoint write bandwidth the job gets from its file system. Llama 3 §3.3.1:
  // Tectonic "sustains 2 TB/s" (7 TB/s peak) for the 16K-GPU job's checkpoints.
  double storage_write_bytes_per_s = 2e12;
  // Time from a failure to training again (detect, reschedule, init NCCL, load checkpoint).
  // A placeholder to replace with a measured value: Daly 2006's worked example uses R = 10 min.
  double restart_seconds = 600;
  // 0 means unpriced: cost then reads 0. Prices vary too much by contract to default one.
  double price_per_gpu_hour = 0;
  // A machine `loom calibrate` measured (plan/machine_profile): MPI's measured collective and
  // send/recv costs replace the link models. Null for the presets' clusters.
  std::shared_ptr<const MeasuredComm> measured_comm;
  // Processors the ranks share, in ranks at full speed (a calibrated CPU's cores / threads per
  // rank): with more ranks than this they take turns (time_model, simulate_pipeline_on_shared_
  // cores). 0: one device per rank, the GPU clusters.
  int64_t cores = 0;

  int64_t gpus() const { return gpus_per_node * nodes; }
  // Throws a loom::Error naming the field, its value and the accepted range.
  void validate() const;
};

}  // namespace loom::plan
