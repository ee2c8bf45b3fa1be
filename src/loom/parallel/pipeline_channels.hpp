#pragma once
// The pipeline's point-to-point channels: one per message kind and neighbouring pair, each a
// two-rank group that carries its kind one way only (activations from rank r to r + 1, gradients
// from r + 1 to r, ranks mod p). A channel matches sends to receives in the order they are
// issued, which is all NCCL offers (no tags), and MPI is held to the same: one tag per channel,
// and under the V placement (ZB-V) a second set against the ring's direction (activations from
// r + 1 to r, gradients from r to r + 1), since chunk 1's stages run back up the ranks;
// and MPI never lets a message overtake an earlier one with the same source, tag and
// communicator. So the order the CPU suite checks is the order the GPUs rely on.
//
// Why one group per direction: NCCL runs a group's transfers one after another on its stream
// and a send holds the stream until its receive is posted. Two neighbours that each send before
// receiving on one shared stream wait on each other for good (1F1B's steady state does exactly
// that). On separate one-way channels a send never stands in front of a receive, the way MPI's
// asynchronous sends behave, and pipeline_transfer_problem (parallel/pipeline_schedule) proves
// that every schedule's lists complete under those rules and agree on every channel's order.
// PyTorch's NCCL backend likewise gives point-to-point traffic communicators of its own.
#include <array>
#include <memory>

#include "loom/core/tensor.hpp"
#include "loom/dist/process_group.hpp"
#include "loom/parallel/pipeline_schedule.hpp"

namespace loom {

class PipelineChannels {
 public:
  // Collective over `pp` (at least 2 ranks): splits it into the two-rank channel groups, each of
  // `pp`'s backend. `both_ways`: also the channels against the ring (the V placement); with
  // p = 2 the ring's two edges already join the two ranks both ways, so none are added.
  explicit PipelineChannels(ProcessGroup& pp, bool both_ways = false);

  // `data`: f32 in the pp group's memory (the executor's message buffers), rows x n_embd.
  // Activations go to (rank + 1) % p, gradients to (rank - 1 + p) % p, and with both_ways also
  // the other neighbour; `to_rank` is checked against those.
  WorkHandle send(PipeMessage kind, const Tensor& data, int to_rank);
  // Activations from (rank - 1 + p) % p, gradients from (rank + 1) % p; with both_ways also the
  // other neighbour.
  WorkHandle recv(PipeMessage kind, const Tensor& data, int from_rank);

 private:
  // The group of edge e, which joins ranks e (its local rank 0) and (e + 1) % p (local rank 1).
  // Per kind and direction this rank holds its own edge ("ahead", to the next rank) and the one
  // behind it.
  ProcessGroup& group(PipeMessage kind, bool against, bool ahead) const;
  // Whether a message of `kind` with `peer` runs against the ring; throws when `peer` is no
  // neighbour this rank has a channel to.
  bool against_ring(PipeMessage kind, int peer, bool sending) const;

  int rank_ = 0, size_ = 1;
  bool both_ways_ = false;
  // [against][kind][0 = ahead (edge rank), 1 = behind (edge rank - 1)]
  std::array<std::array<std::array<std::shared_ptr<ProcessGroup>, 2>, 2>, 2> groups_;
};

}  // namespace loom
