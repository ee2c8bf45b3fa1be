#include "loom/plan/collectives.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loom/core/error.hpp"

namespace loom::plan {
namespace {

// Steps of a binary tree over n ranks: ceil(log2 n).
double tree_depth(int64_t n) {
  double depth = 0;
  for (int64_t reach = 1; reach < n; reach *= 2) depth += 1;
  return depth;
}

double step(const Link& link, double bytes) { return link.latency_s + bytes / link.bytes_per_s; }

CollectiveTime fastest(const CollectiveTime& a, const CollectiveTime& b) {
  return b.seconds < a.seconds ? b : a;
}

// Ring reduce-scatter / all-gather (Thakur et al. 2005, the ring all-gather): n-1 steps of one
// block of bytes/n. Wire bytes = (n-1) blocks, as ring_reduce_scatter_wire_bytes counts.
CollectiveTime ring_half(double bytes, int64_t n, const Link& link) {
  const double block = bytes / static_cast<double>(n);
  return {static_cast<double>(n - 1) * step(link, block), "ring",
          static_cast<double>(n - 1) * block};
}

// Ring all-reduce = ring reduce-scatter + ring all-gather: 2(n-1) steps of bytes/n, moving
// 2(n-1)/n x bytes per rank, the lower bound Patarasuk & Yuan prove for all-reduce.
CollectiveTime ring_all_reduce(double bytes, int64_t n, const Link& link) {
  const CollectiveTime half = ring_half(bytes, n, link);
  return {2 * half.seconds, "ring", 2 * half.wire_bytes_per_rank};
}

// NCCL's double binary tree (Jeaugey 2019): two complementary trees each reduce then broadcast
// half the buffer, pipelined, so latency is ~2 log2(n) steps while each rank sends and receives
// ~2 x bytes (interior in one tree, leaf in the other) -- log-depth latency at about the ring's
// bandwidth for large n, where the ring's 2(n-1) latency terms hurt.
CollectiveTime tree_all_reduce(double bytes, int64_t n, const Link& link) {
  return {2 * tree_depth(n) * link.latency_s + 2 * bytes / link.bytes_per_s, "double_binary_tree",
          2 * bytes};
}

// NVLink SHARP (NVLS): the switch reduces. Each GPU sends its buffer once and reads the sum once,
// at kNvlsAllReduceAlgbwOfEffective of what NCCL moves over the link, whatever the group size
// within the node; one step's latency.
CollectiveTime nvls_all_reduce(double bytes, const Link& nvlink) {
  return {nvlink.latency_s + bytes / (kNvlsAllReduceAlgbwOfEffective * nvlink.bytes_per_s), "nvls",
          bytes};
}

// The flat algorithms treat a group as one set of peers. Once it spans nodes a ring or tree
// moves at its slowest edge, the network (NCCL runs one ring per NIC rail, which this ignores;
// the hierarchical forms below are our model of exploiting the fast intra-node hops).
const Link& flat_link(const GroupTopology& topo) {
  return topo.ranks_per_node == topo.ranks ? topo.intra : topo.inter;
}

// Hierarchical (2-D) forms, as in Horovod's hierarchical all-reduce and Jia et al. 2018
// ("Highly Scalable Deep Learning Training System with Mixed-Precision", arXiv:1807.11205): k ranks
// per node, m nodes. Reduce-scatter within the node first so the slow network only carries 1/k of
// the data per GPU, each GPU over its own NIC. All-reduce: intra reduce-scatter, inter all-reduce
// of 1/k (ring or tree), intra all-gather.
CollectiveTime hierarchical_all_reduce(double bytes, const GroupTopology& topo) {
  const int64_t k = topo.ranks_per_node;
  const double shard = bytes / static_cast<double>(k);
  const CollectiveTime intra = ring_half(bytes, k, topo.intra);
  const CollectiveTime ring = ring_all_reduce(shard, topo.ranks / k, topo.inter);
  const CollectiveTime tree = tree_all_reduce(shard, topo.ranks / k, topo.inter);
  const bool ring_wins = ring.seconds <= tree.seconds;
  const CollectiveTime& inter = ring_wins ? ring : tree;
  return {2 * intra.seconds + inter.seconds, ring_wins ? "hierarchical_ring" : "hierarchical_tree",
          2 * intra.wire_bytes_per_rank + inter.wire_bytes_per_rank};
}

// Reduce-scatter: intra reduce-scatter, then inter reduce-scatter of the 1/k shard. All-gather
// is its mirror image (inter all-gather, then intra) at the same cost, so the two add up to
// the hierarchical ring all-reduce.
CollectiveTime hierarchical_half(double bytes, const GroupTopology& topo) {
  const int64_t k = topo.ranks_per_node;
  const CollectiveTime intra = ring_half(bytes, k, topo.intra);
  const CollectiveTime inter =
      ring_half(bytes / static_cast<double>(k), topo.ranks / k, topo.inter);
  return {intra.seconds + inter.seconds, "hierarchical_ring",
          intra.wire_bytes_per_rank + inter.wire_bytes_per_rank};
}

// Pairwise exchange (Thakur et al. 2005, all-to-all for long messages): n-1 steps, one block of
// bytes/n to each peer. The k-1 peers in the node go over NVLink and the n-k others over the NIC;
// the two proceed at once.
CollectiveTime pairwise_all_to_all(double bytes, const GroupTopology& topo) {
  const int64_t n = topo.ranks;
  const int64_t k = topo.ranks_per_node;
  const double block = bytes / static_cast<double>(n);
  const double intra_s = k > 1 ? static_cast<double>(k - 1) * step(topo.intra, block) : 0.0;
  const double inter_s = n > k ? static_cast<double>(n - k) * step(topo.inter, block) : 0.0;
  return {std::max(intra_s, inter_s), "pairwise", static_cast<double>(n - 1) * block};
}

// Broadcast, chains and trees laid out node by node, so only m-1 hops cross the network.
// Pipelined chain (NCCL's ring broadcast, busbw factor 1): in the fine-pipelining limit every
// hop's latency once plus the payload at the slowest link's pace. Binomial tree (Thakur et al.
// 2005, short messages): log2 steps each moving the whole payload.
CollectiveTime broadcast(double bytes, const GroupTopology& topo) {
  const int64_t k = topo.ranks_per_node;
  const int64_t m = topo.ranks / k;
  const bool spans = m > 1;
  double slowest_bw = spans ? topo.inter.bytes_per_s : topo.intra.bytes_per_s;
  if (spans && k > 1) slowest_bw = std::min(slowest_bw, topo.intra.bytes_per_s);
  const double chain_s = static_cast<double>(topo.ranks - m) * topo.intra.latency_s +
                         static_cast<double>(m - 1) * topo.inter.latency_s + bytes / slowest_bw;
  const CollectiveTime chain{chain_s, "pipelined_chain", bytes};
  const double inter_steps = tree_depth(m);
  const double intra_steps = tree_depth(k);
  // Guarded, not multiplied by 0: a link the group does not use may be unset (0 bytes/s).
  const double tree_s = (inter_steps > 0 ? inter_steps * step(topo.inter, bytes) : 0.0) +
                        (intra_steps > 0 ? intra_steps * step(topo.intra, bytes) : 0.0);
  const CollectiveTime tree{tree_s, "binomial_tree", (inter_steps + intra_steps) * bytes};
  return fastest(chain, tree);
}

void require_link(const char* context, const char* which, const Link& link) {
  if (!(link.latency_s >= 0 && std::isfinite(link.latency_s)))
    throw_error(context, ": ", which, ".latency_s = ", link.latency_s,
                "; expected a finite number >= 0");
  if (!(link.bytes_per_s > 0 && std::isfinite(link.bytes_per_s)))
    throw_error(context, ": ", which, ".bytes_per_s = ", link.bytes_per_s,
                "; expected a positive, finite bandwidth");
}

void require_bytes(const char* what, double bytes) {
  if (!(bytes >= 0 && std::isfinite(bytes)))
    throw_error(what, ": bytes = ", bytes, "; expected a finite number >= 0");
}

// Only the links the group uses must be set: a node-local group needs no network.
void validate(const GroupTopology& topo) {
  if (topo.ranks < 1) throw_error("collective topology: ranks = ", topo.ranks, "; expected >= 1");
  if (topo.ranks_per_node < 1 || topo.ranks_per_node > topo.ranks ||
      topo.ranks % topo.ranks_per_node != 0)
    throw_error("collective topology: ranks_per_node = ", topo.ranks_per_node,
                " with ranks = ", topo.ranks, "; expected a divisor of ranks (1 to ", topo.ranks,
                ")");
  if (topo.ranks_per_node > 1) require_link("collective topology", "intra", topo.intra);
  if (topo.ranks_per_node < topo.ranks) require_link("collective topology", "inter", topo.inter);
}

}  // namespace

const char* collective_name(Collective op) {
  switch (op) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::AllToAll: return "all_to_all";
    case Collective::Broadcast: return "broadcast";
  }
  return "unknown";
}

