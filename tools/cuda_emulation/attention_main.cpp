// Runs attention_mma.cu's and attention_pipelined.cu's kernels under emulation against causal
// attention computed here in double, with the per-element rounding bound of
// tests/gpu/test_cuda_attention_tensor_cores.cpp (2^-8 of the element's absolute-value sum M
// plus 2^-8 of the value for bf16 rounding, 2^-14 M for f32 accumulation). Prints each
// kernel's worst error as a multiple of that bound; exits 1 when one is past it.
//
//   tools/cuda_emulation/run.sh [mutate]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels.hpp"

namespace {

using emulated::bf16;
using loom::cpu::AttentionShape;

float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

struct Reference {
  std::vector<double> out, out_mag, lse, d_qkv, d_qkv_mag;
};

// Exact causal attention; with `out_for_delta` the backward too, D_i taken from that output.
Reference reference(const std::vector<float>& qkv, const std::vector<float>& d_out,
                    const AttentionShape& s, const std::vector<float>* out_for_delta) {
  const int64_t T = s.seq_len, D = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t ld = s.qkv_ld(), old = s.out_ld();
  const double scale = 1.0 / std::sqrt(double(D));
  Reference r;
  r.out.assign(size_t(s.batch * T * old), 0.0);
  r.out_mag = r.out;
  r.lse.assign(size_t(s.batch * s.heads * T), 0.0);
  r.d_qkv.assign(size_t(s.batch * T * ld), 0.0);
  r.d_qkv_mag = r.d_qkv;
  std::vector<double> p(static_cast<size_t>(T));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t qc = h * D, kc = (s.heads + h / group) * D,
                    vc = (s.heads + s.kv_heads + h / group) * D;
      auto at = [&](int64_t row, int64_t col) { return size_t((b * T + row) * ld + col); };
      auto oat = [&](int64_t row, int64_t col) { return size_t((b * T + row) * old + col); };
      for (int64_t i = 0; i < T; ++i) {
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t c = 0; c < D; ++c) dot += double(qkv[at(i, qc + c)]) * qkv[at(j, kc + c)];
          p[size_t(j)] = dot * scale;
          mx = std::max(mx, p[size_t(j)]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
        for (int64_t j = 0; j <= i; ++j) p[size_t(j)] /= sum;
        r.lse[size_t((b * s.heads + h) * T + i)] = mx + std::log(sum);
        double delta = 0.0;
        for (int64_t c = 0; c < D; ++c) {
          double o = 0.0, mag = 0.0;
          for (int64_t j = 0; j <= i; ++j) {
            o += p[size_t(j)] * qkv[at(j, vc + c)];
            mag += p[size_t(j)] * std::fabs(qkv[at(j, vc + c)]);
          }
          r.out[oat(i, qc + c)] = o;
          r.out_mag[oat(i, qc + c)] = mag;
          if (out_for_delta)
            delta += double(d_out[oat(i, qc + c)]) * (*out_for_delta)[oat(i, qc + c)];
        }
        if (!out_for_delta) continue;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0, bound = 0.0;
          for (int64_t c = 0; c < D; ++c) {
            const double product = double(d_out[oat(i, qc + c)]) * qkv[at(j, vc + c)];
            dot += product;
            bound += std::fabs(product);
          }
          const double pj = p[size_t(j)];
          const double ds = pj * (dot - delta), ds_bound = pj * (bound + std::fabs(delta));
          for (int64_t c = 0; c < D; ++c) {
            const double g = d_out[oat(i, qc + c)];
            r.d_qkv[at(j, vc + c)] += pj * g;
            r.d_qkv_mag[at(j, vc + c)] += pj * std::fabs(g);
            r.d_qkv[at(j, kc + c)] += scale * ds * qkv[at(i, qc + c)];
            r.d_qkv_mag[at(j, kc + c)] += scale * ds_bound * std::fabs(qkv[at(i, qc + c)]);
            r.d_qkv[at(i, qc + c)] += scale * ds * qkv[at(j, kc + c)];
            r.d_qkv_mag[at(i, qc + c)] += scale * ds_bound * std::fabs(qkv[at(j, kc + c)]);
          }
        }
      }
    }
  return r;
}

