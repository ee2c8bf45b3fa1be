#include "loom/model/moe.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/linear.hpp"

namespace loom {

void MoeSpec::validate() const {
  if (dim < 1) throw_error("mixture of experts: model.n_embd = ", dim, ", expected >= 1");
  if (experts < 1) throw_error("mixture of experts: model.n_experts = ", experts, ", expected >= 1");
  if (top_k < 1 || top_k > experts)
    throw_error("mixture of experts: model.experts_per_token = ", top_k, ", expected 1 to model.n_experts = ", experts);
  if (ffn_hidden < 1) throw_error("mixture of experts: expert width ", ffn_hidden, ", expected >= 1");
  if (shared_experts < 0) throw_error("mixture of experts: model.n_shared_experts = ", shared_experts, ", expected >= 0");
  if (!(capacity_factor >= 0) || !std::isfinite(capacity_factor))
    throw_error("mixture of experts: capacity factor ", capacity_factor,
                ", expected > 0 (tokens per expert at most factor x k x tokens / experts) or 0 (dropless)");
}

int64_t MoeSpec::capacity(int64_t rows) const {
  if (capacity_factor == 0) return rows * top_k;
  return static_cast<int64_t>(
      std::ceil(capacity_factor * static_cast<double>(top_k * rows) / static_cast<double>(experts)));
}

MoeLayer::MoeLayer(const MoeSpec& spec, const std::string& prefix) : spec_(spec) {
  spec_.validate();
  allocate_parameter(router, prefix + ".gate.weight", {spec.experts, spec.dim}, true, false);
  gate.resize(static_cast<size_t>(spec.experts));
  up.resize(gate.size());
  down.resize(gate.size());
  for (int64_t e = 0; e < spec.experts; ++e) {
    const std::string x = prefix + ".experts." + std::to_string(e);
    allocate_parameter(gate[static_cast<size_t>(e)], x + ".w1.weight", {spec.ffn_hidden, spec.dim}, true, false);
    allocate_parameter(up[static_cast<size_t>(e)], x + ".w3.weight", {spec.ffn_hidden, spec.dim}, true, false);
    allocate_parameter(down[static_cast<size_t>(e)], x + ".w2.weight", {spec.dim, spec.ffn_hidden}, true, false);
  }
  bias_.assign(static_cast<size_t>(spec.experts), 0.0f);
  if (spec.shared_experts > 0) {
    const int64_t w = spec.shared_experts * spec.ffn_hidden;
    allocate_parameter(shared_gate, prefix + ".shared_experts.w1.weight", {w, spec.dim}, true, false);
    allocate_parameter(shared_up, prefix + ".shared_experts.w3.weight", {w, spec.dim}, true, false);
    allocate_parameter(shared_down, prefix + ".shared_experts.w2.weight", {spec.dim, w}, true, false);
  }
}

namespace {

void require_host(const char* what, const Tensor& t) {
  if (t.device() != Device::CPU || t.dtype() != DType::F32)
    throw_error("mixture of experts: ", what, " is ", device_name(t.device()), " ", dtype_name(t.dtype()),
                "; MoE layers run on host f32 tensors so far");
}

// Every buffer below is written whole before it is read (routing, GEMMs with beta 0, the
// gather of every kept slot), so none needs clearing.
Tensor activations(const Shape& shape) { return Tensor::empty(shape, DType::F32, MemCategory::Activations); }
Tensor workspace(const Shape& shape) { return Tensor::empty(shape, DType::F32, MemCategory::Workspace); }

}  // namespace

void MoeLayer::forward(const Tensor& out, const Tensor& x, MoeStash& s) const {
  require_host("the input", x);
  require_host("the output", out);
  const int64_t rows = x.size(0), c = spec_.dim, n = spec_.experts, k = spec_.top_k, f = spec_.ffn_hidden;
  if (x.size(1) != c || out.size(0) != rows || out.size(1) != c)
    throw_error("MoeLayer::forward: x ", shape_to_string(x.shape()), ", out ", shape_to_string(out.shape()),
                ", expected [rows, ", c, "]");
  s.rows = rows;
  s.logits = activations({rows, n});
  s.probs = activations({rows, n});
  s.weights = activations({rows, k});
  s.selected.assign(static_cast<size_t>(rows * k), 0);
  s.counts.assign(static_cast<size_t>(n), 0);
  ops::linear_forward(s.logits, 0, x, router.value, nullptr);
  const cpu::MoeRouteArgs args{rows, n, k, spec_.router == MoeRouter::Sigmoid};
  cpu::moe_route(args, s.logits.f32(), bias_.data(), s.probs.f32(), s.selected.data(), s.weights.f32(),
                 s.counts.data());
  s.losses = cpu::moe_router_losses(args, s.logits.f32(), s.probs.f32(), s.counts.data());

  // Slots expert by expert, tokens in order within an expert; an expert keeps its first
  // `capacity` slots.
  const int64_t capacity = spec_.capacity(rows);
  std::vector<int64_t> kept(static_cast<size_t>(n), 0);
  for (int64_t e = 0; e < n; ++e) kept[static_cast<size_t>(e)] = std::min(capacity, s.counts[static_cast<size_t>(e)]);
  s.offsets.assign(static_cast<size_t>(n + 1), 0);
  for (int64_t e = 0; e < n; ++e) s.offsets[static_cast<size_t>(e + 1)] = s.offsets[static_cast<size_t>(e)] + kept[static_cast<size_t>(e)];
  const int64_t total = s.offsets.back();
  s.dropped = rows * k - total;
  s.position.assign(static_cast<size_t>(rows * k), -1);
  std::vector<int64_t> next(s.offsets.begin(), s.offsets.end() - 1);
  for (int64_t slot = 0; slot < rows * k; ++slot) {
    const auto e = static_cast<size_t>(s.selected[static_cast<size_t>(slot)]);
    if (next[e] < s.offsets[e + 1]) s.position[static_cast<size_t>(slot)] = static_cast<int32_t>(next[e]++);
  }

  s.routed_input = activations({std::max<int64_t>(total, 1), c});
  s.pre = activations({std::max<int64_t>(total, 1), 2 * f});
  s.act = activations({std::max<int64_t>(total, 1), f});
  s.expert_out = activations({std::max<int64_t>(total, 1), c});
  const float* xs = x.f32();
  float* routed = s.routed_input.f32();
  for (int64_t slot = 0; slot < rows * k; ++slot)
    if (const int32_t p = s.position[static_cast<size_t>(slot)]; p >= 0)
      std::copy(xs + (slot / k) * c, xs + (slot / k + 1) * c, routed + p * c);

  // One GEMM per expert over its rows: gate | up, SwiGLU, down.
  for (int64_t e = 0; e < n; ++e) {
    const int64_t begin = s.offsets[static_cast<size_t>(e)], end = s.offsets[static_cast<size_t>(e + 1)];
    if (begin == end) continue;
    const auto i = static_cast<size_t>(e);
    const Tensor in = s.routed_input.narrow_rows(begin, end), pre = s.pre.narrow_rows(begin, end);
    ops::linear_forward(pre, 0, in, gate[i].value, nullptr);
    ops::linear_forward(pre, f, in, up[i].value, nullptr);
    const Tensor act = s.act.narrow_rows(begin, end);
    ops::swiglu_forward(act, pre);
    ops::linear_forward(s.expert_out.narrow_rows(begin, end), 0, act, down[i].value, nullptr);
  }

  // The shared experts, for every token: their output starts the sum.
  if (spec_.shared_experts > 0) {
    const int64_t w = spec_.shared_experts * f;
    s.shared_pre = activations({rows, 2 * w});
    s.shared_act = activations({rows, w});
    ops::linear_forward(s.shared_pre, 0, x, shared_gate.value, nullptr);
    ops::linear_forward(s.shared_pre, w, x, shared_up.value, nullptr);
    ops::swiglu_forward(s.shared_act, s.shared_pre);
  }
  // Combine: each token's kept slots, weighted, in slot order.
  float* o = out.f32();
  const float* eo = s.expert_out.f32();
  const float* w = s.weights.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    float* row = o + t * c;
    std::fill(row, row + c, 0.0f);  // (the shared experts' output is added after)
    for (int64_t q = 0; q < k; ++q) {
      const int32_t p = s.position[static_cast<size_t>(t * k + q)];
      if (p < 0) continue;
      const float weight = w[t * k + q];
      const float* src = eo + int64_t{p} * c;
      for (int64_t j = 0; j < c; ++j) row[j] += weight * src[j];
    }
  }
  if (spec_.shared_experts > 0) {
    const Tensor shared_out = Tensor::empty({rows, c}, DType::F32, MemCategory::Workspace);
    ops::linear_forward(shared_out, 0, s.shared_act, shared_down.value, nullptr);
    ops::add_into(out, shared_out);
  }
}

