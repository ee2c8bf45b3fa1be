#pragma once
// Attention over a sequence split across the ranks of a cp group (model/context_parallel's
// load-balanced chunks), three ways:
//   p2p (ring attention; the default): the key/value block of each rank travels once around the
//     ring, sent asynchronously while the block in hand is computed; partial outputs merge
//     exactly through their log-sum-exps. Each block asks only for the causal part it holds
//     (key ranges mapped to the block's rows), so a rank's earlier neighbours cost it half a
//     block and its later ones the other half. Backward sends the blocks round again with their
//     key/value gradients, which arrive at their owner after C - 1 hops. Wire per layer and
//     rank: (C - 1) blocks forward, 2 (C - 1) backward. GQA sends the kv heads only.
//   allgather (Llama 3): all-gather the key/value blocks once per layer, attend over the whole
//     sequence; backward gathers again and reduce-scatters the key/value gradients.
//   a2a (Ulysses): an all-to-all gives rank j head group j (H/C heads, KV/C kv heads) over the
//     whole sequence; attention runs as on one process; an all-to-all brings the output back
//     (and, in backward, the operands go round again). Needs heads and kv heads divisible by C;
//     its buffers are f32 too.
// Blocks are this rank's [batch * T/C, 2 KV D] k | v columns of the fused qkv, in f32 whatever
// the activations' dtype: with bf16 activations (CUDA) the blocks travel, the ring's partial
// results merge and the key/value gradients add up in f32, and only the final output and
// gradient are rounded to bf16. Ring transfers are send/recv exchanges with both neighbours
// (ProcessGroup::send_recv), one NCCL group each.
#include <memory>
#include <string>

#include "loom/dist/process_group.hpp"
#include "loom/model/context_parallel.hpp"
#include "loom/parallel/parallel_layout.hpp"  // CpComm

namespace loom {

// Over `group` (its ranks in cp order).
std::shared_ptr<ContextAttention> make_context_attention(std::shared_ptr<ProcessGroup> group, CpComm comm);

}  // namespace loom
