#include "loom/model/moe.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/linear.hpp"

namespace loom {

namespace {
// out[:, col : col + W.rows] = in W^T, on FP8 operands where `fp8` is given.
void project(Fp8Linear* fp8, const Tensor& out, int64_t col, const Tensor& in, const Parameter& w) {
  if (fp8)
    fp8->forward(out, col, in, w.value, nullptr);
  else
    ops::linear_forward(out, col, in, w.value, nullptr);
}
// linear_backward's contract for `w` (no bias), on FP8 operands where `fp8` is given.
void project_backward(Fp8Linear* fp8, const Tensor& d_in, bool accumulate, Parameter& w,
                      const Tensor& d_out, int64_t col, const Tensor& in) {
  if (fp8)
    fp8->backward(d_in, accumulate, w.grad, Tensor(), d_out, col, in, w.value);
  else
    ops::linear_backward(d_in, accumulate, w.grad, Tensor(), d_out, col, in, w.value);
}
}  // namespace

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

MoeLayer::MoeLayer(const MoeSpec& spec, const std::string& prefix, ExpertExchange* exchange)
    : spec_(spec), exchange_(exchange) {
  spec_.validate();
  if (spec_.ep_size > 1 && (exchange_ == nullptr || exchange_->size() != spec_.ep_size ||
                            exchange_->rank() != spec_.ep_rank))
    throw_error("mixture of experts: expert parallelism over ", spec_.ep_size,
                " ranks needs an exchange over that group (rank ", spec_.ep_rank, ")");
  allocate_parameter(router, prefix + ".gate.weight", {spec.experts, spec.dim}, true, false);
  const int64_t local = spec_.local_experts();
  gate.resize(static_cast<size_t>(local));
  up.resize(gate.size());
  down.resize(gate.size());
  for (int64_t i = 0; i < local; ++i) {
    const auto l = static_cast<size_t>(i);
    const std::string x = prefix + ".experts." + std::to_string(spec_.first_expert() + i);
    allocate_parameter(gate[l], x + ".w1.weight", {spec.ffn_hidden, spec.dim}, true, false);
    allocate_parameter(up[l], x + ".w3.weight", {spec.ffn_hidden, spec.dim}, true, false);
    allocate_parameter(down[l], x + ".w2.weight", {spec.dim, spec.ffn_hidden}, true, false);
    gate[l].expert_sharded = up[l].expert_sharded = down[l].expert_sharded = spec_.ep_size > 1;
  }
  bias_.assign(static_cast<size_t>(spec.experts), 0.0f);
  if (spec.shared_experts > 0) {
    const int64_t w = spec.shared_experts * spec.ffn_hidden;
    allocate_parameter(shared_gate, prefix + ".shared_experts.w1.weight", {w, spec.dim}, true, false);
    allocate_parameter(shared_up, prefix + ".shared_experts.w3.weight", {w, spec.dim}, true, false);
    allocate_parameter(shared_down, prefix + ".shared_experts.w2.weight", {spec.dim, w}, true, false);
  }
}

int64_t MoeLayer::whole_parameter_count() const { return 1 + 3 * spec_.experts + (spec_.shared_experts > 0 ? 3 : 0); }

std::vector<int64_t> MoeLayer::parameter_slots() const {
  std::vector<int64_t> slots{0};
  for (int64_t i = 0; i < spec_.local_experts(); ++i)
    for (int64_t w = 0; w < 3; ++w) slots.push_back(1 + 3 * (spec_.first_expert() + i) + w);
  if (spec_.shared_experts > 0)
    for (int64_t w = 0; w < 3; ++w) slots.push_back(1 + 3 * spec_.experts + w);
  return slots;
}

namespace {

// Every buffer below is written whole before it is read (routing, GEMMs with beta 0, the
// gather of every kept slot), so none needs clearing. Rows live where the layer's input does,
// in its dtype; the routing itself (logits, probabilities, weights) is host f32.
Tensor activations(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), MemCategory::Activations, like.device());
}
Tensor workspace(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, like.dtype(), MemCategory::Workspace, like.device());
}
Tensor host_activations(const Shape& shape) {
  return Tensor::empty(shape, DType::F32, MemCategory::Activations);
}
Tensor host_workspace(const Shape& shape) {
  return Tensor::empty(shape, DType::F32, MemCategory::Workspace);
}

