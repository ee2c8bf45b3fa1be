// parallel/pipeline_channels over MPI: every ring of 2 or more ranks (odd sizes too, whose
// closing edge needs a third round of splits) carries activations to the next rank and
// gradients to the previous one, each kind matched in issue order, with the two kinds and the
// two directions kept apart even when both neighbours are the same rank (p = 2).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist_fixture.hpp"
#include "loom/parallel/pipeline_channels.hpp"
#include "tensor_parallel_fixture.hpp"

namespace loom::test {
namespace {

constexpr int kMessages = 3;

// [2] values identifying (sender, kind, index): exact in f32.
std::vector<float> payload(int sender, PipeMessage kind, int index) {
  const float base = 1000.0f * sender + (kind == PipeMessage::Gradient ? 100.0f : 0.0f) + 10.0f * index;
  return {base, base + 1};
}

void exchange_around(ProcessGroup& ring) {
  const int p = ring.size(), rank = ring.rank(), next = (rank + 1) % p, prev = (rank + p - 1) % p;
  PipelineChannels channels(ring);
  // Every send is posted before any receive: the sends must not need their receives first, and
  // each kind must arrive in the order it left.
  std::vector<Tensor> outgoing;
  std::vector<WorkHandle> sends;
  for (int i = 0; i < kMessages; ++i)
    for (PipeMessage kind : {PipeMessage::Activation, PipeMessage::Gradient}) {
      outgoing.push_back(tensor_of({2}, payload(rank, kind, i)));
      sends.push_back(channels.send(kind, outgoing.back(),
                                    kind == PipeMessage::Activation ? next : prev));
    }
  // Gradients first, the reverse of the sending order across kinds.
  for (PipeMessage kind : {PipeMessage::Gradient, PipeMessage::Activation}) {
    const int from = kind == PipeMessage::Activation ? prev : next;
    for (int i = 0; i < kMessages; ++i) {
      const Tensor in = Tensor::zeros({2}, DType::F32, MemCategory::Workspace);
      channels.recv(kind, in, from)->wait();
      EXPECT_EQ(in.to_f32_vector(), payload(from, kind, i))
          << (kind == PipeMessage::Activation ? "activation " : "gradient ") << i << " on rank " << rank
          << " of " << p;
    }
  }
  for (const WorkHandle& s : sends) s->wait();
}

TEST(PipelineChannels, CarryEachKindInOrderAroundEveryRingSize) {
  const auto group = world();
  const int n = group->size();
  if (n < 2) GTEST_SKIP() << "needs at least 2 ranks";
  exchange_around(*group);
  // A ring of n - 1 ranks too: odd when n is even (3 of 4, 7 of 8).
  const bool inside = group->rank() < n - 1;
  auto smaller = group->split(inside ? 0 : 1, group->rank(), "ring");
  if (inside && smaller->size() >= 2) exchange_around(*smaller);
}

TEST(PipelineChannels, RefuseATransferTheirChannelDoesNotCarry) {
  const auto group = world();
  const int n = group->size();
  if (n < 3) GTEST_SKIP() << "with 2 ranks the next rank is also the previous one";
  PipelineChannels channels(*group);
  const Tensor data = Tensor::zeros({2}, DType::F32, MemCategory::Workspace);
  const int prev = (group->rank() + n - 1) % n;
  const std::string me = "rank " + std::to_string(group->rank());
  expect_contains(error_message([&] { channels.send(PipeMessage::Activation, data, prev); }),
                  {me, "sends activations to rank " + std::to_string((group->rank() + 1) % n),
                   "not to rank " + std::to_string(prev)});
  expect_contains(error_message([&] { channels.recv(PipeMessage::Gradient, data, prev); }),
                  {me, "receives gradients from rank", "not from rank " + std::to_string(prev)});
}

}  // namespace
}  // namespace loom::test
