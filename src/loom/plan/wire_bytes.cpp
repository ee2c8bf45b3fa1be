#include "loom/plan/wire_bytes.hpp"

namespace loom::plan {

CpWireBytes context_parallel_wire_bytes(const ModelConfig& m, const PlanLayout& l, double tokens,
                                        double activation_bytes, bool repeated_kv) {
  CpWireBytes wire;
  if (l.cp <= 1) return wire;
  const double t = static_cast<double>(l.tp), hops = static_cast<double>(l.cp - 1);
  const double q = static_cast<double>(m.q_dim());
  const double kv = repeated_kv ? q : static_cast<double>(m.kv_dim());
  switch (l.cp_comm) {
    case CpComm::P2P:
    case CpComm::AllGather: {
      const double block = tokens * 2 * kv / t * activation_bytes;
      wire.forward = hops * block;
      wire.backward = 2 * hops * block;
      break;
    }
    case CpComm::AllToAll: {
      const double share = hops / static_cast<double>(l.cp);
      const double qkv = tokens * (q + 2 * kv) / t * activation_bytes,
                   out = tokens * q / t * activation_bytes;
      const double lse = tokens * static_cast<double>(m.n_head) / t * 4,
                   ranges = hops * tokens * 2 * 4;
      wire.forward = share * (qkv + out + lse) + ranges;
      wire.backward = share * (2 * qkv + 2 * out + lse) + ranges;
      break;
    }
  }
  return wire;
}

EpWireBytes expert_parallel_wire_bytes(const ModelConfig& m, const PlanLayout& l, double tokens,
                                       double activation_bytes, double home_fraction) {
  EpWireBytes wire;
  if (l.ep <= 1 || !m.is_moe()) return wire;
  const double ep = static_cast<double>(l.ep);
  const double away = 1.0 - (home_fraction < 0 ? 1.0 / ep : home_fraction);
  const double rows = tokens * static_cast<double>(m.experts_per_token) * away;
  const double row_bytes =
      static_cast<double>(m.n_embd) / static_cast<double>(l.tp) * activation_bytes;
  const double counts = (ep - 1) * static_cast<double>(m.n_experts) / ep * 4;
  wire.forward = counts + 2 * rows * row_bytes;
  wire.backward = 2 * rows * row_bytes;
  return wire;
}

}  // namespace loom::plan
