// Multi-rank tests of the MPI process group and the device mesh. The binary runs under
// `mpirun -np N` for N = 1..4: every rank runs every test, expected values are computed for
// the world size at hand, and the job fails on every rank if any rank failed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "../test_support.hpp"
#include "loom/dist/device_mesh.hpp"
#include "loom/dist/mpi_process_group.hpp"
#include "loom/dist/runtime.hpp"

namespace loom {
namespace {

// A test that fails on one rank can leave the others inside a collective; this bounds how
// long they wait there, well inside ctest's limit (LOOM_COMM_TIMEOUT_S still wins if set).
constexpr double kTestCommTimeoutSeconds = 20.0;

DistRuntime* g_runtime = nullptr;

std::shared_ptr<ProcessGroup> world() { return g_runtime->world(); }
int world_size() { return g_runtime->world_size(); }
int world_rank() { return g_runtime->world_rank(); }

// Values are small integers, exact in f32, so sums compare exactly whatever order MPI adds in.
float value_at(int rank, int block, int index) {
  return static_cast<float>(1000 * rank + 10 * block + index);
}

TEST(DistCollectives, AllReduceSumAvgMax) {
  const int n = world_size();
  const int r = world_rank();
  constexpr int64_t kCount = 5;  // not a multiple of most world sizes
  std::vector<float> sum(kCount), avg(kCount), max(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    sum[i] = avg[i] = static_cast<float>((r + 1) * (i + 1));
    max[i] = static_cast<float>((r * 7 + i * 3) % 11);
  }
  world()->all_reduce(sum.data(), kCount, ReduceOp::Sum)->wait();
  world()->all_reduce(avg.data(), kCount, ReduceOp::Avg)->wait();
  world()->all_reduce(max.data(), kCount, ReduceOp::Max)->wait();
  for (int64_t i = 0; i < kCount; ++i) {
    const float expected_sum = static_cast<float>((i + 1) * n * (n + 1) / 2);
    float expected_max = 0;
    for (int peer = 0; peer < n; ++peer)
      expected_max = std::max(expected_max, static_cast<float>((peer * 7 + i * 3) % 11));
    EXPECT_EQ(sum[i], expected_sum) << "element " << i;
    EXPECT_FLOAT_EQ(avg[i], expected_sum / static_cast<float>(n)) << "element " << i;
    EXPECT_EQ(max[i], expected_max) << "element " << i;
  }
}

TEST(DistCollectives, ReduceScatterGivesEachRankTheReductionOfItsBlock) {
  const int n = world_size();
  const int r = world_rank();
  constexpr int64_t kPerRank = 3;
  std::vector<float> in(kPerRank * n);
  for (int block = 0; block < n; ++block)
    for (int k = 0; k < kPerRank; ++k) in[block * kPerRank + k] = value_at(r, block, k);
  std::vector<float> sum(kPerRank), avg(kPerRank), max(kPerRank);
  world()->reduce_scatter(in.data(), sum.data(), kPerRank, ReduceOp::Sum)->wait();
  world()->reduce_scatter(in.data(), avg.data(), kPerRank, ReduceOp::Avg)->wait();
  world()->reduce_scatter(in.data(), max.data(), kPerRank, ReduceOp::Max)->wait();
  for (int k = 0; k < kPerRank; ++k) {
    float expected_sum = 0;
    for (int peer = 0; peer < n; ++peer) expected_sum += value_at(peer, r, k);
    EXPECT_EQ(sum[k], expected_sum) << "element " << k;
    EXPECT_FLOAT_EQ(avg[k], expected_sum / static_cast<float>(n)) << "element " << k;
    EXPECT_EQ(max[k], value_at(n - 1, r, k)) << "element " << k;
  }
}

TEST(DistCollectives, AllGatherPlacesRankRInBlockR) {
  const int n = world_size();
  constexpr int64_t kPerRank = 4;
  std::vector<float> in(kPerRank), out(kPerRank * n, -1.0f);
  for (int k = 0; k < kPerRank; ++k) in[k] = value_at(world_rank(), 0, k);
  world()->all_gather(in.data(), out.data(), kPerRank)->wait();
  for (int block = 0; block < n; ++block)
    for (int k = 0; k < kPerRank; ++k) EXPECT_EQ(out[block * kPerRank + k], value_at(block, 0, k));
}

TEST(DistCollectives, BroadcastFromTheLastRank) {
  const int root = world_size() - 1;  // non-zero whenever there is more than one rank
  constexpr int64_t kCount = 7;
  std::vector<float> data(kCount, -1.0f);
  if (world_rank() == root)
    for (int i = 0; i < kCount; ++i) data[i] = 42.0f + static_cast<float>(i);
  world()->broadcast(data.data(), kCount, root)->wait();
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(data[i], 42.0f + static_cast<float>(i));
}

TEST(DistCollectives, AllToAllTransposesBlocks) {
  const int n = world_size();
  const int r = world_rank();
  constexpr int64_t kPerRank = 2;
  std::vector<float> in(kPerRank * n), out(kPerRank * n, -1.0f);
  for (int dest = 0; dest < n; ++dest)
    for (int k = 0; k < kPerRank; ++k) in[dest * kPerRank + k] = value_at(r, dest, k);
  world()->all_to_all(in.data(), out.data(), kPerRank)->wait();
  for (int source = 0; source < n; ++source)
    for (int k = 0; k < kPerRank; ++k)
      EXPECT_EQ(out[source * kPerRank + k], value_at(source, r, k));
}

// Elements rank `source` sends to rank `dest`: uneven, and zero for some pairs.
int64_t uneven_count(int source, int dest) { return (source + 2 * dest) % 3; }

struct UnevenExchange {
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<float> in, out;
};

UnevenExchange make_uneven_exchange(int n, int r) {
  UnevenExchange x;
  for (int peer = 0; peer < n; ++peer) {
    x.send_counts.push_back(uneven_count(r, peer));
    x.recv_counts.push_back(uneven_count(peer, r));
    for (int k = 0; k < uneven_count(r, peer); ++k) x.in.push_back(value_at(r, peer, k));
  }
  x.out.assign(std::accumulate(x.recv_counts.begin(), x.recv_counts.end(), int64_t{0}), -1.0f);
  return x;
}

TEST(DistCollectives, AllToAllvWithUnevenCounts) {
  const int n = world_size();
  const int r = world_rank();
  UnevenExchange x = make_uneven_exchange(n, r);
  world()->all_to_allv(x.in.data(), x.send_counts, x.out.data(), x.recv_counts)->wait();
  size_t offset = 0;
  for (int source = 0; source < n; ++source)
    for (int k = 0; k < uneven_count(source, r); ++k)
      EXPECT_EQ(x.out[offset++], value_at(source, r, k));
  EXPECT_EQ(offset, x.out.size());
}

TEST(DistPointToPoint, SendRecvAroundARing) {
  const int n = world_size();
  const int r = world_rank();
  const int next = (r + 1) % n;
  const int previous = (r + n - 1) % n;
  constexpr int64_t kCount = 6;
  constexpr int kTag = 7;
  std::vector<float> outgoing(kCount), incoming(kCount, -1.0f);
  for (int i = 0; i < kCount; ++i) outgoing[i] = value_at(r, 0, i);
  WorkHandle received = world()->recv(incoming.data(), kCount, previous, kTag);
  WorkHandle sent = world()->send(outgoing.data(), kCount, next, kTag);
  sent->wait();
  received->wait();
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(incoming[i], value_at(previous, 0, i));
}

TEST(DistCollectives, OutstandingOpsCompleteWhenWaitedInReverseOrder) {
  const int n = world_size();
  const int r = world_rank();
  constexpr int64_t kCount = 1000;  // large enough that nothing is finished at issue time
  std::vector<float> summed(kCount, 1.0f), averaged(kCount, static_cast<float>(r));
  std::vector<float> gathered(kCount * n), broadcast(kCount, r == 0 ? 3.0f : -1.0f);
  std::vector<float> exchanged_in(kCount * n), exchanged_out(kCount * n);
  for (int dest = 0; dest < n; ++dest)
    std::fill_n(exchanged_in.begin() + dest * kCount, kCount, static_cast<float>(10 * r + dest));
  const std::vector<float> mine(kCount, static_cast<float>(r));

  std::vector<WorkHandle> works;
  works.push_back(world()->all_reduce(summed.data(), kCount, ReduceOp::Sum));
  works.push_back(world()->all_gather(mine.data(), gathered.data(), kCount));
  works.push_back(world()->broadcast(broadcast.data(), kCount, 0));
  works.push_back(world()->all_reduce(averaged.data(), kCount, ReduceOp::Avg));
  works.push_back(world()->all_to_all(exchanged_in.data(), exchanged_out.data(), kCount));
  for (auto work = works.rbegin(); work != works.rend(); ++work) (*work)->wait();
  for (const WorkHandle& work : works)
    EXPECT_TRUE(work->test()) << "test() after wait() must say done";

  const float mean_rank = static_cast<float>(n - 1) / 2.0f;
  for (int64_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(summed[i], static_cast<float>(n));
    ASSERT_FLOAT_EQ(averaged[i], mean_rank);
    ASSERT_EQ(broadcast[i], 3.0f);
    for (int peer = 0; peer < n; ++peer) {
      ASSERT_EQ(gathered[peer * kCount + i], static_cast<float>(peer));
      ASSERT_EQ(exchanged_out[peer * kCount + i], static_cast<float>(10 * peer + r));
    }
  }

  // test() alone must drive an operation to completion (it is the only progress call here).
  std::vector<float> polled(kCount, 2.0f);
  WorkHandle work = world()->all_reduce(polled.data(), kCount, ReduceOp::Avg);
  while (!work->test()) {
  }
  work->wait();  // a no-op now; must not divide a second time
  EXPECT_EQ(polled[0], 2.0f);
}

// The model of process_group.hpp written out as numbers for each world size, so a change to
// either the formulas or the counting shows up here.
TEST(DistStats, ByteCountsFollowTheDocumentedModel) {
  const int n = world_size();
  const int r = world_rank();
  ASSERT_LE(n, 4) << "the expected figures below are tabulated for 1..4 ranks";
  const auto rank_index = static_cast<size_t>(n - 1);
  std::shared_ptr<ProcessGroup> group = world();
  group->reset_stats();

  std::vector<float> buffer(64, 1.0f), out(64);
  group->all_reduce(buffer.data(), 8, ReduceOp::Sum)
      ->wait();  // 32 bytes: 2(N-1)/N * 32, rounded down
  EXPECT_EQ(group->stats().sent(CommOp::AllReduce),
            (std::vector<int64_t>{0, 32, 42, 48}[rank_index]));
  EXPECT_EQ(group->stats().received(CommOp::AllReduce),
            (std::vector<int64_t>{0, 32, 42, 48}[rank_index]));

  group->reduce_scatter(buffer.data(), out.data(), 3, ReduceOp::Sum)
      ->wait();  // 12-byte blocks: (N-1) * 12
  EXPECT_EQ(group->stats().sent(CommOp::ReduceScatter), 12 * (n - 1));
  EXPECT_EQ(group->stats().received(CommOp::ReduceScatter), 12 * (n - 1));

  group->all_gather(buffer.data(), out.data(), 5)->wait();  // 20-byte blocks: (N-1) * 20
  EXPECT_EQ(group->stats().sent(CommOp::AllGather), 20 * (n - 1));
  EXPECT_EQ(group->stats().received(CommOp::AllGather), 20 * (n - 1));

  group->broadcast(buffer.data(), 10, 0)->wait();  // 40 bytes down the chain 0 -> 1 -> ... -> N-1
  const bool alone = n == 1;
  EXPECT_EQ(group->stats().sent(CommOp::Broadcast), alone || r == n - 1 ? 0 : 40);
  EXPECT_EQ(group->stats().received(CommOp::Broadcast), alone || r == 0 ? 0 : 40);

  group->all_to_all(buffer.data(), out.data(), 2)->wait();  // 8-byte blocks to N-1 others
  UnevenExchange x = make_uneven_exchange(n, r);
  group->all_to_allv(x.in.data(), x.send_counts, x.out.data(), x.recv_counts)->wait();
  int64_t uneven_sent = 0, uneven_received = 0;
  for (int peer = 0; peer < n; ++peer)
    if (peer != r) {
      uneven_sent += 4 * uneven_count(r, peer);
      uneven_received += 4 * uneven_count(peer, r);
    }
  EXPECT_EQ(group->stats().sent(CommOp::AllToAll), 8 * (n - 1) + uneven_sent);
  EXPECT_EQ(group->stats().received(CommOp::AllToAll), 8 * (n - 1) + uneven_received);

  WorkHandle received = group->recv(out.data(), 6, (r + n - 1) % n, 1);
  group->send(buffer.data(), 6, (r + 1) % n, 1)->wait();
  received->wait();
  EXPECT_EQ(group->stats().sent(CommOp::Send), 24);
  EXPECT_EQ(group->stats().received(CommOp::Recv), 24);
  EXPECT_EQ(group->stats().received(CommOp::Send) + group->stats().sent(CommOp::Recv), 0);

  group->barrier();
  EXPECT_EQ(group->stats().sent(CommOp::Barrier), 0);
  const std::vector<int64_t> expected_calls = {1, 1, 1, 1, 2, 1, 1, 1};  // CommOp order
  for (size_t op = 0; op < kCommOpCount; ++op)
    EXPECT_EQ(group->stats().calls[op], expected_calls[op])
        << comm_op_name(static_cast<CommOp>(op));

  group->reset_stats();
  EXPECT_EQ(group->stats().count(CommOp::AllReduce), 0);
  EXPECT_EQ(group->stats().sent(CommOp::AllToAll), 0);
}

TEST(DistStats, StatsCountAtIssueTime) {
  world()->reset_stats();
  std::vector<float> data(16, 1.0f);
  WorkHandle work = world()->all_reduce(data.data(), 16, ReduceOp::Sum);
  EXPECT_EQ(world()->stats().count(CommOp::AllReduce), 1);  // before wait()
  work->wait();
}

TEST(DistErrors, BadArgumentsThrowOnEveryRankBeforeAnythingIsIssued) {
  const int n = world_size();
  std::vector<float> data(8);
  test::expect_contains(
      test::error_message([&] { world()->broadcast(data.data(), 8, n); }),
      {"broadcast on group 'world'", "root is " + std::to_string(n), "expected a rank in [0, "});
  test::expect_contains(
      test::error_message([&] { world()->all_reduce(data.data(), -1, ReduceOp::Sum); }),
      {"all_reduce", "count is -1"});
  test::expect_contains(
      test::error_message([&] {
        world()->all_to_allv(data.data(), {1}, data.data(), std::vector<int64_t>(n + 1));
      }),
      {"all_to_allv", "send_counts has 1 entries", "one per rank (" + std::to_string(n) + ")"});
  test::expect_contains(test::error_message([&] { world()->send(data.data(), 1, 0, -3); }),
                        {"send", "tag is -3"});
  test::expect_contains(
      test::error_message([&] { world()->all_gather(data.data(), data.data(), 1); }),
      {"all_gather", "overlap"});
  test::expect_contains(test::error_message([&] { world()->set_timeout_seconds(0); }),
                        {"'world'", "timeout is 0"});
}

TEST(DistRuntimeTest, TimeoutComesFromTheEnvironmentAndSplitsInheritIt) {
  const char* saved = std::getenv(kCommTimeoutEnvVar);
  const std::string previous = saved ? saved : "";
  ::setenv(kCommTimeoutEnvVar, "7.5", 1);
  EXPECT_EQ(MpiProcessGroup(MPI_COMM_SELF, "self", MpiProcessGroup::CommOwnership::Borrowed)
                .timeout_seconds(),
            7.5);
  ::setenv(kCommTimeoutEnvVar, "soon", 1);
  test::expect_contains(test::error_message([] { (void)comm_timeout_seconds_from_env(); }),
                        {kCommTimeoutEnvVar, "'soon'", "positive number of seconds"});
  if (saved)
    ::setenv(kCommTimeoutEnvVar, previous.c_str(), 1);
  else
    ::unsetenv(kCommTimeoutEnvVar);

  std::shared_ptr<ProcessGroup> child = world()->split(0, world_rank(), "copy");
  EXPECT_EQ(child->timeout_seconds(), world()->timeout_seconds());
  EXPECT_EQ(child->size(), world_size());
  EXPECT_EQ(child->rank(), world_rank());
}

TEST(DistRuntimeTest, LaunchedByMpirunIsDetected) {
  EXPECT_TRUE(DistRuntime::launched_by_mpi_or_slurm()) << "these tests run under mpirun";
  EXPECT_GE(g_runtime->local_rank(), 0);
  EXPECT_LT(g_runtime->local_rank(), world_size());
}

// Every one-axis group of `mesh` holds exactly the ranks that agree on all other coordinates,
// ordered by the coordinate on its axis: checked by gathering world ranks over the group.
void expect_one_axis_groups_match_layout(DeviceMesh& mesh) {
  for (std::string_view axis : kMeshAxisNames) {
    SCOPED_TRACE(mesh.shape().to_string() + ", axis " + std::string(axis));
    std::shared_ptr<ProcessGroup> group = mesh.group({axis});
    ASSERT_EQ(group->size(), mesh.size(axis));
    EXPECT_EQ(group->rank(), mesh.coordinate(axis));
    EXPECT_EQ(group->name(), std::string(axis));
    const float me = static_cast<float>(mesh.rank());
    std::vector<float> members(group->size());
    group->all_gather(&me, members.data(), 1)->wait();
    std::array<int, kMeshAxisCount> coordinates{};
    for (int i = 0; i < kMeshAxisCount; ++i) coordinates[i] = mesh.coordinate(kMeshAxisNames[i]);
    for (int position = 0; position < group->size(); ++position) {
      coordinates[mesh_axis_index(axis)] = position;
      EXPECT_EQ(members[position], static_cast<float>(mesh.rank_at(coordinates)))
          << "member " << position;
    }
  }
}

TEST(DistMesh, OneAxisGroupsFollowTheRowMajorLayout) {
  const int n = world_size();
  std::vector<MeshShape> shapes = {MeshShape{.tp = n}, MeshShape{.dp = n}, MeshShape{.pp = n}};
  if (n == 4) {
    shapes.push_back(MeshShape{.dp = 2, .tp = 2});
    shapes.push_back(MeshShape{.pp = 2, .cp = 2});
    shapes.push_back(MeshShape{.ep = 2, .tp = 2});
  }
  for (const MeshShape& shape : shapes) {
    DeviceMesh mesh(*g_runtime, shape);
    EXPECT_EQ(mesh.rank_at({mesh.coordinate("pp"), mesh.coordinate("dp"), mesh.coordinate("cp"),
                            mesh.coordinate("ep"), mesh.coordinate("tp")}),
              mesh.rank());
    expect_one_axis_groups_match_layout(mesh);
  }
}

TEST(DistMesh, FourRanksAsTwoByTwo) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const int r = world_rank();
  DeviceMesh mesh(*g_runtime, MeshShape::parse("dp=2,tp=2"));
  EXPECT_EQ(mesh.coordinate("tp"), r % 2);
  EXPECT_EQ(mesh.coordinate("dp"), r / 2);

