// Planner communication time model: alpha-beta costs hand-computed for rings, trees and the
// hierarchical forms; the fastest algorithm chosen and named; wire bytes equal to the engine's
// ring counters (dist/process_group.hpp); mesh strides mapped to ranks per node; and errors
// that name the field at fault.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "loom/dist/process_group.hpp"
#include "loom/plan/collectives.hpp"
#include "loom/plan/hardware.hpp"
#include "test_support.hpp"

namespace loom::test {
namespace {

using plan::Collective;
using plan::collective_time;
using plan::CollectiveTime;
using plan::GroupTopology;
using plan::Link;

// Round numbers so the expected values below can be checked by hand.
constexpr Link kNvlink{3e-6, 450e9};
constexpr Link kNetwork{10e-6, 50e9};
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

GroupTopology topology(int64_t ranks, int64_t ranks_per_node) {
  return GroupTopology{ranks, ranks_per_node, kNvlink, kNetwork, nullptr};
}

// Relative tolerance: the model is a few dozen floating-point operations.
void expect_close(double actual, double expected) {
  EXPECT_NEAR(actual, expected, 1e-12 * std::abs(expected)) << "expected " << expected;
}

TEST(PlanCollectives, RingAllReduceOnEightNvlinkGpus) {
  const double bytes = kGiB;
  const CollectiveTime t = collective_time(Collective::AllReduce, bytes, topology(8, 8));
  EXPECT_STREQ(t.algorithm, "ring");
  expect_close(t.seconds, 2 * 7 * (kNvlink.latency_s + bytes / 8 / kNvlink.bytes_per_s));
  // 1 GiB divides by 8, so the engine's integer counter is exact.
  EXPECT_EQ(t.wire_bytes_per_rank,
            static_cast<double>(ring_all_reduce_wire_bytes(static_cast<int64_t>(bytes), 8).sent));
  // The tree's 2 x bytes bandwidth term loses to the ring's 2 x 7/8 x bytes at this size.
  EXPECT_LT(t.seconds, 2 * bytes / kNvlink.bytes_per_s);
}

// NVLink as NCCL uses it (collectives.hpp, S. Jeaugey in NVIDIA/nccl-tests issue 212): 370 of an
// H100's 450 GB/s line rate for rings and sends, and on NVSwitch Hopper nodes an all-reduce
// through NVLink SHARP at an algorithm bandwidth of 275 GB/s, by hand.
TEST(PlanCollectives, NvlinkAsNcclMovesItAndNvlinkSharp) {
  plan::ClusterSpec h100;  // 8 H100 SXM per node
  const GroupTopology tp8 = plan::group_topology(h100, 8, 1);
  expect_close(tp8.intra.bytes_per_s, 370e9);
  EXPECT_TRUE(tp8.nvls);
  const double bytes = kGiB;
  const CollectiveTime nvls = collective_time(Collective::AllReduce, bytes, tp8);
  EXPECT_STREQ(nvls.algorithm, "nvls");
  expect_close(nvls.seconds, 3.4e-6 + bytes / 275e9);
  EXPECT_EQ(nvls.wire_bytes_per_rank, bytes);
  // The ring would take 2 x 7 steps of 1/8 at 370 GB/s: 5.1 ms against NVLS's 3.9.
  EXPECT_GT(2 * 7 * (3.4e-6 + bytes / 8 / 370e9), nvls.seconds);
  // Two ranks: the ring's one step each way (1 x bytes at 370) beats NVLS (1 x bytes at 275).
  const CollectiveTime two =
      collective_time(Collective::AllReduce, bytes, plan::group_topology(h100, 2, 1));
  EXPECT_STREQ(two.algorithm, "ring");
  expect_close(two.seconds, 2 * (3.4e-6 + bytes / 2 / 370e9));
  // Reduce-scatter and all-gather stay rings; an all-reduce spanning nodes is no NVLS one.
  EXPECT_STREQ(collective_time(Collective::ReduceScatter, bytes, tp8).algorithm, "ring");
  h100.nodes = 2;
  EXPECT_STRNE(
      collective_time(Collective::AllReduce, bytes, plan::group_topology(h100, 16, 1)).algorithm,
      "nvls");
  // An A100 node has NVSwitch without SHARP: rings at 370/450 of its 300 GB/s.
  plan::ClusterSpec a100;
  a100.gpu = plan::gpu_preset("a100-80gb");
  const GroupTopology a = plan::group_topology(a100, 8, 1);
  EXPECT_FALSE(a.nvls);
  expect_close(a.intra.bytes_per_s, 300e9 * 370 / 450);
  EXPECT_STREQ(collective_time(Collective::AllReduce, bytes, a).algorithm, "ring");
}

TEST(PlanCollectives, TreeWinsForTinyMessagesAtLargeN) {
  const double bytes = 4096;
  const CollectiveTime t = collective_time(Collective::AllReduce, bytes, topology(256, 1));
  EXPECT_STREQ(t.algorithm, "double_binary_tree");
  // 2 log2(256) = 16 latency terms against the ring's 2 x 255.
  expect_close(t.seconds, 16 * kNetwork.latency_s + 2 * bytes / kNetwork.bytes_per_s);
  EXPECT_LT(t.seconds, 2 * 255 * kNetwork.latency_s);
  // With two ranks the tree saves no latency and doubles the bytes: the ring must win.
  EXPECT_STREQ(collective_time(Collective::AllReduce, bytes, topology(2, 1)).algorithm, "ring");
}

TEST(PlanCollectives, ReduceScatterPlusAllGatherIsRingAllReduce) {
  const double bytes = kGiB;
  for (const GroupTopology& topo : {topology(8, 8), topology(128, 8)}) {
    const CollectiveTime rs = collective_time(Collective::ReduceScatter, bytes, topo);
    const CollectiveTime ag = collective_time(Collective::AllGather, bytes, topo);
    const CollectiveTime ar = collective_time(Collective::AllReduce, bytes, topo);
    EXPECT_EQ(std::string(rs.algorithm) + "/" + ag.algorithm,
              topo.ranks == 8 ? "ring/ring" : "hierarchical_ring/hierarchical_ring");
    EXPECT_STREQ(ar.algorithm, topo.ranks == 8 ? "ring" : "hierarchical_ring");
    expect_close(rs.seconds + ag.seconds, ar.seconds);
    expect_close(rs.wire_bytes_per_rank + ag.wire_bytes_per_rank, ar.wire_bytes_per_rank);
  }
  // Flat ring reduce-scatter moves n-1 blocks of bytes/n, as the engine counts it.
  const CollectiveTime rs = collective_time(Collective::ReduceScatter, bytes, topology(8, 8));
  EXPECT_EQ(
      rs.wire_bytes_per_rank,
      static_cast<double>(ring_reduce_scatter_wire_bytes(static_cast<int64_t>(bytes / 8), 8).sent));
}

TEST(PlanCollectives, HierarchicalBeatsFlatRingAcrossSixteenNodes) {
  const double bytes = kGiB;  // 16 nodes x 8 ranks
  const CollectiveTime t = collective_time(Collective::AllReduce, bytes, topology(128, 8));
  EXPECT_STREQ(t.algorithm, "hierarchical_ring");
  // Intra reduce-scatter and all-gather (7 steps of bytes/8 each), then a 16-rank ring
  // all-reduce of the bytes/8 shard over the network (30 steps of bytes/128).
  const double intra = 7 * (kNvlink.latency_s + bytes / 8 / kNvlink.bytes_per_s);
  const double inter = 2 * 15 * (kNetwork.latency_s + bytes / 128 / kNetwork.bytes_per_s);
  expect_close(t.seconds, 2 * intra + inter);
  expect_close(t.wire_bytes_per_rank, 2 * 7 * bytes / 8 + 2 * 15 * bytes / 128);
  const double flat_ring = 2 * 127 * (kNetwork.latency_s + bytes / 128 / kNetwork.bytes_per_s);
  EXPECT_LT(t.seconds, 0.5 * flat_ring);
  // And it beats whatever the same group does with one rank per node.
  EXPECT_LT(t.seconds, collective_time(Collective::AllReduce, bytes, topology(128, 1)).seconds);
}

TEST(PlanCollectives, AllToAllAndBroadcastHandComputed) {
  const double bytes = kGiB;
  const CollectiveTime a2a = collective_time(Collective::AllToAll, bytes, topology(8, 8));
  EXPECT_STREQ(a2a.algorithm, "pairwise");
  expect_close(a2a.seconds, 7 * (kNvlink.latency_s + bytes / 8 / kNvlink.bytes_per_s));
  const auto block = static_cast<int64_t>(bytes / 8);
  EXPECT_EQ(a2a.wire_bytes_per_rank,
            static_cast<double>(pairwise_all_to_all_wire_bytes(7 * block, 7 * block).sent));
  // Two nodes of 8: 7 peers over NVLink and 8 over the network at once; the network is slower.
  const CollectiveTime spread = collective_time(Collective::AllToAll, bytes, topology(16, 8));
  expect_close(spread.seconds, 8 * (kNetwork.latency_s + bytes / 16 / kNetwork.bytes_per_s));

  const CollectiveTime bcast = collective_time(Collective::Broadcast, bytes, topology(8, 8));
  EXPECT_STREQ(bcast.algorithm, "pipelined_chain");
  expect_close(bcast.seconds, 7 * kNvlink.latency_s + bytes / kNvlink.bytes_per_s);
  // The root forwards the payload once, as the engine's chain counter says.
  EXPECT_EQ(bcast.wire_bytes_per_rank,
            static_cast<double>(chain_broadcast_wire_bytes(8 * block, 8, 0, 0).sent));
  const CollectiveTime tiny = collective_time(Collective::Broadcast, 64, topology(8, 8));
  EXPECT_STREQ(tiny.algorithm, "binomial_tree");
  expect_close(tiny.seconds, 3 * (kNvlink.latency_s + 64 / kNvlink.bytes_per_s));

  expect_close(plan::p2p_time(bytes, kNetwork), kNetwork.latency_s + bytes / kNetwork.bytes_per_s);
  EXPECT_EQ(plan::p2p_time(0, kNetwork), 0);
}

TEST(PlanCollectives, SingleRankOrNoBytesCostsNothing) {
  for (Collective op : {Collective::AllReduce, Collective::ReduceScatter, Collective::AllGather,
                        Collective::AllToAll, Collective::Broadcast}) {
    const CollectiveTime one = collective_time(op, kGiB, topology(1, 1));
    EXPECT_EQ(one.seconds, 0) << plan::collective_name(op);
    EXPECT_EQ(one.wire_bytes_per_rank, 0) << plan::collective_name(op);
    EXPECT_EQ(collective_time(op, 0, topology(64, 8)).seconds, 0) << plan::collective_name(op);
  }
}

TEST(PlanCollectives, GroupTopologyFromMeshStride) {
  plan::ClusterSpec cluster;  // 8 H100s per node
  cluster.nodes = 16;
  const GroupTopology tp = plan::group_topology(cluster, 8, 1);
  EXPECT_EQ(tp.ranks_per_node, 8);
  expect_close(tp.intra.bytes_per_s, plan::kNcclNvlinkEfficiency * cluster.gpu.nvlink_bytes_per_s);
  EXPECT_EQ(tp.intra.latency_s, plan::kNvlinkStepLatencyS);
  EXPECT_EQ(tp.inter.bytes_per_s, cluster.inter_node_bytes_per_s_per_gpu);
  EXPECT_EQ(tp.inter.latency_s, plan::kNetworkStepLatencyS);
  EXPECT_EQ(plan::group_topology(cluster, 16, 8).ranks_per_node, 1);  // dp over tp = 8
  EXPECT_EQ(plan::group_topology(cluster, 4, 2).ranks_per_node, 4);   // 4 ranks, 2 apart
  EXPECT_EQ(plan::group_topology(cluster, 8, 2).ranks_per_node, 4);   // 2 nodes of 4
  EXPECT_EQ(plan::group_topology(cluster, 2, 1).ranks_per_node, 2);   // clamped to ranks
  EXPECT_EQ(plan::group_topology(cluster, 4, 16).ranks_per_node, 1);  // stride past a node
  // 12 ranks fill one node and half of the next: the smaller piece (4) sets the pace.
  EXPECT_EQ(plan::group_topology(cluster, 12, 1).ranks_per_node, 4);
  // No NVLink: node peers are charged the network link.
  cluster.gpu.nvlink_bytes_per_s = 0;
  EXPECT_EQ(plan::nvlink_of(cluster).bytes_per_s, cluster.inter_node_bytes_per_s_per_gpu);
}

TEST(PlanCollectives, BadInputNamesTheField) {
  expect_contains(error_message([] { collective_time(Collective::AllReduce, 1, topology(0, 1)); }),
                  {"ranks = 0"});
  expect_contains(error_message([] { collective_time(Collective::AllReduce, 1, topology(12, 8)); }),
                  {"ranks_per_node = 8", "ranks = 12", "divisor"});
  expect_contains(
      error_message([] { collective_time(Collective::ReduceScatter, -1, topology(8, 8)); }),
      {"reduce_scatter", "bytes = -1"});
  expect_contains(error_message([] {
                    collective_time(Collective::AllGather, std::numeric_limits<double>::quiet_NaN(),
                                    topology(8, 8));
                  }),
                  {"all_gather", "bytes = nan"});
  // A group spanning nodes needs the network link to be set.
  expect_contains(error_message([] {
                    collective_time(Collective::AllReduce, 1, GroupTopology{16, 8, kNvlink, {}, nullptr});
                  }),
                  {"inter.bytes_per_s = 0"});
  expect_contains(error_message([] { plan::p2p_time(-5, kNetwork); }), {"p2p_time", "bytes = -5"});
  const plan::ClusterSpec cluster;
  expect_contains(error_message([&] { plan::group_topology(cluster, 0, 1); }), {"ranks = 0"});
  expect_contains(error_message([&] { plan::group_topology(cluster, 8, 0); }), {"stride = 0"});
}

}  // namespace
}  // namespace loom::test
