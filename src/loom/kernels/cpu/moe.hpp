#pragma once
// Mixture-of-experts routing on the host: the router's scores, top-k selection and weights,
// their backward, and the load-balancing and z losses (f32, deterministic: every reduction
// runs in row order).
//
// Two routers:
//   softmax (Mixtral, Jiang et al. 2024; HF MixtralSparseMoeBlock): probs = softmax(logits)
//     over the experts, the k largest are selected, weights = selected probs / their sum.
//   sigmoid (DeepSeek-V3, sec. 2.1.2): scores = sigmoid(logits); the k largest of
//     scores + bias are selected (the bias steers selection only, for auxiliary-loss-free
//     balancing), weights = selected scores / their sum.
// Ties go to the lower expert index, so routing is a pure function of the logits.
//
// Load balancing (Switch Transformer, Fedus et al. 2022, eq. 4; HF's load_balancing_loss_func
// for top-k): aux = E * sum_i f_i P_i with f_i = (tokens routed to expert i, over all k slots)
// / T and P_i = mean over tokens of the affinity a_ti (softmax: the probabilities; sigmoid: the
// scores normalised over the experts, as DeepSeek-V3's sequence-wise loss). f is a constant
// (it has no gradient). Balanced routing gives aux = k.
// Router z-loss (ST-MoE, Zoph et al. 2022, eq. 5): z = mean over tokens of logsumexp(logits)^2.
#include <cstdint>

namespace loom::cpu {

struct MoeRouteArgs {
  int64_t rows = 0, experts = 0, top_k = 0;
  bool sigmoid = false;
};

// logits [rows, E] -> probs [rows, E] (softmax probabilities or sigmoid scores), selected
// [rows, k] expert ids (descending by probs, + bias for sigmoid; bias [E] may be null),
// weights [rows, k]. Also counts [E] (tokens per expert over all slots, overwritten).
void moe_route(const MoeRouteArgs& a, const float* logits, const float* bias, float* probs, int32_t* selected,
               float* weights, int64_t* counts);

// aux = E * sum_i f_i P_i and z = mean_t logsumexp_t^2 (see above), in double.
struct MoeRouterLosses {
  double aux = 0, z = 0;
};
MoeRouterLosses moe_router_losses(const MoeRouteArgs& a, const float* logits, const float* probs,
                                  const int64_t* counts);

// d_logits (overwritten) of  sum(d_weights . weights) + aux_scale * aux + z_scale * z.
void moe_route_backward(const MoeRouteArgs& a, float* d_logits, const float* d_weights, const float* logits,
                        const float* probs, const int32_t* selected, const float* weights, const int64_t* counts,
                        float aux_scale, float z_scale);

// The routed copies of the tokens (MoeLayer's grouped layout). position [rows k]: the row of
// slot s = t k + q in the routed buffers, or -1 for a slot dropped by the capacity.
//   gather:           routed[position[s]] = x[t]                      (routed [kept, C])
//   gather_backward:  d_x[t] += d_routed[position[t k + q]], q in order
//   combine:          out[t] = sum over kept q, in order, of weights[t k + q] expert_out[p]
//                     (written; 0 for a token whose slots were all dropped)
//   combine_backward: d_expert_out[p] = weights[s] d_out[t]; d_weights[s] = d_out[t] .
//   expert_out[p]
//                     (summed in double; 0 for a dropped slot), both written
void moe_gather(float* routed, const float* x, const int32_t* position, int64_t rows, int64_t k,
                int64_t c);
void moe_gather_backward(float* d_x, const float* d_routed, const int32_t* position, int64_t rows,
                         int64_t k, int64_t c);
void moe_combine(float* out, const float* expert_out, const float* weights, const int32_t* position,
                 int64_t rows, int64_t k, int64_t c);
void moe_combine_backward(float* d_expert_out, float* d_weights, const float* d_out,
                          const float* expert_out, const float* weights, const int32_t* position,
                          int64_t rows, int64_t k, int64_t c);

}  // namespace loom::cpu