void MoeLayer::backward(const Tensor& d_x, const Tensor& d_out, const Tensor& x, const MoeStash& s, float aux_scale,
                        float z_scale) {
  require_host("the input gradient", d_x);
  require_host("the output gradient", d_out);
  const int64_t rows = s.rows, c = spec_.dim, n = spec_.experts, k = spec_.top_k, f = spec_.ffn_hidden;
  // Combine backward: each kept slot's output gradient is its weight x the token's, and each
  // weight's gradient the dot of the token's output gradient with its expert's output.
  const Tensor d_expert_out = workspace(s.expert_out.shape());  // every kept row is some slot's
  const Tensor d_weights = Tensor::zeros({rows, k}, DType::F32, MemCategory::Workspace);  // dropped slots stay 0
  {
    const float* g = d_out.f32();
    const float* eo = s.expert_out.f32();
    const float* w = s.weights.f32();
    float* de = d_expert_out.f32();
    float* dw = d_weights.f32();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t q = 0; q < k; ++q) {
        const int32_t p = s.position[static_cast<size_t>(t * k + q)];
        if (p < 0) continue;
        double dot = 0;
        for (int64_t j = 0; j < c; ++j) {
          de[int64_t{p} * c + j] = w[t * k + q] * g[t * c + j];
          dot += static_cast<double>(g[t * c + j]) * eo[int64_t{p} * c + j];
        }
        dw[t * k + q] = static_cast<float>(dot);
      }
  }
  // Experts backward, one GEMM each.
  const Tensor d_act = workspace(s.act.shape());
  const Tensor d_pre = workspace(s.pre.shape());
  const Tensor d_routed = workspace(s.routed_input.shape());
  for (int64_t e = 0; e < n; ++e) {
    const int64_t begin = s.offsets[static_cast<size_t>(e)], end = s.offsets[static_cast<size_t>(e + 1)];
    if (begin == end) continue;
    const auto i = static_cast<size_t>(e);
    const Tensor da = d_act.narrow_rows(begin, end), dp = d_pre.narrow_rows(begin, end);
    const Tensor in = s.routed_input.narrow_rows(begin, end), din = d_routed.narrow_rows(begin, end);
    ops::linear_backward(da, false, down[i].grad, Tensor(), d_expert_out.narrow_rows(begin, end), 0,
                         s.act.narrow_rows(begin, end), down[i].value);
    ops::swiglu_backward(dp, da, s.pre.narrow_rows(begin, end));
    ops::linear_backward(din, false, gate[i].grad, Tensor(), dp, 0, in, gate[i].value);
    ops::linear_backward(din, true, up[i].grad, Tensor(), dp, f, in, up[i].value);
  }
  // The router: d_logits from the weights' gradient and the two losses, then into x.
  const Tensor d_logits = workspace({rows, n});
  const cpu::MoeRouteArgs args{rows, n, k, spec_.router == MoeRouter::Sigmoid};
  cpu::moe_route_backward(args, d_logits.f32(), d_weights.f32(), s.logits.f32(), s.probs.f32(), s.selected.data(),
                          s.weights.f32(), s.counts.data(), aux_scale, z_scale);
  ops::linear_backward(d_x, false, router.grad, Tensor(), d_logits, 0, x, router.value);
  // The shared experts' input gradient, added to the router's.
  if (spec_.shared_experts > 0) {
    const int64_t w = spec_.shared_experts * f;
    const Tensor d_shared_act = workspace({rows, w}), d_shared_pre = workspace({rows, 2 * w});
    ops::linear_backward(d_shared_act, false, shared_down.grad, Tensor(), d_out, 0, s.shared_act, shared_down.value);
    ops::swiglu_backward(d_shared_pre, d_shared_act, s.shared_pre);
    ops::linear_backward(d_x, true, shared_gate.grad, Tensor(), d_shared_pre, 0, x, shared_gate.value);
    ops::linear_backward(d_x, true, shared_up.grad, Tensor(), d_shared_pre, w, x, shared_up.value);
  }
  // Gather backward: every kept copy's gradient back to its token, in slot order.
  float* dx = d_x.f32();
  const float* dr = d_routed.f32();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t q = 0; q < k; ++q) {
      const int32_t p = s.position[static_cast<size_t>(t * k + q)];
      if (p < 0) continue;
      for (int64_t j = 0; j < c; ++j) dx[t * c + j] += dr[int64_t{p} * c + j];
    }
}