// The worst |got - want| as a multiple of its rounding bound.
double worst_ratio(const std::vector<bf16>& got, const std::vector<double>& want,
                   const std::vector<double>& mag) {
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowed = mag[i] / 256 + std::fabs(want[i]) / 256 + mag[i] / 16384 + 1e-7;
    const double err = std::fabs(double(__bfloat162float(got[i])) - want[i]);
    worst = std::max(worst, std::isnan(err) ? 1e30 : err / allowed);
  }
  return worst;
}

std::vector<float> random_bf16(size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(dist(rng));
  return v;
}
std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16_rn(v[i]);
  return out;
}
std::vector<float> to_f32(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __bfloat162float(v[i]);
  return out;
}

bool check(const AttentionShape& s, bool pipelined, unsigned seed) {
  const auto d = loom::cuda::detail::attention_dims(s, 128);
  const auto qkv = random_bf16(size_t(s.batch * s.seq_len * s.qkv_ld()), seed, -2.0f, 2.0f);
  const auto d_out = random_bf16(size_t(s.batch * s.seq_len * s.out_ld()), seed + 1, -1.0f, 1.0f);
  const Reference want = reference(qkv, d_out, s, nullptr);
  const auto g_qkv = to_bf16(qkv), g_dout = to_bf16(d_out);
  std::vector<bf16> out(want.out.size(), __float2bfloat16_rn(1e3f));
  std::vector<float> lse(want.lse.size(), 1e3f);
  (pipelined ? emulated::pipelined_forward : emulated::mma_forward)(out.data(), lse.data(),
                                                                    g_qkv.data(), d);
  double lse_err = 0.0;
  for (size_t i = 0; i < lse.size(); ++i)
    lse_err =
        std::max(lse_err, std::fabs(lse[i] - want.lse[i]) / (1e-4 * std::fabs(want.lse[i]) + 1e-5));
  const auto got_out = to_f32(out);
  const Reference grads = reference(qkv, d_out, s, &got_out);
  std::vector<float> delta(lse.size());
  const int64_t T = s.seq_len, D = s.head_dim;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < T; ++i) {
        double sum = 0.0;
        for (int64_t c = 0; c < D; ++c) {
          const size_t at = size_t((b * T + i) * s.out_ld() + h * D + c);
          sum += double(d_out[at]) * got_out[at];
        }
        delta[size_t((b * s.heads + h) * T + i)] = static_cast<float>(sum);
      }
  std::vector<bf16> d_qkv(qkv.size(), __float2bfloat16_rn(1e3f));
  (pipelined ? emulated::pipelined_backward : emulated::mma_backward)(
      d_qkv.data(), g_dout.data(), g_qkv.data(), lse.data(), delta.data(), d);
  const double out_ratio = worst_ratio(out, want.out, want.out_mag);
  const double grad_ratio = worst_ratio(d_qkv, grads.d_qkv, grads.d_qkv_mag);
  const bool ok = out_ratio <= 1.0 && grad_ratio <= 1.0 && lse_err <= 1.0;
  std::printf(
      "%-10s batch %ld seq %4ld heads %ld kv %ld head_dim %3ld: out %.3f, lse %.3f, d_qkv %.3f of "
      "the bound %s\n",
      pipelined ? "pipelined" : "mma", long(s.batch), long(s.seq_len), long(s.heads),
      long(s.kv_heads), long(s.head_dim), out_ratio, lse_err, grad_ratio, ok ? "ok" : "FAILED");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "both";
  const AttentionShape shapes[] = {
      {2, 70, 2, 2, 64},    // a partial second tile, two sequences
      {1, 200, 4, 1, 128},  // four tiles, the last partial; 4 query heads per kv head
      {1, 64, 2, 1, 128},   // one tile
      {1, 130, 2, 2, 64},   // a 128-row forward tile and two rows past it
      {1, 256, 2, 1, 64},   // whole tiles, grouped
  };
  bool ok = true;
  unsigned seed = 10;
  for (const auto& s : shapes) {
    if (which != "pipelined") ok = check(s, false, seed) && ok;
    if (which != "mma") ok = check(s, true, seed) && ok;
    seed += 2;
  }
  return ok ? 0 : 1;
}
