#pragma once
// The planner's communication time model: alpha-beta (Hockney) costs of the collectives a
// parallel layout issues, over the links its group spans. A step that moves m bytes over a
// link costs latency_s + m / bytes_per_s; an algorithm is a count of steps and bytes per step.
// Algorithms and their costs: Thakur, Rabenseifner, Gropp, "Optimization of Collective
// Communication Operations in MPICH" (IJHPCA 2005); the ring's bandwidth
// optimality: Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
// workstations" (JPDC 2009); NCCL's double binary tree: Jeaugey, "Massively Scale Your Deep
// Learning Training with NCCL 2.4" (NVIDIA developer blog, 2019).
#include <cstdint>
#include <memory>
#include <vector>

#include "loom/plan/hardware.hpp"

namespace loom::plan {

// NCCL's own cost model charges one Ring/Simple step 3.4 us over NVLink and 9.6 us over the
// network (src/graph/tuning.cc, table hwLat; the figures shift by a few us between releases).
// Simple is the protocol NCCL uses for the large buffers that dominate a training step; its LL
// protocol cuts tiny messages to ~0.5 / ~2.7 us, so these latencies are pessimistic below ~64 KiB.
inline constexpr double kNvlinkStepLatencyS = 3.4e-6;
inline constexpr double kNetworkStepLatencyS = 9.6e-6;

// What NCCL moves over NVLink of the datasheet's line rate, and NVLink SHARP's all-reduce. From
// NCCL's maintainer (S. Jeaugey, NVIDIA/nccl-tests issue 212, 2024, on 8 H100 SXM): "450GB/s is
// the line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of
// 370GB/s" (ring collectives and send/recv), and all-reduce through NVLink SHARP (NVLS, NCCL's
// default on NVSwitch Hopper nodes) peaks at "algbw ~275GB/s" on 8 GPUs, whatever the bus-bandwidth
// arithmetic says: each GPU sends its buffer to the switch once and reads the sum once. Users'
// A100 reports in the same tracker (issues 149, 178: 200-210 GB/s bus bandwidth of 300) sit at or
// below the same fraction.
inline constexpr double kNcclNvlinkEfficiency = 370.0 / 450.0;
inline constexpr double kNvlsAllReduceAlgbwOfEffective = 275.0 / 370.0;

struct Link {
  double latency_s = 0;    // per step (alpha)
  double bytes_per_s = 0;  // one GPU's one-direction bandwidth (1 / beta)
};

enum class Collective { AllReduce, ReduceScatter, AllGather, AllToAll, Broadcast };

// Measured costs (`loom calibrate`, plan/machine_profile): one alpha-beta fit per collective and
// group size, measured with every group of that size busy at once, and one for a send/recv.
struct CollectiveFit {
  Collective op = Collective::AllReduce;
  int64_t group = 2;
  Link cost;
};
struct MeasuredComm {
  Link p2p;
  std::vector<CollectiveFit> collectives;
  const CollectiveFit* find(Collective op, int64_t group) const;  // null when not measured
};

struct GroupTopology {
  int64_t ranks = 1;           // size of the communicating group
  int64_t ranks_per_node = 1;  // the group's ranks sharing one node (NVLink domain); divides ranks
  Link intra;                  // NVLink (as NCCL achieves it)
  Link inter;                  // network, per GPU
  // Set (from ClusterSpec::measured_comm) on a profiled machine: a measured fit of the op at
  // this group size replaces the algorithm models below.
  std::shared_ptr<const MeasuredComm> measured;
  bool nvls = false;  // all-reduce within a node through NVLink SHARP (GpuSpec::nvls)
};

// The topology of a group of `ranks` ranks whose consecutive members are `stride` apart on the
// mesh (tp innermost, then ep, cp, dp, pp): ranks_per_node = clamp(gpus_per_node / stride, 1,
// ranks). Where that does not divide `ranks` (a group filling one node and part of another) we
// take its gcd with `ranks`, the smallest piece on any node, since the slowest piece sets the
// pace. Throws a loom::Error naming a bad argument.
GroupTopology group_topology(const ClusterSpec& cluster, int64_t ranks, int64_t stride);

struct CollectiveTime {
  double seconds = 0;
  const char* algorithm = "";      // "ring", "double_binary_tree", "hierarchical_ring", ...
  double wire_bytes_per_rank = 0;  // sent by the busiest rank, all links together
};

// `bytes`: the full buffer (all-reduce: the reduced buffer; reduce-scatter: the input of all
// ranks' blocks; all-gather: the gathered output; all-to-all: one rank's whole send buffer, its
// own block included; broadcast: the payload). Returns the fastest algorithm the model knows for
// the op, named. A group inside one node uses the intra link, one with a rank per node the inter
// link; a group spanning nodes with several ranks per node also gets the hierarchical forms.
// One rank or zero bytes cost nothing. On a profiled machine (topo.measured) a fit of the op at
// topo.ranks gives the time instead ("measured"; wire bytes still from the ring/pairwise
// count). Throws a loom::Error naming a bad field or argument.
CollectiveTime collective_time(Collective op, double bytes, const GroupTopology& topo);

// One message: latency + bytes / bandwidth; zero bytes cost nothing.
double p2p_time(double bytes, const Link& link);

// The cluster's links with the default latencies above, NVLink at kNcclNvlinkEfficiency of the
// preset's line rate; on a profiled machine
// (cluster.measured_comm) both are the measured send/recv link. A GPU without NVLink
// (nvlink_bytes_per_s = 0) talks to its node peers over PCIe and the NIC; we charge it the
// network link, a pessimistic stand-in.
Link nvlink_of(const ClusterSpec& cluster);
Link network_of(const ClusterSpec& cluster);

const char* collective_name(Collective op);

}  // namespace loom::plan
