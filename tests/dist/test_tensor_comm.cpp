// dist/tensor_comm on the MPI backend: host f32 tensors go straight to the group; bf16 tensors
// (and, on a GPU build, device tensors) are staged through host f32 copies and written back
// when the operation completes. Expected values are small integers, exact in bf16.
#include <gtest/gtest.h>

#include "dist_fixture.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "tensor_parallel_fixture.hpp"

namespace loom::test {
namespace {

// [n] values base + i, in `dtype` on the host.
Tensor ramp(int64_t n, float base, DType dtype) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  Tensor t = Tensor::empty({n}, dtype, MemCategory::Workspace);
  t.copy_from(tensor_of({n}, v));
  return t;
}

TEST(TensorComm, StagesBf16TensorsAndWritesTheResultBackOnWait) {
  const auto group = world();
  const int n = group->size(), rank = group->rank();
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    EXPECT_EQ(comm::takes_directly(*group, ramp(1, 0, dtype)), dtype == DType::F32);
    // all_reduce: sum over ranks of (rank + 1 + i) = n(n+1)/2 + n i.
    const Tensor data = ramp(6, static_cast<float>(rank + 1), dtype);
    comm::all_reduce(*group, data, ReduceOp::Sum)->wait();
    const std::vector<float> sum = data.to_f32_vector();
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(sum[i], n * (n + 1) / 2.0f + n * i) << i;

    // all_gather: block r is rank r's [10 r, 10 r + 1, 10 r + 2].
    const Tensor mine = ramp(3, 10.0f * rank, dtype);
    const Tensor all = Tensor::empty({3 * n}, dtype, MemCategory::Workspace);
    WorkHandle gather = comm::all_gather(*group, mine, all);
    gather->wait();
    const std::vector<float> gathered = all.to_f32_vector();
    for (int r = 0; r < n; ++r)
      for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(gathered[r * 3 + i], 10.0f * r + i);

    // reduce_scatter of every rank's [0, 1, ..., 2n-1]: rank r keeps n * [2r, 2r + 1].
    const Tensor blocks = ramp(2 * n, 0.0f, dtype);
    const Tensor out = Tensor::empty({2}, dtype, MemCategory::Workspace);
    comm::reduce_scatter(*group, blocks, out, ReduceOp::Sum)->wait();
    const float first = static_cast<float>(2 * rank * n),
                second = static_cast<float>((2 * rank + 1) * n);
    EXPECT_EQ(out.to_f32_vector(), (std::vector<float>{first, second}));

    // all_to_all: rank r sends value 10 r + j to rank j, so rank r gets 10 i + r from rank i;
    // all_to_allv with i + 1 values from rank i (the same value repeated).
    {
      std::vector<float> mine(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) mine[j] = 10.0f * rank + j;
      const Tensor in = Tensor::empty({n}, dtype, MemCategory::Workspace);
      in.copy_from(tensor_of({n}, mine));
      const Tensor got = Tensor::zeros({n}, dtype, MemCategory::Workspace);
      comm::all_to_all(*group, in, got)->wait();
      const std::vector<float> a2a = got.to_f32_vector();
      for (int i = 0; i < n; ++i) EXPECT_EQ(a2a[i], 10.0f * i + rank) << "from rank " << i;
      std::vector<int64_t> send_counts(static_cast<size_t>(n), rank + 1),
          recv_counts(static_cast<size_t>(n));
      std::vector<float> send_values;
      for (int j = 0; j < n; ++j) send_values.insert(send_values.end(), rank + 1, 10.0f * rank + j);
      for (int i = 0; i < n; ++i) recv_counts[i] = i + 1;
      const int64_t total_in = (rank + 1) * n, total_out = n * (n + 1) / 2;
      const Tensor vin = Tensor::empty({total_in}, dtype, MemCategory::Workspace);
      vin.copy_from(tensor_of({total_in}, send_values));
      const Tensor vout =
          Tensor::zeros({total_out + 1}, dtype, MemCategory::Workspace);  // one spare
      comm::all_to_allv(*group, vin, send_counts, vout, recv_counts)->wait();
      const std::vector<float> v = vout.to_f32_vector();
      int64_t at = 0;
      for (int i = 0; i < n; ++i)
        for (int c = 0; c <= i; ++c) EXPECT_EQ(v[at++], 10.0f * i + rank) << "from rank " << i;
      EXPECT_EQ(v[total_out], 0.0f);  // beyond the counts: untouched
    }

    // broadcast from the last rank.
    const Tensor b = ramp(4, rank == n - 1 ? 100.0f : -1.0f, dtype);
    comm::broadcast(*group, b, n - 1)->wait();
    EXPECT_EQ(b.to_f32_vector(), (std::vector<float>{100, 101, 102, 103}));

    // A ring of send / recv.
    if (n > 1) {
      const Tensor to_send = ramp(2, 7.0f * rank, dtype);
      const Tensor received = Tensor::zeros({2}, dtype, MemCategory::Workspace);
      WorkHandle recv = comm::recv(*group, received, (rank + n - 1) % n, 5);
      WorkHandle send = comm::send(*group, to_send, (rank + 1) % n, 5);
      send->wait();
      recv->wait();
      const float from = 7.0f * static_cast<float>((rank + n - 1) % n);
      EXPECT_EQ(received.to_f32_vector(), (std::vector<float>{from, from + 1}));

      // The same ring as exchanges (a ring-attention step): to the successor and from the
      // predecessor in one operation, which counts one send and one receive.
      const CommStats before = group->stats();
      const Tensor exchanged = Tensor::zeros({2}, dtype, MemCategory::Workspace);
      comm::send_recv(*group, to_send, (rank + 1) % n, exchanged, (rank + n - 1) % n, 6)->wait();
      EXPECT_EQ(exchanged.to_f32_vector(), (std::vector<float>{from, from + 1}));
      EXPECT_EQ(to_send.to_f32_vector(),
                (std::vector<float>{7.0f * rank, 7.0f * rank + 1}));  // untouched
      const CommStats after = group->stats();
      EXPECT_EQ(after.calls[size_t(CommOp::Send)] - before.calls[size_t(CommOp::Send)], 1);
      EXPECT_EQ(after.calls[size_t(CommOp::Recv)] - before.calls[size_t(CommOp::Recv)], 1);
    }
  }
}

TEST(TensorComm, MismatchedBlocksAreRefusedNamingTheCallAndShapes) {
  const auto group = world();
  const int n = group->size();
  const Tensor in = Tensor::zeros({3}, DType::F32, MemCategory::Workspace);
  const Tensor wrong = Tensor::zeros({3 * n + 1}, DType::F32, MemCategory::Workspace);
  expect_contains(error_message([&] { (void)comm::all_gather(*group, in, wrong); }),
                  {"comm::all_gather", "dp", "[" + std::to_string(3 * n + 1) + "]", "[3]"});
  expect_contains(
      error_message([&] { (void)comm::reduce_scatter(*group, wrong, in, ReduceOp::Sum); }),
      {"comm::reduce_scatter", std::to_string(n) + " blocks of [3]"});
  expect_contains(error_message([&] { (void)comm::all_reduce(*group, Tensor{}, ReduceOp::Sum); }),
                  {"comm::all_reduce", "undefined"});
}

}  // namespace
}  // namespace loom::test