GroupTopology group_topology(const ClusterSpec& cluster, int64_t ranks, int64_t stride) {
  if (ranks < 1) throw_error("group_topology: ranks = ", ranks, "; expected >= 1");
  if (stride < 1) throw_error("group_topology: stride = ", stride, "; expected >= 1");
  if (cluster.gpus_per_node < 1)
    throw_error("group_topology: cluster.gpus_per_node = ", cluster.gpus_per_node,
                "; expected >= 1");
  const int64_t fitting = std::clamp<int64_t>(cluster.gpus_per_node / stride, 1, ranks);
  GroupTopology topo;
  topo.ranks = ranks;
  topo.ranks_per_node = std::gcd(ranks, fitting);
  topo.intra = nvlink_of(cluster);
  topo.nvls = cluster.gpu.nvls && !cluster.measured_comm && cluster.gpu.nvlink_bytes_per_s > 0;
  topo.inter = network_of(cluster);
  topo.measured = cluster.measured_comm;
  return topo;
}

const CollectiveFit* MeasuredComm::find(Collective op, int64_t group) const {
  for (const CollectiveFit& fit : collectives)
    if (fit.op == op && fit.group == group) return &fit;
  return nullptr;
}

CollectiveTime collective_time(Collective op, double bytes, const GroupTopology& topo) {
  validate(topo);
  require_bytes(collective_name(op), bytes);
  if (topo.ranks == 1 || bytes == 0) return {0, "none", 0};
  const int64_t n = topo.ranks;
  const Link& link = flat_link(topo);
  const bool spans_shared_nodes = topo.ranks_per_node > 1 && topo.ranks_per_node < n;
  CollectiveTime best;
  if (topo.measured) {
    if (const CollectiveFit* fit = topo.measured->find(op, n)) {
      const double block = bytes / static_cast<double>(n);
      const double wire = op == Collective::AllReduce   ? 2.0 * static_cast<double>(n - 1) * block
                          : op == Collective::Broadcast ? bytes
                                                        : static_cast<double>(n - 1) * block;
      return {step(fit->cost, bytes), "measured", wire};
    }
  }
  switch (op) {
    case Collective::AllReduce:
      best = fastest(ring_all_reduce(bytes, n, link), tree_all_reduce(bytes, n, link));
      if (topo.nvls && topo.ranks_per_node == n) best = fastest(best, nvls_all_reduce(bytes, link));
      return spans_shared_nodes ? fastest(best, hierarchical_all_reduce(bytes, topo)) : best;
    case Collective::ReduceScatter:
    case Collective::AllGather:
      best = ring_half(bytes, n, link);
      return spans_shared_nodes ? fastest(best, hierarchical_half(bytes, topo)) : best;
    case Collective::AllToAll: return pairwise_all_to_all(bytes, topo);
    case Collective::Broadcast: return broadcast(bytes, topo);
  }
  return best;
}

double p2p_time(double bytes, const Link& link) {
  require_bytes("p2p_time", bytes);
  require_link("p2p_time", "link", link);
  return bytes == 0 ? 0.0 : step(link, bytes);
}

Link nvlink_of(const ClusterSpec& cluster) {
  if (cluster.measured_comm) return cluster.measured_comm->p2p;
  if (cluster.gpu.nvlink_bytes_per_s <= 0) return network_of(cluster);
  return {kNvlinkStepLatencyS, kNcclNvlinkEfficiency * cluster.gpu.nvlink_bytes_per_s};
}

Link network_of(const ClusterSpec& cluster) {
  if (cluster.measured_comm) return cluster.measured_comm->p2p;
  return {kNetworkStepLatencyS, cluster.inter_node_bytes_per_s_per_gpu};
}

}  // namespace loom::plan