  // tp groups {0,1},{2,3}; dp groups {0,2},{1,3}: an all-reduce of the world rank shows which.
  float tp_sum = static_cast<float>(r);
  float dp_sum = static_cast<float>(r);
  mesh.group({"tp"})->all_reduce(&tp_sum, 1, ReduceOp::Sum)->wait();
  mesh.group({"dp"})->all_reduce(&dp_sum, 1, ReduceOp::Sum)->wait();
  EXPECT_EQ(tp_sum, r < 2 ? 1.0f : 5.0f);
  EXPECT_EQ(dp_sum, r % 2 == 0 ? 2.0f : 4.0f);

  std::shared_ptr<ProcessGroup> both = mesh.group({"tp", "dp"});
  EXPECT_EQ(both->name(), "dp+tp");
  EXPECT_EQ(both->size(), 4);
  EXPECT_EQ(both->rank(), r);
  EXPECT_EQ(mesh.group({"dp", "tp"}), both) << "one cached group per axis set, whatever the order";
  EXPECT_EQ(mesh.group({"tp"}), mesh.group({"tp"}));
  EXPECT_EQ(mesh.group({"pp"})->size(), 1);
}

TEST(DistMesh, SizeOneAxisGroupsAreLocalAndCorrect) {
  DeviceMesh mesh(*g_runtime, MeshShape{.tp = world_size()});
  std::shared_ptr<ProcessGroup> dp = mesh.group({"dp"});
  ASSERT_EQ(dp->size(), 1);
  std::vector<float> data = {1.0f, -2.0f, 3.0f}, out(3, 0.0f);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    WorkHandle work = dp->all_reduce(data.data(), 3, op);
    EXPECT_TRUE(work->test()) << "a one-rank collective is done when issued";
    EXPECT_EQ(data, (std::vector<float>{1.0f, -2.0f, 3.0f}));
  }
  dp->reduce_scatter(data.data(), out.data(), 3, ReduceOp::Avg)->wait();
  EXPECT_EQ(out, data);
  std::fill(out.begin(), out.end(), 0.0f);
  dp->all_to_allv(data.data(), {2}, out.data(), {2})->wait();
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.0f, 0.0f}));
  dp->broadcast(data.data(), 3, 0)->wait();
  dp->barrier();
  EXPECT_EQ(dp->stats().sent(CommOp::AllReduce), 0);
  EXPECT_EQ(dp->stats().count(CommOp::AllReduce), 3);
}

