#include "loom/parallel/pipeline_channels.hpp"

#include <string>

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"

namespace loom {
namespace {

// Every channel carries one kind in one direction, so its transfers share one tag: MPI then
// matches them in issue order, as NCCL does.
constexpr int kChannelTag = 0;

const char* kind_name(PipeMessage kind) {
  return kind == PipeMessage::Activation ? "activation" : "gradient";
}

}  // namespace

PipelineChannels::PipelineChannels(ProcessGroup& pp) : rank_(pp.rank()), size_(pp.size()) {
  const int p = size_;
  if (p < 2)
    throw_error("pipeline channels over group '", pp.name(), "': ", p,
                " rank(s), expected at least 2 pipeline ranks");
  // Edge e joins e and e + 1 (mod p). A split makes disjoint groups, so the edges are made in
  // rounds no rank appears twice in: even edges, odd edges, and with odd p the closing edge
  // (p - 1, 0), which would otherwise meet edge 0 at rank 0. Ranks outside a round's edges
  // form a group of their own, which is dropped.
  const int behind_edge = (rank_ - 1 + p) % p;
  auto round_of = [p](int edge) { return (p % 2 == 1 && edge == p - 1) ? 2 : edge % 2; };
  const int rounds = p % 2 == 1 ? 3 : 2;
  for (int kind = 0; kind < 2; ++kind) {
    for (int round = 0; round < rounds; ++round) {
      int color = p + rank_;  // alone
      int key = 0;
      bool ahead = false, behind = false;
      if (round_of(rank_) == round) {
        color = rank_;  // this rank is edge rank_'s lower end
        ahead = true;
      } else if (round_of(behind_edge) == round) {
        color = behind_edge;  // and edge rank_ - 1's upper end
        key = 1;
        behind = true;
      }
      const std::string name = std::string("pp-") + kind_name(static_cast<PipeMessage>(kind)) +
                               "-edge" + std::to_string(color);
      auto group = pp.split(color, key, name);
      if (ahead) groups_[static_cast<size_t>(kind)][0] = std::move(group);
      if (behind) groups_[static_cast<size_t>(kind)][1] = std::move(group);
    }
  }
  // With p = 2 both edges join the same two ranks and are still two groups: rank 0 is edge 0's
  // lower end and edge 1's upper end.
  for (const auto& per_kind : groups_)
    for (const auto& g : per_kind)
      if (!g || g->size() != 2)
        throw_error("pipeline channels: rank ", rank_, " of ", p,
                    " did not get both of its two-rank channel groups");
}

ProcessGroup& PipelineChannels::group(PipeMessage kind, bool ahead) const {
  return *groups_[static_cast<size_t>(kind)][ahead ? 0 : 1];
}

WorkHandle PipelineChannels::send(PipeMessage kind, const Tensor& data, int to_rank) {
  const bool activation = kind == PipeMessage::Activation;
  const int expected = activation ? (rank_ + 1) % size_ : (rank_ - 1 + size_) % size_;
  if (to_rank != expected)
    throw_error("pipeline channels: rank ", rank_, " sends ", kind_name(kind), "s to rank ",
                expected, " only, not to rank ", to_rank);
  // An activation leaves on this rank's own edge (we are its rank 0), a gradient on the edge
  // behind (we are its rank 1).
  ProcessGroup& g = group(kind, activation);
  return comm::send(g, data, activation ? 1 : 0, kChannelTag);
}

WorkHandle PipelineChannels::recv(PipeMessage kind, const Tensor& data, int from_rank) {
  const bool activation = kind == PipeMessage::Activation;
  const int expected = activation ? (rank_ - 1 + size_) % size_ : (rank_ + 1) % size_;
  if (from_rank != expected)
    throw_error("pipeline channels: rank ", rank_, " receives ", kind_name(kind), "s from rank ",
                expected, " only, not from rank ", from_rank);
  ProcessGroup& g = group(kind, !activation);
  return comm::recv(g, data, activation ? 0 : 1, kChannelTag);
}

}  // namespace loom
