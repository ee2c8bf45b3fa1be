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

PipelineChannels::PipelineChannels(ProcessGroup& pp, bool both_ways)
    : rank_(pp.rank()), size_(pp.size()), both_ways_(both_ways && pp.size() > 2) {
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
  for (int against = 0; against < (both_ways_ ? 2 : 1); ++against) {
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
                               (against ? "-back" : "") + "-edge" + std::to_string(color);
      auto group = pp.split(color, key, name);
      auto& slots = groups_[static_cast<size_t>(against)][static_cast<size_t>(kind)];
      if (ahead) slots[0] = std::move(group);
      if (behind) slots[1] = std::move(group);
    }
  }
  }
  // With p = 2 both edges join the same two ranks and are still two groups: rank 0 is edge 0's
  // lower end and edge 1's upper end.
  for (int against = 0; against < (both_ways_ ? 2 : 1); ++against)
    for (const auto& g : groups_[static_cast<size_t>(against)])
      for (const auto& edge : g)
        if (!edge || edge->size() != 2)
          throw_error("pipeline channels: rank ", rank_, " of ", p,
                      " did not get both of its two-rank channel groups");
}

ProcessGroup& PipelineChannels::group(PipeMessage kind, bool against, bool ahead) const {
  return *groups_[static_cast<size_t>(against)][static_cast<size_t>(kind)][ahead ? 0 : 1];
}

bool PipelineChannels::against_ring(PipeMessage kind, int peer, bool sending) const {
  const int next = (rank_ + 1) % size_, previous = (rank_ - 1 + size_) % size_;
  // With the ring, activations are sent to the next rank and received from the previous one,
  // gradients the other way round.
  const bool to_next = (kind == PipeMessage::Activation) == sending;
  const int with_ring = to_next ? next : previous, against = to_next ? previous : next;
  if (peer == with_ring) return false;
  if (both_ways_ && peer == against) return true;
  throw_error("pipeline channels: rank ", rank_, " ", sending ? "sends " : "receives ", kind_name(kind),
              sending ? "s to rank " : "s from rank ", with_ring, both_ways_ ? " or " + std::to_string(against) : "",
              " only, not ", sending ? "to" : "from", " rank ", peer);
}

// Edge e's group has rank e as its local rank 0 and e + 1 as local rank 1, so a message to the
// next rank leaves on this rank's own edge ("ahead") to local rank 1, and one to the previous
// rank on the edge behind to local rank 0. Against the ring the kinds swap directions.
WorkHandle PipelineChannels::send(PipeMessage kind, const Tensor& data, int to_rank) {
  const bool against = against_ring(kind, to_rank, true);
  const bool ahead = (kind == PipeMessage::Activation) != against;
  return comm::send(group(kind, against, ahead), data, ahead ? 1 : 0, kChannelTag);
}

WorkHandle PipelineChannels::recv(PipeMessage kind, const Tensor& data, int from_rank) {
  const bool against = against_ring(kind, from_rank, false);
  const bool ahead = (kind == PipeMessage::Activation) == against;
  return comm::recv(group(kind, against, ahead), data, ahead ? 1 : 0, kChannelTag);
}

}  // namespace loom
