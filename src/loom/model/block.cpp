#include "loom/model/block.hpp"

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"

namespace loom {

namespace {
NormKind norm_kind(const ModelConfig& c) {
  return c.arch == Architecture::GPT2 ? NormKind::LayerNorm : NormKind::RMSNorm;
}
std::string norm_name(const ModelConfig& c, const std::string& prefix, int which) {
  if (c.arch == Architecture::GPT2) return prefix + (which == 1 ? ".ln_1" : ".ln_2");
  return prefix + (which == 1 ? ".input_layernorm" : ".post_attention_layernorm");
}
}  // namespace

TransformerBlock::TransformerBlock(const ModelConfig& c, const ParallelPlan& plan,
                                   const std::string& prefix,
                                   std::shared_ptr<const ops::Rope> rope, int64_t layer)
    : norm1(norm_kind(c), norm_name(c, prefix, 1), c.n_embd, static_cast<float>(c.norm_eps)),
      attention(c, plan, prefix, std::move(rope)),
      norm2(norm_kind(c), norm_name(c, prefix, 2), c.n_embd, static_cast<float>(c.norm_eps)),
      sequence_parallel_(plan.sequence_parallel() && plan.tp() > 1) {
  attention.set_windowed(c.is_windowed_layer(layer));
  if (!c.is_moe_layer(layer)) {
    mlp = std::make_unique<Mlp>(c, plan, prefix);
    return;
  }
  if (c.arch != Architecture::Llama)
    throw_error("model.n_experts = ", c.n_experts, " with model.arch = gpt2: mixture-of-experts layers are "
                "Llama-style (SwiGLU experts, Mixtral's layout) so far; use arch = \"llama\"");
  // Under tensor parallelism the experts are not split: every tp rank runs the layer on the rows
  // it holds (all of them, the same on every tp rank; its own rows under sequence parallelism,
  // whose parameter gradients partial_grads() then sums over tp).
  MoeSpec spec;
  spec.dim = c.n_embd;
  spec.experts = c.n_experts;
  spec.top_k = c.experts_per_token;
  spec.ffn_hidden = c.expert_ffn();
  spec.router = c.moe_router;
  spec.capacity_factor = c.moe_capacity_factor;
  spec.shared_experts = c.n_shared_experts;
  ExpertExchange* exchange = plan.expert_exchange();
  if (exchange != nullptr) {
    spec.ep_rank = exchange->rank();
    spec.ep_size = exchange->size();
    if (c.n_experts % spec.ep_size != 0)
      throw_error("model.n_experts = ", c.n_experts, " experts do not split over ep = ", spec.ep_size,
                  ": use an ep that divides them");
  }
  moe = std::make_unique<MoeLayer>(spec, prefix + ".block_sparse_moe", exchange);
  aux_loss_coef_ = static_cast<float>(c.moe_aux_loss_coef);
  z_loss_coef_ = static_cast<float>(c.moe_z_loss_coef);
}

void TransformerBlock::forward(const Tensor& x_out, const Tensor& x_in, BlockStash& stash,
                               int64_t batch, int64_t seq_len) const {
  // The residual stream and the norms hold this rank's rows (all of them without sequence
  // parallelism); attention and the MLP see every row.
  norm1.forward(stash.norm1_out, stash.norm1, x_in);
  round_if_bf16(stash.norm1_out);
  attention.forward(stash.residual_mid, stash, batch, seq_len);
  // residual_mid = attention's output + x_in, and norm2 of it (one kernel on CUDA in bf16).
  norm2.forward_added(stash.norm2_out, stash.norm2, stash.residual_mid, x_in, stash.residual_mid,
                      bf16_activations_);
  round_if_bf16(stash.norm2_out);
  if (moe) {
    moe->forward(x_out, stash.norm2_out, stash.moe);
  } else {
    mlp->forward(x_out, stash);
  }
  ops::add_into(x_out, stash.residual_mid);
  round_if_bf16(x_out);
}

void TransformerBlock::round_if_bf16(const Tensor& x) const {
  if (bf16_activations_) ops::round_to_bf16_(x);
}

void TransformerBlock::set_bf16_activations(bool on) {
  bf16_activations_ = on;
  attention.set_bf16_activations(on);
  if (mlp) mlp->set_bf16_activations(on);
  if (moe) moe->set_bf16_activations(on);
}

void TransformerBlock::backward(const Tensor& d_x, const Tensor& x_in, BlockStash& stash,
                                BlockGradScratch& scratch, Recompute recompute, int64_t batch,
                                int64_t seq_len) {
  if (recompute == Recompute::Full) {
    forward(scratch.d_norm_out, x_in, stash, batch, seq_len);  // output itself unused
  } else if (recompute == Recompute::Selective) {
    attention.recompute_core(stash, batch, seq_len);
    if (mlp) mlp->recompute_activation(stash);  // a MoE block keeps its experts' activations
  }
  // The MLP reads the output's gradient before norm2 adds to it (work a split backward defers
  // keeps its own copy); the residual then carries it on: d_x becomes the gradient at
  // residual_mid, which attention reads, and then at x_in.
  if (moe) {
    moe->backward(scratch.d_norm_out, d_x, stash.norm2_out, stash.moe,
                  aux_loss_coef_ * stash.moe_loss_scale, z_loss_coef_ * stash.moe_loss_scale);
    stash.moe = MoeStash{};  // its routing's buffers are sized by the data: freed once read
  } else {
    mlp->backward(d_x, stash, scratch);
  }
  norm2.backward(d_x, scratch.d_norm_out, stash.residual_mid, stash.norm2);
  attention.backward(d_x, stash, scratch, batch, seq_len);
  norm1.backward(d_x, scratch.d_norm_out, x_in, stash.norm1);
}

ParameterList TransformerBlock::partial_grads() {
  ParameterList out;
  if (!sequence_parallel_) return out;
  norm1.collect(out);
  norm2.collect(out);
  for (Parameter* p : attention.partial_grads()) out.push_back(p);
  if (mlp)
    for (Parameter* p : mlp->partial_grads()) out.push_back(p);
  if (moe) moe->collect(out);  // every MoE parameter saw this rank's rows only
  return out;
}

std::vector<int64_t> TransformerBlock::parameter_slots() {
  ParameterList mine;
  collect(mine);
  std::vector<int64_t> slots(mine.size());
  for (size_t k = 0; k < slots.size(); ++k) slots[k] = static_cast<int64_t>(k);
  if (!moe) return slots;
  const int64_t before = static_cast<int64_t>(mine.size()) - static_cast<int64_t>(moe->parameter_slots().size());
  const std::vector<int64_t> moe_slots = moe->parameter_slots();
  for (size_t k = 0; k < moe_slots.size(); ++k) slots[static_cast<size_t>(before) + k] = before + moe_slots[k];
  return slots;
}

int64_t TransformerBlock::whole_parameter_count() {
  ParameterList mine;
  collect(mine);
  if (!moe) return static_cast<int64_t>(mine.size());
  return static_cast<int64_t>(mine.size()) - static_cast<int64_t>(moe->parameter_slots().size()) +
         moe->whole_parameter_count();
}

void TransformerBlock::collect(ParameterList& out) {
  norm1.collect(out);
  attention.collect(out);
  norm2.collect(out);
  if (moe)
    moe->collect(out);
  else
    mlp->collect(out);
}

}  // namespace loom
