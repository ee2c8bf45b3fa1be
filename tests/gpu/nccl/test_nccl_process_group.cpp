// The NCCL ProcessGroup at run time: one rank per GPU under mpirun, every collective and
// send/recv on device buffers against values computed here, Work semantics (test/wait,
// several in flight, wait() ordering the stream without holding the host), split, and the argument
// checks. Ranks without a GPU of their own skip every test ("not run"), so a CPU-only machine never
// counts them as passed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/dist/nccl/nccl_process_group.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/parallel/pipeline_channels.hpp"

namespace loom {
namespace {

int g_rank = 0, g_size = 1, g_devices = 0;

// Values are small integers, exact in f32, so any summation order gives the same result.
float value_at(int rank, int block, int index) { return static_cast<float>(1000 * rank + 10 * block + index); }

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_devices < g_size)
      GTEST_SKIP() << "NCCL needs one GPU per rank: " << g_devices << " visible for " << g_size << " rank(s): not run";
    group_ = std::make_unique<NcclProcessGroup>(MPI_COMM_WORLD, "world");
  }
  std::unique_ptr<NcclProcessGroup> group_;
};

// n floats of device memory, filled from and read back into host vectors.
class Device {
 public:
  explicit Device(const std::vector<float>& host) : n_(host.size()) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), n_ * sizeof(float)) != cudaSuccess) throw_error("cudaMalloc");
    if (cudaMemcpy(ptr_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
      throw_error("cudaMemcpy to the device");
  }
  explicit Device(size_t n) : Device(std::vector<float>(n, -1.0f)) {}
  ~Device() { cudaFree(ptr_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  float* get() { return ptr_; }
  std::vector<float> host() const {
    std::vector<float> out(n_);
    if (cudaMemcpy(out.data(), ptr_, n_ * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw_error("cudaMemcpy to the host");
    return out;
  }

 private:
  size_t n_;
  float* ptr_ = nullptr;
};

TEST_F(NcclTest, AllReduceSumAvgMax) {
  const int n = g_size, r = g_rank;
  constexpr int kCount = 1000;
  std::vector<float> mine(kCount);
  for (int i = 0; i < kCount; ++i) mine[static_cast<size_t>(i)] = value_at(r, 0, i);
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    Device buffer(mine);
    group_->all_reduce(buffer.get(), kCount, op)->wait();
    const auto got = buffer.host();
    for (int i = 0; i < kCount; i += 97) {
      double sum = 0, max = -1e30;
      for (int q = 0; q < n; ++q) {
        sum += value_at(q, 0, i);
        max = std::max(max, static_cast<double>(value_at(q, 0, i)));
      }
      const double expected = op == ReduceOp::Sum ? sum : op == ReduceOp::Avg ? sum / n : max;
      EXPECT_FLOAT_EQ(got[static_cast<size_t>(i)], static_cast<float>(expected)) << "element " << i;
    }
  }
}

// dist/tensor_comm over NCCL: an f32 device tensor goes straight to the group, and the group's
// stream is ordered after the kernel that wrote it (no synchronisation in between: scale_ runs
// on the default stream and the all-reduce must see its result); bf16 device tensors and host
// arrays are staged through f32 device buffers and written back on wait().
TEST_F(NcclTest, TensorCommIsStreamOrderedAndStagesBf16AndHostArrays) {
  const int n = g_size, r = g_rank;
  constexpr int64_t kCount = 1 << 20;  // large enough that an unordered read would see old values
  std::vector<float> mine(kCount, static_cast<float>(r + 1));
  Tensor host = Tensor::empty({kCount}, DType::F32, MemCategory::Workspace);
  std::copy(mine.begin(), mine.end(), host.f32());
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor t = Tensor::empty({kCount}, dtype, MemCategory::Workspace, loom::Device::CUDA);
    t.copy_from(host);
    EXPECT_EQ(comm::takes_directly(*group_, t), dtype == DType::F32);
    ops::scale_(t, 2.0f);  // queued on the default stream, not waited for
    comm::all_reduce(*group_, t, ReduceOp::Sum)->wait();
    const std::vector<float> got = t.to_f32_vector();
    const float expected = static_cast<float>(n * (n + 1));  // sum of 2 (q + 1)
    for (int64_t i = 0; i < kCount; i += 4099) ASSERT_EQ(got[static_cast<size_t>(i)], expected) << i;
  }
  float scalars[2] = {static_cast<float>(r), 1.0f};
  comm::all_reduce(*group_, scalars, 2, ReduceOp::Sum)->wait();
  EXPECT_EQ(scalars[0], static_cast<float>(n * (n - 1) / 2));
  EXPECT_EQ(scalars[1], static_cast<float>(n));
  float flag = r == 0 ? 7.0f : 0.0f;
  comm::broadcast(*group_, &flag, 1, 0)->wait();
  EXPECT_EQ(flag, 7.0f);
  std::vector<float> all(static_cast<size_t>(2 * n), -1.0f);
  const float pair[2] = {static_cast<float>(10 * r), static_cast<float>(10 * r + 1)};
  comm::all_gather(*group_, pair, all.data(), 2)->wait();
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(all[static_cast<size_t>(2 * q)], static_cast<float>(10 * q));
    EXPECT_EQ(all[static_cast<size_t>(2 * q + 1)], static_cast<float>(10 * q + 1));
  }
}

TEST_F(NcclTest, ReduceScatterAndAllGather) {
  const int n = g_size, r = g_rank;
  constexpr int kBlock = 64;
  std::vector<float> in(static_cast<size_t>(n * kBlock));
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < kBlock; ++i) in[static_cast<size_t>(b * kBlock + i)] = value_at(r, b, i);
  Device send(in), reduced(static_cast<size_t>(kBlock));
  group_->reduce_scatter(send.get(), reduced.get(), kBlock, ReduceOp::Sum)->wait();
  const auto block = reduced.host();
  for (int i = 0; i < kBlock; ++i) {
    float expected = 0;
    for (int q = 0; q < n; ++q) expected += value_at(q, r, i);
    EXPECT_FLOAT_EQ(block[static_cast<size_t>(i)], expected);
  }
  std::vector<float> own(kBlock);
  for (int i = 0; i < kBlock; ++i) own[static_cast<size_t>(i)] = value_at(r, 0, i);
  Device gather_in(own), gathered(static_cast<size_t>(n * kBlock));
  group_->all_gather(gather_in.get(), gathered.get(), kBlock)->wait();
  const auto all = gathered.host();
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < kBlock; ++i) EXPECT_FLOAT_EQ(all[static_cast<size_t>(q * kBlock + i)], value_at(q, 0, i));
}

