#include "loom/kernels/cpu/moe.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace loom::cpu {

namespace {

double logsumexp(const float* z, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(z[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(z[i]) - m);
  return m + std::log(s);
}

// The affinity a_ti the balancing loss averages: softmax probabilities as they are, sigmoid
// scores normalised over the experts.
double affinity_norm(const MoeRouteArgs& a, const float* p) {
  if (!a.sigmoid) return 1.0;
  double s = 0;
  for (int64_t e = 0; e < a.experts; ++e) s += p[e];
  return s;
}

}  // namespace

void moe_route(const MoeRouteArgs& a, const float* logits, const float* bias, float* probs, int32_t* selected,
               float* weights, int64_t* counts) {
  const int64_t n = a.experts, k = a.top_k;
  std::fill(counts, counts + n, int64_t{0});
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* z = logits + r * n;
    float* p = probs + r * n;
    if (a.sigmoid) {
      for (int64_t e = 0; e < n; ++e) p[e] = 1.0f / (1.0f + std::exp(-z[e]));
    } else {
      const double lse = logsumexp(z, n);
      for (int64_t e = 0; e < n; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(z[e]) - lse));
    }
    // Top-k by selection score, ties to the lower index: k passes of an argmax.
    int32_t* sel = selected + r * k;
    for (int64_t s = 0; s < k; ++s) {
      int32_t best = -1;
      float best_score = 0;
      for (int64_t e = 0; e < n; ++e) {
        bool taken = false;
        for (int64_t q = 0; q < s; ++q) taken = taken || sel[q] == e;
        if (taken) continue;
        const float score = p[e] + (a.sigmoid && bias ? bias[e] : 0.0f);
        if (best < 0 || score > best_score) best = static_cast<int32_t>(e), best_score = score;
      }
      sel[s] = best;
    }
    float sum = 0;
    for (int64_t s = 0; s < k; ++s) sum += p[sel[s]];
    for (int64_t s = 0; s < k; ++s) weights[r * k + s] = p[sel[s]] / sum;
  }
  for (int64_t i = 0; i < a.rows * k; ++i) ++counts[selected[i]];
}

MoeRouterLosses moe_router_losses(const MoeRouteArgs& a, const float* logits, const float* probs,
                                  const int64_t* counts) {
  const int64_t n = a.experts;
  const double rows = static_cast<double>(a.rows);
  std::vector<double> mean_affinity(static_cast<size_t>(n), 0.0);
  MoeRouterLosses out;
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* p = probs + r * n;
    const double norm = affinity_norm(a, p);
    for (int64_t e = 0; e < n; ++e) mean_affinity[static_cast<size_t>(e)] += p[e] / norm / rows;
    const double lse = logsumexp(logits + r * n, n);
    out.z += lse * lse / rows;
  }
  for (int64_t e = 0; e < n; ++e)
    out.aux += static_cast<double>(n) * (static_cast<double>(counts[e]) / rows) * mean_affinity[static_cast<size_t>(e)];
  return out;
}