// Under expert parallelism the rows a rank received arrive source rank by source rank (and,
// within a source, expert by expert); the experts want them expert by expert. Moves rows
// between the two orders: source-major to expert-major, or back (runs of rows, copied where
// the tensors are).
void regroup(const Tensor& in, const Tensor& out, const MoeStash& s, bool to_expert_major) {
  const auto ranks = static_cast<int64_t>(s.recv_rows.size());
  const int64_t local = static_cast<int64_t>(s.local_offsets.size()) - 1, width = in.size(1);
  int64_t source_row = 0;
  for (int64_t src = 0; src < ranks; ++src)
    for (int64_t e = 0; e < local; ++e) {
      int64_t expert_row = s.local_offsets[static_cast<size_t>(e)];
      for (int64_t before = 0; before < src; ++before) expert_row += s.recv_counts[static_cast<size_t>(e * ranks + before)];
      const int64_t n = s.recv_counts[static_cast<size_t>(e * ranks + src)];
      if (n > 0) {
        const int64_t from = to_expert_major ? source_row : expert_row,
                      to = to_expert_major ? expert_row : source_row;
        ops::copy_columns(out.narrow_rows(to, to + n), 0, in.narrow_rows(from, from + n), 0, width);
      }
      source_row += n;
    }
}

}  // namespace

void MoeLayer::forward(const Tensor& out, const Tensor& x, MoeStash& s) const {
  const int64_t rows = x.size(0), c = spec_.dim, n = spec_.experts, k = spec_.top_k, f = spec_.ffn_hidden;
  if (x.size(1) != c || out.size(0) != rows || out.size(1) != c)
    throw_error("MoeLayer::forward: x ", shape_to_string(x.shape()), ", out ", shape_to_string(out.shape()),
                ", expected [rows, ", c, "]");
  // A stash reused by the next micro-batch (or by full recomputation's shared stash) still
  // holds the last routing's buffers: free them before allocating, so that a block holds one
  // set at a time (the planner's activation peak; else the widest buffer is counted twice).
  s = MoeStash{};
  s.rows = rows;
  s.logits = host_activations({rows, n});
  s.probs = host_activations({rows, n});
  s.weights = host_activations({rows, k});
  s.selected.assign(static_cast<size_t>(rows * k), 0);
  s.counts.assign(static_cast<size_t>(n), 0);
  const bool on_host = x.device() == Device::CPU;
  if (on_host) {
    ops::linear_forward(s.logits, 0, x, router.value, nullptr);
  } else {  // the logits on the device, in the activations' dtype (Megatron's default), routed here
    const Tensor logits = workspace({rows, n}, x);
    ops::linear_forward(logits, 0, x, router.value, nullptr);
    s.logits.copy_from(logits);
  }
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

  // The router's weights where the rows are (the combine reads them there).
  s.device_weights = on_host ? Tensor() : s.weights.to(x.device(), MemCategory::Activations);

  // The tokens' kept copies, expert by expert.
  const bool parallel = spec_.ep_size > 1;
  const Tensor gathered = parallel ? workspace({std::max<int64_t>(total, 1), c}, x)
                                   : activations({std::max<int64_t>(total, 1), c}, x);
  ops::moe_gather(gathered, x, s.position, k);
  s.expert_out = activations({std::max<int64_t>(total, 1), c}, x);
  if (!parallel) {
    s.routed_input = gathered;
    s.local_offsets = s.offsets;
    run_experts(s.expert_out, s);
  } else {
    plan_exchange(s, kept);
    s.routed_input = activations({std::max<int64_t>(s.local_offsets.back(), 1), c}, x);
    dispatch(gathered, s.routed_input, s);
    const Tensor local_out = workspace(s.routed_input.shape(), x);
    run_experts(local_out, s);
    bring_home(local_out, s.expert_out, s);
  }

  // The shared experts, for every token: their output starts the sum.
  if (spec_.shared_experts > 0) {
    const int64_t w = spec_.shared_experts * f;
    s.shared_pre = activations({rows, 2 * w}, x);
    s.shared_act = activations({rows, w}, x);
    project(shared_fp8(0), s.shared_pre, 0, x, shared_gate);
    project(shared_fp8(1), s.shared_pre, w, x, shared_up);
    if (bf16_activations_) ops::round_to_bf16_(s.shared_pre);
    ops::swiglu_forward(s.shared_act, s.shared_pre);
    if (bf16_activations_) ops::round_to_bf16_(s.shared_act);
  }
  // Combine: each token's kept slots, weighted, in slot order (the shared experts' output is
  // added after).
  ops::moe_combine(out, s.expert_out, on_host ? s.weights : s.device_weights, s.position, k);
  if (spec_.shared_experts > 0) {
    const Tensor shared_out = workspace({rows, c}, x);
    project(shared_fp8(2), shared_out, 0, s.shared_act, shared_down);
    ops::add_into(out, shared_out);
  }
}

