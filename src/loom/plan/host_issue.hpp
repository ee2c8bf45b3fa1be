#pragma once
// Mixture-of-experts layers whose step the host paces: Megatron-Core's dropless token dispatch
// waits on the device once per MoE layer forward for the tokens each expert receives (the
// all-to-all's split sizes and the grouped GEMM's row counts live on the device): the alltoall
// dispatcher's `_maybe_update_cuda_sync_point("before_ep_alltoall")` (token_dispatcher.py,
// core_v0.16.0), DeepEP's "the CPU will wait for GPU's signal to arrive, so this is not
// compatible with CUDA graph" and HybridEP's "obtains the size from a GPU tensor, which causes a
// D2H synchronization" (fused_a2a.py), and "moe cuda graph is only supported with drop-padding
// MoE" (transformer_config.py). After each wait the device's queue is empty and every operation
// of the rest of the layer waits for the host to issue it (PyTorch and Transformer Engine's
// Python, per op), so a pass over a layer takes no less than the host's time to issue its
// operations. Drop-and-pad routing (a capacity factor, the "tokendrop" rows) has static shapes,
// no wait and whole-layer CUDA graphs; Megatron-Bridge's full-iteration graphs (from 26.06 for
// Qwen3 and DeepSeek-V3 on some Blackwell parts: commits 55443cbfb, #4211, and e80116b22, #4606)
// bound the permuted tokens (moe_expert_rank_capacity_factor) and remove the wait.
// docs/PLANNER.md, "Host-issued MoE layers", has the counts, the constant and what it moved.
#include <string>

#include "loom/model/config.hpp"
#include "loom/plan/layout.hpp"
#include "loom/plan/time_model.hpp"

namespace loom::plan {

// Host seconds per operation issued on a DGX's x86 host: fitted (docs/PLANNER.md names the rows).
constexpr double kMoeHostSecondsPerOp = 20e-6;
// On a Grace-Blackwell system (GB200, GB300) the host is an Arm Grace CPU: Transformer Engine
// issue #2053 (2025-08) measured a torch Linear forward's CPU time at 37 us on GB200 and 33 us on
// GH200 against 13.5 us on a DGX H100's Xeon 8480C. Only part of an operation's issue time is
// that Python and dispatch work; the factor is fitted (docs/PLANNER.md: the held-out GB200 and
// GB300 Qwen3 rows of Megatron-Bridge's tables).
constexpr double kGraceHostFactor = 1.3;

// Operations the host issues for one layer's forward on one rank: a dense layer's attention
// half (norm, the q|k|v and output GEMMs with Transformer Engine's casts and amax updates, RoPE,
// attention, the residual add) 40; the MoE half's fixed part (router GEMM, softmax and top-k,
// auxiliary-loss terms, the token counts and their copy, permute and unpermute, the two
// all-to-alls and their bookkeeping, the shared expert where there is one) 45, and 4 per local
// expert (each expert's two GEMMs, its activation, its quantisation). A dense layer's MLP adds
// 10. The mean layer weighs MoE and dense layers by their counts.
double moe_host_forward_ops(const ModelConfig& model, const PlanLayout& layout);
// Backward's operations over the forward's: 2, and under full recomputation the forward's again
// on the share of layers recomputed (job.memory.full_recompute_share), which waits on the token
// counts once more.
double moe_host_backward_over_forward(const PlanLayout& layout, const TrainingJob& job);

// For a published run: the host seconds per op its stack spends where the host paces its MoE
// layers (a Megatron-Core stack, a dropless MoE model), else 0, and the assumption to print.
// `text`: the record's id, notes and model name, lowercase; `source`: its source text; `gpu`: the
// GPU preset's name.
struct HostIssue {
  double seconds_per_op = 0;
  std::string assumption;
};
HostIssue published_moe_host_issue(bool megatron_stack, const ModelConfig& model,
                                   const std::string& text, const std::string& source,
                                   const std::string& gpu);
// The same for a run read from a file, into run.moe_host_s_per_op and its assumptions.
struct PublishedRun;
void apply_moe_host_issue(PublishedRun& run, const std::string& text);

}  // namespace loom::plan