void moe_route_backward(const MoeRouteArgs& a, float* d_logits, const float* d_weights, const float* logits,
                        const float* probs, const int32_t* selected, const float* weights, const int64_t* counts,
                        float aux_scale, float z_scale) {
  const int64_t n = a.experts, k = a.top_k;
  const double rows = static_cast<double>(a.rows);
  // d aux / d a_ti = E f_i / T, the same for every token.
  std::vector<double> aux_grad(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e)
    aux_grad[static_cast<size_t>(e)] =
        aux_scale * static_cast<double>(n) * (static_cast<double>(counts[e]) / rows) / rows;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* p = probs + r * n;
    const int32_t* sel = selected + r * k;
    const float* w = weights + r * k;
    const float* gw = d_weights + r * k;
    std::vector<double> dp(static_cast<size_t>(n), 0.0);  // d loss / d probs (or scores)
    // weights_s = p_sel(s) / S: d p_i = (gw_i - sum_s gw_s w_s) / S for the selected i.
    double sel_sum = 0, gw_dot_w = 0;
    for (int64_t s = 0; s < k; ++s) sel_sum += p[sel[s]], gw_dot_w += static_cast<double>(gw[s]) * w[s];
    for (int64_t s = 0; s < k; ++s) dp[static_cast<size_t>(sel[s])] += (gw[s] - gw_dot_w) / sel_sum;
    // The balancing loss, through the affinity: softmax a = p; sigmoid a = s / sum(s).
    if (aux_scale != 0.0f) {
      if (a.sigmoid) {
        const double norm = affinity_norm(a, p);
        double g_dot_a = 0;
        for (int64_t e = 0; e < n; ++e) g_dot_a += aux_grad[static_cast<size_t>(e)] * p[e] / norm;
        for (int64_t e = 0; e < n; ++e) dp[static_cast<size_t>(e)] += (aux_grad[static_cast<size_t>(e)] - g_dot_a) / norm;
      } else {
        for (int64_t e = 0; e < n; ++e) dp[static_cast<size_t>(e)] += aux_grad[static_cast<size_t>(e)];
      }
    }
    float* dz = d_logits + r * n;
    if (a.sigmoid) {
      for (int64_t e = 0; e < n; ++e) dz[e] = static_cast<float>(dp[static_cast<size_t>(e)] * p[e] * (1.0 - p[e]));
    } else {
      double p_dot_dp = 0;
      for (int64_t e = 0; e < n; ++e) p_dot_dp += p[e] * dp[static_cast<size_t>(e)];
      for (int64_t e = 0; e < n; ++e) dz[e] = static_cast<float>(p[e] * (dp[static_cast<size_t>(e)] - p_dot_dp));
    }
    // z = mean lse^2: d z / d logit_e = 2 lse softmax_e / T.
    if (z_scale != 0.0f) {
      const float* z = logits + r * n;
      const double lse = logsumexp(z, n);
      for (int64_t e = 0; e < n; ++e)
        dz[e] += static_cast<float>(z_scale * 2.0 * lse * std::exp(static_cast<double>(z[e]) - lse) / rows);
    }
  }
}

void moe_gather(float* routed, const float* x, const int32_t* position, int64_t rows, int64_t k,
                int64_t c) {
  for (int64_t slot = 0; slot < rows * k; ++slot)
    if (const int32_t p = position[slot]; p >= 0)
      std::copy(x + (slot / k) * c, x + (slot / k + 1) * c, routed + p * c);
}

void moe_gather_backward(float* d_x, const float* d_routed, const int32_t* position, int64_t rows,
                         int64_t k, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t q = 0; q < k; ++q) {
      const int32_t p = position[t * k + q];
      if (p < 0) continue;
      for (int64_t j = 0; j < c; ++j) d_x[t * c + j] += d_routed[int64_t{p} * c + j];
    }
}

void moe_combine(float* out, const float* expert_out, const float* weights, const int32_t* position,
                 int64_t rows, int64_t k, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    float* row = out + t * c;
    std::fill(row, row + c, 0.0f);
    for (int64_t q = 0; q < k; ++q) {
      const int32_t p = position[t * k + q];
      if (p < 0) continue;
      const float weight = weights[t * k + q];
      const float* src = expert_out + int64_t{p} * c;
      for (int64_t j = 0; j < c; ++j) row[j] += weight * src[j];
    }
  }
}

void moe_combine_backward(float* d_expert_out, float* d_weights, const float* d_out,
                          const float* expert_out, const float* weights, const int32_t* position,
                          int64_t rows, int64_t k, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t q = 0; q < k; ++q) {
      const int32_t p = position[t * k + q];
      if (p < 0) {
        d_weights[t * k + q] = 0.0f;
        continue;
      }
      double dot = 0;
      for (int64_t j = 0; j < c; ++j) {
        d_expert_out[int64_t{p} * c + j] = weights[t * k + q] * d_out[t * c + j];
        dot += static_cast<double>(d_out[t * c + j]) * expert_out[int64_t{p} * c + j];
      }
      d_weights[t * k + q] = static_cast<float>(dot);
    }
}

}  // namespace loom::cpu