void MoeLayer::plan_exchange(MoeStash& s, const std::vector<int64_t>& kept) const {
  const int ranks = spec_.ep_size;
  const int64_t local = spec_.local_experts();
  s.send_rows.assign(static_cast<size_t>(ranks), 0);
  for (int j = 0; j < ranks; ++j)
    s.send_rows[static_cast<size_t>(j)] =
        s.offsets[static_cast<size_t>((j + 1) * local)] - s.offsets[static_cast<size_t>(j * local)];
  const std::vector<int64_t> received = exchange_->exchange_counts(kept, local);  // [source][local expert]
  s.recv_counts.assign(static_cast<size_t>(local * ranks), 0);
  s.recv_rows.assign(static_cast<size_t>(ranks), 0);
  s.local_offsets.assign(static_cast<size_t>(local + 1), 0);
  for (int src = 0; src < ranks; ++src)
    for (int64_t e = 0; e < local; ++e) {
      const int64_t rows_in = received[static_cast<size_t>(src * local + e)];
      s.recv_counts[static_cast<size_t>(e * ranks + src)] = rows_in;
      s.recv_rows[static_cast<size_t>(src)] += rows_in;
      s.local_offsets[static_cast<size_t>(e + 1)] += rows_in;
    }
  for (int64_t e = 0; e < local; ++e)
    s.local_offsets[static_cast<size_t>(e + 1)] += s.local_offsets[static_cast<size_t>(e)];
}

void MoeLayer::dispatch(const Tensor& home, const Tensor& at_experts, const MoeStash& s) const {
  const Tensor inbox = workspace(at_experts.shape(), at_experts);
  exchange_->exchange_rows(home, s.send_rows, inbox, s.recv_rows);
  regroup(inbox, at_experts, s, true);
}

void MoeLayer::bring_home(const Tensor& at_experts, const Tensor& home, const MoeStash& s) const {
  const Tensor outbox = workspace(at_experts.shape(), at_experts);
  regroup(at_experts, outbox, s, false);
  exchange_->exchange_rows(outbox, s.recv_rows, home, s.send_rows);
}

MoeLayer::Fp8Layers MoeLayer::enable_fp8(const std::shared_ptr<Fp8Context>& experts,
                                         const std::shared_ptr<Fp8Context>& shared) {
  LOOM_CHECK(fp8_experts_.empty(), "MoeLayer: FP8 is already on");
  Fp8Layers out;
  for (size_t i = 0; i < 3 * gate.size(); ++i) {
    fp8_experts_.push_back(std::make_unique<Fp8Linear>(experts));
    out.experts.push_back(fp8_experts_.back().get());
  }
  if (spec_.shared_experts > 0)
    for (int j = 0; j < 3; ++j) {
      fp8_shared_.push_back(std::make_unique<Fp8Linear>(shared));
      out.shared.push_back(fp8_shared_.back().get());
    }
  return out;
}

void MoeLayer::run_experts(const Tensor& out, MoeStash& s) const {
  const int64_t f = spec_.ffn_hidden, rows = s.routed_input.size(0);
  s.pre = activations({rows, 2 * f}, s.routed_input);
  s.act = activations({rows, f}, s.routed_input);
  // One GEMM per expert over its rows: gate | up, SwiGLU, down.
  for (size_t i = 0; i < gate.size(); ++i) {
    const int64_t begin = s.local_offsets[i], end = s.local_offsets[i + 1];
    const bool empty = begin == end;
    if (empty && fp8_experts_.empty()) continue;  // (FP8 quantises even so: see enable_fp8)
    const Tensor in = s.routed_input.narrow_rows(begin, end), pre = s.pre.narrow_rows(begin, end);
    project(expert_fp8(i, 0), pre, 0, in, gate[i]);
    project(expert_fp8(i, 1), pre, f, in, up[i]);
    const Tensor act = s.act.narrow_rows(begin, end);
    if (!empty) {
      if (bf16_activations_) ops::round_to_bf16_(pre);
      ops::swiglu_forward(act, pre);
      if (bf16_activations_) ops::round_to_bf16_(act);
    }
    const Tensor expert_out = out.narrow_rows(begin, end);
    project(expert_fp8(i, 2), expert_out, 0, act, down[i]);
    if (bf16_activations_ && !empty) ops::round_to_bf16_(expert_out);
  }
}