TEST_F(NcclTest, BroadcastFromTheLastRankAndAllToAll) {
  const int n = g_size, r = g_rank;
  std::vector<float> data(100);
  for (int i = 0; i < 100; ++i) data[static_cast<size_t>(i)] = value_at(r, 1, i);
  Device buffer(data);
  group_->broadcast(buffer.get(), 100, n - 1)->wait();
  const auto got = buffer.host();
  for (int i = 0; i < 100; ++i) EXPECT_FLOAT_EQ(got[static_cast<size_t>(i)], value_at(n - 1, 1, i));

  constexpr int kBlock = 8;
  std::vector<float> in(static_cast<size_t>(n * kBlock));
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < kBlock; ++i) in[static_cast<size_t>(b * kBlock + i)] = value_at(r, b, i);
  Device send(in), received(static_cast<size_t>(n * kBlock));
  group_->all_to_all(send.get(), received.get(), kBlock)->wait();
  const auto out = received.host();
  for (int q = 0; q < n; ++q)  // block q of mine is block r of rank q's input
    for (int i = 0; i < kBlock; ++i) EXPECT_FLOAT_EQ(out[static_cast<size_t>(q * kBlock + i)], value_at(q, r, i));
}

TEST_F(NcclTest, SendRecvAroundARing) {
  const int n = g_size, r = g_rank;
  if (n < 2) GTEST_SKIP() << "a ring needs 2 ranks (2 GPUs)";
  std::vector<float> mine(256);
  for (int i = 0; i < 256; ++i) mine[static_cast<size_t>(i)] = value_at(r, 2, i);
  Device send(mine), received(256);
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  // Even ranks send first: NCCL point-to-point calls block until their peer posts the match.
  WorkHandle a, b;
  if (r % 2 == 0) {
    a = group_->send(send.get(), 256, next, 0);
    b = group_->recv(received.get(), 256, previous, 0);
  } else {
    b = group_->recv(received.get(), 256, previous, 0);
    a = group_->send(send.get(), 256, next, 0);
  }
  a->wait();
  b->wait();
  const auto got = received.host();
  for (int i = 0; i < 256; ++i) EXPECT_FLOAT_EQ(got[static_cast<size_t>(i)], value_at(previous, 2, i));
}