void MoeLayer::collect(ParameterList& out) {
  out.push_back(&router);
  for (size_t e = 0; e < gate.size(); ++e) {
    out.push_back(&gate[e]);
    out.push_back(&up[e]);
    out.push_back(&down[e]);
  }
  if (spec_.shared_experts > 0) {
    out.push_back(&shared_gate);
    out.push_back(&shared_up);
    out.push_back(&shared_down);
  }
}

void MoeLayer::set_bias(const std::vector<float>& bias) {
  if (bias.size() != bias_.size())
    throw_error("mixture of experts: a selection bias of ", bias.size(), " values for ", bias_.size(), " experts");
  bias_ = bias;
}

void MoeLayer::update_bias(const std::vector<int64_t>& counts, float rate) {
  if (spec_.router != MoeRouter::Sigmoid)
    throw_error("mixture of experts: the selection bias (auxiliary-loss-free balancing) needs the sigmoid router, "
                "this layer's is ", moe_router_name(spec_.router));
  if (counts.size() != bias_.size())
    throw_error("MoeLayer::update_bias: ", counts.size(), " counts for ", bias_.size(), " experts");
  double mean = 0;
  for (int64_t count : counts) mean += static_cast<double>(count) / static_cast<double>(counts.size());
  for (size_t e = 0; e < counts.size(); ++e) {
    const double load = static_cast<double>(counts[e]);
    if (load > mean) bias_[e] -= rate;
    else if (load < mean) bias_[e] += rate;
  }
}

}  // namespace loom