TEST(DistMesh, InvalidShapesAreRejectedWithTheirAxesAndTheWorldSize) {
  const int n = world_size();
  const MeshShape too_big{.dp = n + 1};
  test::expect_contains(test::error_message([&] { DeviceMesh mesh(*g_runtime, too_big); }),
                        {"dp=" + std::to_string(n + 1), "tp=1",
                         "world size is " + std::to_string(n), "must multiply to the world size"});
  test::expect_contains(test::error_message([] { MeshShape{.tp = 0}.validate(1); }),
                        {"'tp'", "size 0"});
  test::expect_contains(test::error_message([] { (void)MeshShape::parse("dp=2,zz=2"); }),
                        {"'dp=2,zz=2'", "unknown mesh axis 'zz'", "pp, dp, cp, ep, tp"});
  test::expect_contains(test::error_message([] { (void)MeshShape::parse("dp=0"); }),
                        {"'dp'", "'0'", "positive"});
  test::expect_contains(test::error_message([] { (void)MeshShape::parse("dp=2x"); }), {"'2x'"});
  test::expect_contains(test::error_message([] { (void)MeshShape::parse("dp=2,dp=2"); }),
                        {"given twice"});
  test::expect_contains(test::error_message([] { (void)MeshShape::parse("dp"); }),
                        {"'dp'", "axis=size"});

  const MeshShape parsed = MeshShape::parse(" tp=2, dp=3 ");
  EXPECT_EQ(parsed.to_string(), "pp=1,dp=3,cp=1,ep=1,tp=2");
  EXPECT_EQ(parsed.product(), 6);
  EXPECT_EQ(MeshShape::parse("").product(), 1);

  DeviceMesh mesh(*g_runtime, MeshShape{.dp = n});
  test::expect_contains(test::error_message([&] { mesh.group({"dp", "dp"}); }), {"'dp'", "twice"});
  test::expect_contains(test::error_message([&] { mesh.group({"xp"}); }),
                        {"unknown mesh axis 'xp'"});
  test::expect_contains(test::error_message([&] { (void)mesh.coordinate("row"); }), {"'row'"});
}

// Ranks other than 0 print only their failures, tagged with the rank, so the log stays readable.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  loom::DistRuntime runtime;
  loom::g_runtime = &runtime;
  if (std::getenv(loom::kCommTimeoutEnvVar) == nullptr)
    runtime.world()->set_timeout_seconds(loom::kTestCommTimeoutSeconds);

  if (runtime.world_rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new loom::RankFailurePrinter(runtime.world_rank()));
  }
  const int failed_here = RUN_ALL_TESTS() == 0 ? 0 : 1;

  // Every rank must return the same verdict, or mpirun reports whichever rank exits first.
  int failed_ranks = 0;
  MPI_Allreduce(&failed_here, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (runtime.world_rank() == 0)
    std::printf("loom dist tests on %d rank(s): %s (%d rank(s) failed)\n", runtime.world_size(),
                failed_ranks == 0 ? "PASSED" : "FAILED", failed_ranks);
  return failed_ranks == 0 ? 0 : 1;
}