// The pipeline's channels over NCCL: every rank posts all its sends (4 MiB each, more than
// NCCL buffers without a posted receive) before any receive, both kinds, then receives the
// gradients first. On one shared stream the first send would hold the stream, and the peer's
// send would hold its own, for good; on the one-way channels each kind arrives, in order.
TEST_F(NcclTest, PipelineChannelsNeverPutASendInFrontOfAReceive) {
  const int n = g_size, r = g_rank;
  if (n < 2) GTEST_SKIP() << "a pipeline needs 2 ranks (2 GPUs)";
  PipelineChannels channels(*group_);
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  constexpr int64_t kCount = int64_t{1} << 20;
  auto filled = [&](int sender, int kind, int k) {
    std::vector<float> v(static_cast<size_t>(kCount));
    for (int64_t i = 0; i < kCount; i += 4096) v[static_cast<size_t>(i)] = value_at(sender, 10 * kind + k, static_cast<int>(i / 4096));
    return v;
  };
  std::vector<Tensor> out;
  std::vector<WorkHandle> sends;
  for (int k = 0; k < 2; ++k)
    for (int kind = 0; kind < 2; ++kind) {
      const Tensor host = Tensor::empty({kCount}, DType::F32, MemCategory::Workspace);
      const std::vector<float> v = filled(r, kind, k);
      std::copy(v.begin(), v.end(), host.f32());
      out.push_back(host.to(loom::Device::CUDA, MemCategory::CommBuffers));
      const auto message = kind == 0 ? PipeMessage::Activation : PipeMessage::Gradient;
      sends.push_back(channels.send(message, out.back(), kind == 0 ? next : previous));
    }
  for (int kind : {1, 0})
    for (int k = 0; k < 2; ++k) {
      const Tensor in = Tensor::zeros({kCount}, DType::F32, MemCategory::Workspace, loom::Device::CUDA);
      const int from = kind == 0 ? previous : next;
      channels.recv(kind == 0 ? PipeMessage::Activation : PipeMessage::Gradient, in, from)->wait();
      const std::vector<float> got = in.to_f32_vector(), want = filled(from, kind, k);
      for (int64_t i = 0; i < kCount; i += 4096)
        ASSERT_EQ(got[static_cast<size_t>(i)], want[static_cast<size_t>(i)]) << "kind " << kind << " message " << k;
    }
  for (const WorkHandle& s : sends) s->wait();
}

// Several operations in flight, completed in reverse order; test() polls without blocking.
TEST_F(NcclTest, OutstandingWorkCompletesInAnyOrder) {
  const int n = g_size;
  std::vector<std::unique_ptr<Device>> buffers;
  std::vector<WorkHandle> work;
  for (int k = 0; k < 4; ++k) {
    buffers.push_back(std::make_unique<Device>(std::vector<float>(1 << 16, static_cast<float>(k + 1))));
    work.push_back(group_->all_reduce(buffers.back()->get(), 1 << 16, ReduceOp::Sum));
  }
  while (!work.front()->test()) {
  }
  for (auto it = work.rbegin(); it != work.rend(); ++it) (*it)->wait();
  for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(buffers[static_cast<size_t>(k)]->host()[12345], static_cast<float>((k + 1) * n));
}

