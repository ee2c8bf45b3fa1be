#pragma once
// What context and expert parallelism send per layer and micro-batch, as loom's engine sends it
// (its CommStats count the same bytes): the byte counts the time model prices.
#include "loom/model/config.hpp"
#include "loom/plan/layout.hpp"

namespace loom::plan {

// Bytes one rank of the cp group sends per layer and micro-batch, forward and backward, for
// `tokens` local tokens (micro-batch x seq / cp) of `activation_bytes`-byte elements, as the
// engine's context attention sends them (parallel/context_parallel, counted in CommStats). A
// k|v block is tokens x 2 kv_dim / tp elements.
//   p2p: C-1 blocks forward (ring); the blocks again and their gradients backward, 2 (C-1).
//   allgather: a ring all-gather of the blocks forward (C-1 sent); backward gathers again and
//     reduce-scatters the gradients, 2 (C-1).
//   a2a: (C-1)/C of this rank's q|k|v, output and fp32 log-sum-exps forward, plus the gathered
//     key ranges (2 int32 per token, C-1 sent); backward (C-1)/C of q|k|v, output, its gradient
//     and the log-sum-exps out and the q|k|v gradient back (the engine keeps no head-sharded
//     copies), plus the ranges again.
// `repeated_kv`: the k|v travel repeated to the query heads, q_dim wide (torchtitan, where
// SDPA receives them so: GpuJob::cp_gathers_repeated_kv).
struct CpWireBytes {
  double forward = 0, backward = 0;
};
CpWireBytes context_parallel_wire_bytes(const ModelConfig& model, const PlanLayout& layout,
                                        double tokens, double activation_bytes,
                                        bool repeated_kv = false);

// Bytes one rank of the ep group sends per MoE layer and micro-batch under expert parallelism,
// as the engine's exchange sends them (model/moe, parallel/expert_parallel; CommStats'
// all_to_all): forward, the per-expert row counts (E/ep f32 to each other rank), the dispatch
// of the routed rows bound for other ranks' experts and the combine of as many coming back;
// backward, the same two for the gradients. `tokens` is this rank's (micro-batch x seq / cp),
// each with k routed rows of hidden / tp elements; `home_fraction` of the routed rows go to this
// rank's own experts and never leave (1/ep with balanced routing, the default; a rank receives
// as many as it sends on average, which is what this figures).
struct EpWireBytes {
  double forward = 0, backward = 0;
};
EpWireBytes expert_parallel_wire_bytes(const ModelConfig& model, const PlanLayout& layout,
                                       double tokens, double activation_bytes,
                                       double home_fraction = -1);

}  // namespace loom::plan
