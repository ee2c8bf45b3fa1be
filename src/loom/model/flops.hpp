#pragma once
// Model FLOPs per trained token, the numerator of MFU. Every matrix-multiply parameter costs
// 6 FLOPs per token (2 forward, 4 backward; Kaplan et al. 2020, Narayanan et al. 2021 eq. 3):
// that includes the output projection, also when it is tied to the token embedding, but not
// the position-embedding lookup. Causal attention adds QK^T and PV over on average seq/2 keys:
// 2 matmuls x 2 FLOPs x seq/2 x C forward, x3 with backward = 6 * seq * C per layer, where C is
// the attention's width, n_head x head_dim (n_embd unless model.head_dim says otherwise). A
// sliding-window layer's queries meet fewer keys (ModelConfig::mean_keys_per_query).
// For a mixture of experts only the experts a token is routed to count (its router is counted).
// Recomputation is not counted (MFU, not HFU: Chowdhery et al. 2022, appendix B). A hybrid
// Mamba stack's scans count as attention does (ModelConfig::mamba_scan_flops_per_token).
#include "loom/model/config.hpp"

namespace loom {

inline double flops_per_token(const ModelConfig& c, int64_t seq_len) {
  double matmul_params = static_cast<double>(c.parameter_count());
  if (c.arch == Architecture::GPT2) matmul_params -= static_cast<double>(c.max_seq_len * c.n_embd);
  if (!c.tied_embeddings) matmul_params -= static_cast<double>(c.vocab_size * c.n_embd);  // lookup only
  // Mixture of experts: a token meets only experts_per_token of the experts (active parameters).
  if (c.is_moe())
    matmul_params -=
        static_cast<double>(c.moe_layer_count() * (c.n_experts - c.experts_per_token) * c.expert_parameter_count());
  // 2 matmuls x 2 FLOPs x 3 (forward and backward) per key a query meets, per attention column.
  // A hybrid's attention layers alone meet keys; its Mamba layers add their scans, forward and
  // backward (3x).
  double keys = 0;
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (c.has_attention(l)) keys += c.mean_keys_per_query(l, seq_len);
  const double attention = 12.0 * keys * static_cast<double>(c.q_dim());
  const double scans =
      3.0 * static_cast<double>(c.hybrid_layer_count('M')) * c.mamba_scan_flops_per_token();
  return 6.0 * matmul_params + attention + scans;
}

}  // namespace loom