void MoeLayer::run_experts_backward(const Tensor& d_in, const Tensor& d_out, const MoeStash& s) {
  const int64_t f = spec_.ffn_hidden;
  const Tensor d_act = workspace(s.act.shape(), s.act);
  const Tensor d_pre = workspace(s.pre.shape(), s.pre);
  for (size_t i = 0; i < gate.size(); ++i) {
    const int64_t begin = s.local_offsets[i], end = s.local_offsets[i + 1];
    const bool empty = begin == end;
    if (empty && fp8_experts_.empty()) continue;
    const Tensor da = d_act.narrow_rows(begin, end), dp = d_pre.narrow_rows(begin, end);
    const Tensor in = s.routed_input.narrow_rows(begin, end), din = d_in.narrow_rows(begin, end);
    project_backward(expert_fp8(i, 2), da, false, down[i], d_out.narrow_rows(begin, end), 0,
                     s.act.narrow_rows(begin, end));
    if (!empty) ops::swiglu_backward(dp, da, s.pre.narrow_rows(begin, end));
    project_backward(expert_fp8(i, 0), din, false, gate[i], dp, 0, in);
    project_backward(expert_fp8(i, 1), din, true, up[i], dp, f, in);
  }
}

void MoeLayer::backward(const Tensor& d_x, const Tensor& d_out, const Tensor& x, const MoeStash& s, float aux_scale,
                        float z_scale) {
  const int64_t rows = s.rows, n = spec_.experts, k = spec_.top_k, f = spec_.ffn_hidden;
  const bool on_host = x.device() == Device::CPU;
  // Combine backward: each kept slot's output gradient is its weight x the token's, and each
  // weight's gradient the dot of the token's output gradient with its expert's output.
  const Tensor d_expert_out =
      workspace(s.expert_out.shape(), s.expert_out);  // every kept row is some slot's
  const Tensor d_weights = Tensor::empty({rows, k}, DType::F32, MemCategory::Workspace, x.device());
  ops::moe_combine_backward(d_expert_out, d_weights, d_out, s.expert_out,
                            on_host ? s.weights : s.device_weights, s.position, k);
  // Experts backward, one GEMM each; under expert parallelism on the experts' holders, the
  // output gradients sent there and the input gradients brought back as the forward did.
  const Tensor d_routed = workspace(s.expert_out.shape(), s.expert_out);
  if (spec_.ep_size == 1) {
    run_experts_backward(d_routed, d_expert_out, s);
  } else {
    const Tensor d_local_out = workspace(s.routed_input.shape(), x),
                 d_local_in = workspace(s.routed_input.shape(), x);
    dispatch(d_expert_out, d_local_out, s);
    run_experts_backward(d_local_in, d_local_out, s);
    bring_home(d_local_in, d_routed, s);
  }
  // The router on the host: d_logits from the weights' gradient and the two losses, then
  // into x where x is.
  const Tensor d_weights_host =
      on_host ? d_weights : d_weights.to(Device::CPU, MemCategory::Workspace);
  const Tensor d_logits = host_workspace({rows, n});
  const cpu::MoeRouteArgs args{rows, n, k, spec_.router == MoeRouter::Sigmoid};
  cpu::moe_route_backward(args, d_logits.f32(), d_weights_host.f32(), s.logits.f32(), s.probs.f32(),
                          s.selected.data(), s.weights.f32(), s.counts.data(), aux_scale, z_scale);
  Tensor d_logits_here = d_logits;
  if (!on_host) {
    d_logits_here = workspace({rows, n}, x);
    d_logits_here.copy_from(d_logits);
  }
  ops::linear_backward(d_x, false, router.grad, Tensor(), d_logits_here, 0, x, router.value);
  // The shared experts' input gradient, added to the router's.
  if (spec_.shared_experts > 0) {
    const int64_t w = spec_.shared_experts * f;
    const Tensor d_shared_act = workspace({rows, w}, x), d_shared_pre = workspace({rows, 2 * w}, x);
    project_backward(shared_fp8(2), d_shared_act, false, shared_down, d_out, 0, s.shared_act);
    ops::swiglu_backward(d_shared_pre, d_shared_act, s.shared_pre);
    project_backward(shared_fp8(0), d_x, true, shared_gate, d_shared_pre, 0, x);
    project_backward(shared_fp8(1), d_x, true, shared_up, d_shared_pre, w, x);
  }
  // Gather backward: every kept copy's gradient back to its token, in slot order.
  ops::moe_gather_backward(d_x, d_routed, s.position, k);
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