// wait() orders the caller's stream after the operation and returns at once: the default stream
// is held by a host function until after wait() has returned (so the host was not held), no
// error is left behind for the next launch, and what the stream reads afterwards is the result.
TEST_F(NcclTest, WaitOrdersTheStreamWithoutHoldingTheHost) {
  const int n = g_size;
  constexpr int64_t kCount = 1 << 20;
  const Tensor host = Tensor::empty({kCount}, DType::F32, MemCategory::Workspace);
  std::fill_n(host.f32(), kCount, 1.0f);
  Tensor t = host.to(loom::Device::CUDA, MemCategory::Workspace);
  comm::all_reduce(*group_, t, ReduceOp::Sum)->wait();  // NCCL connects its peers here
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  t.copy_from(host);
  std::atomic<bool> release{false};
  auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
  };
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, hold, &release), cudaSuccess);
  ops::scale_(t, 2.0f);  // behind the held host function
  comm::all_reduce(*group_, t, ReduceOp::Sum)->wait();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "wait() left an error for the next launch";
  const cudaError_t busy = cudaStreamQuery(nullptr);
  release = true;
  ASSERT_EQ(busy, cudaErrorNotReady) << "wait() returned only once the stream was done";
  (void)cudaGetLastError();
  const std::vector<float> got = t.to_f32_vector();
  for (int64_t i = 0; i < kCount; i += 4099) ASSERT_EQ(got[static_cast<size_t>(i)], 2.0f * n) << i;
}

TEST_F(NcclTest, SplitGivesGroupsOfTheSameColour) {
  const int n = g_size, r = g_rank;
  auto half = group_->split(r % 2, r, "parity");
  EXPECT_EQ(half->size(), (n + 1 - r % 2) / 2);
  Device one(std::vector<float>{1.0f});
  half->all_reduce(one.get(), 1, ReduceOp::Sum)->wait();
  EXPECT_FLOAT_EQ(one.host()[0], static_cast<float>(half->size()));
}

TEST_F(NcclTest, BadArgumentsAreRefusedBeforeAnythingIsEnqueued) {
  Device buffer(4);
  EXPECT_THROW(group_->all_reduce(buffer.get(), -1, ReduceOp::Sum), Error);
  EXPECT_THROW(group_->broadcast(buffer.get(), 4, g_size), Error);
  EXPECT_THROW(group_->send(buffer.get(), 4, g_size, 0), Error);
  EXPECT_THROW(group_->recv(buffer.get(), 4, 0, -1), Error);
}

}  // namespace
}  // namespace loom

constexpr int kNotRun = 77;

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &loom::g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &loom::g_size);
  if (cudaGetDeviceCount(&loom::g_devices) != cudaSuccess) loom::g_devices = 0;
  // The GPUs of the whole job, not just of this node: the smallest count any rank sees.
  MPI_Allreduce(MPI_IN_PLACE, &loom::g_devices, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (loom::g_devices < loom::g_size) {
    // ctest's SKIP_RETURN_CODE: reported as Skipped, never as Passed.
    if (loom::g_rank == 0)
      std::printf("loom NCCL tests: %d GPU(s) for %d rank(s): not run\n", loom::g_devices, loom::g_size);
    MPI_Finalize();
    return kNotRun;
  }
  const int failed_here = RUN_ALL_TESTS() == 0 ? 0 : 1;
  int failed = 0;
  MPI_Allreduce(&failed_here, &failed, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (loom::g_rank == 0)
    std::printf("loom NCCL tests on %d rank(s), %d GPU(s) each node: %s\n", loom::g_size, loom::g_devices,
                failed == 0 ? "PASSED" : "FAILED");
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
