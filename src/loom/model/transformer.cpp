#include "loom/model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"
#include "loom/kernels/cpu/cross_entropy.hpp"
#include "loom/kernels/cpu/elementwise.hpp"
#include "loom/kernels/cpu/embedding.hpp"
#include "loom/kernels/cpu/gemm.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/tensor_shard.hpp"

namespace loom {

namespace {
// A [vocab, dim] table laid out as the plan says: this rank's vocabulary rows.
void allocate_vocab_table(Parameter& p, std::string name, const ParallelPlan& plan, int64_t vocab,
                          int64_t dim) {
  const Placement placement = plan.vocab_placement(vocab, dim);
  allocate_parameter(p, std::move(name), shard_shape(placement), true);
  p.placement = placement;
}
}  // namespace

Transformer::Transformer(const ModelConfig& config, Recompute recompute, int64_t vocab_chunk,
                         std::shared_ptr<const ParallelPlan> plan)
    : config_(config),
      plan_(plan ? std::move(plan) : single_process_plan()),
      recompute_(recompute),
      vocab_chunk_(vocab_chunk) {
  config_.validate();
  if (config_.is_moe())
    throw_error("model.n_experts = ", config_.n_experts, ": the engine trains dense models only so far; "
                "`loom plan` plans Mixture-of-Experts models");
  if (vocab_chunk_ <= 0) throw_error("vocab_chunk: got ", vocab_chunk_, ", expected a positive count");
  const bool gpt2 = config_.arch == Architecture::GPT2;
  (void)plan_->local_dims(config_);  // a tp that does not divide the heads fails here, first
  allocate_vocab_table(token_embedding, gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight",
                       *plan_, config_.vocab_size, config_.n_embd);
  parameters_.push_back(&token_embedding);
  if (gpt2) {
    allocate_parameter(position_embedding, "transformer.wpe.weight",
                       {config_.max_seq_len, config_.n_embd}, true);
    parameters_.push_back(&position_embedding);
  } else {
    rope_ = std::make_shared<cpu::RopeTable>(
        cpu::make_rope_table(config_.head_dim(), config_.max_seq_len, config_.rope_theta));
  }
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    const std::string prefix = (gpt2 ? "transformer.h." : "model.layers.") + std::to_string(l);
    blocks.push_back(std::make_unique<TransformerBlock>(config_, *plan_, prefix, rope_));
    blocks.back()->collect(parameters_);
    blocks.back()->collect(block_parameters_.emplace_back());
  }
  final_norm = std::make_unique<Norm>(gpt2 ? NormKind::LayerNorm : NormKind::RMSNorm,
                                      gpt2 ? "transformer.ln_f" : "model.norm", config_.n_embd,
                                      static_cast<float>(config_.norm_eps));
  final_norm->collect(parameters_);
  if (!config_.tied_embeddings) {
    allocate_vocab_table(lm_head, "lm_head.weight", *plan_, config_.vocab_size, config_.n_embd);
    parameters_.push_back(&lm_head);
  }
}

void Transformer::init_weights(uint64_t seed) {
  constexpr double kStd = 0.02;
  const double residual_std = kStd / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  auto is_residual_output = [](const std::string& name) {
    return name.find("c_proj.weight") != std::string::npos ||
           name.find("o_proj.weight") != std::string::npos ||
           name.find("down_proj.weight") != std::string::npos;
  };
  for (size_t index = 0; index < parameters_.size(); ++index) {
    Parameter& p = *parameters_[index];
    float* v = p.value.f32();
    const bool is_norm_weight = p.value.dim() == 1 && p.name.find("bias") == std::string::npos;
    if (p.value.dim() == 1) {
      for (int64_t i = 0; i < p.value.numel(); ++i) v[i] = is_norm_weight ? 1.0f : 0.0f;
      continue;
    }
    const double std = is_residual_output(p.name) ? residual_std : kStd;
    // One stream per parameter (keyed by its index): the same values for any thread count.
    // A shard draws the whole tensor and keeps its part.
    const CounterRng rng(seed, index);
    Tensor full = p.placement.replicated
                      ? p.value
                      : Tensor::empty(p.placement.full_shape, DType::F32, MemCategory::Workspace);
    float* f = full.f32();
    for (int64_t i = 0; i < full.numel(); ++i)
      f[i] = static_cast<float>(std * rng.normal(static_cast<uint64_t>(i)));
    if (!p.placement.replicated) p.value.copy_from(take_shard(full, p.placement));
  }
}

void Transformer::set_bf16_activations(bool on) {
  bf16_activations_ = on;
  for (auto& block : blocks) block->set_bf16_activations(on);
}

ParameterList Transformer::parameters_in_grad_ready_order() {
  ParameterList order;
  auto add = [&](Parameter* p) { order.push_back(p); };
  if (!config_.tied_embeddings) add(&lm_head);
  add(&final_norm->weight);
  if (!final_norm->bias.name.empty()) add(&final_norm->bias);
  for (auto it = block_parameters_.rbegin(); it != block_parameters_.rend(); ++it)
    for (Parameter* p : *it) order.push_back(p);
  add(&token_embedding);
  if (has_position_embedding()) add(&position_embedding);
  return order;
}

void Transformer::grads_ready(const ParameterList& params) {
  if (grad_ready_hook_)
    for (Parameter* p : params) grad_ready_hook_(*p);
}

void Transformer::zero_grad() {
  for (Parameter* p : parameters_)
    if (p->grad.defined()) p->grad.zero_();
}

ParameterList Transformer::unit_parameters(int64_t unit) {
  if (unit < 0 || unit > config_.n_layer) throw_error("unit ", unit, " is outside [0, ", config_.n_layer, "]");
  if (unit > 0) return block_parameters_[static_cast<size_t>(unit - 1)];
  ParameterList root{&token_embedding};
  if (has_position_embedding()) root.push_back(&position_embedding);
  final_norm->collect(root);
  if (!config_.tied_embeddings) root.push_back(&lm_head);
  return root;
}

void Transformer::ensure_activations(int64_t batch, int64_t seq_len) {
  if (batch == batch_ && seq_len == seq_len_) return;
  stashes_.clear();
  batch_ = batch;
  seq_len_ = seq_len;
  const int64_t rows = plan_->local_rows(batch * seq_len), c = config_.n_embd;
  auto activation = [](const Shape& shape) {
    return Tensor::empty(shape, DType::F32, MemCategory::Activations);
  };
  residuals_ = activation({config_.n_layer + 1, rows, c});
  final_norm_out_ = activation({rows, c});
  final_norm_stash_.rstd = activation({rows});
  if (config_.arch == Architecture::GPT2) final_norm_stash_.mean = activation({rows});
  if (recompute_ == Recompute::Full) {
    // One stash shared by all blocks: only block inputs (residuals_) survive the forward.
    stashes_.assign(1, make_block_stash(config_, *plan_, batch, seq_len, nullptr));
  } else {
    const BlockStash first = make_block_stash(config_, *plan_, batch, seq_len, nullptr);
    stashes_.push_back(first);
    for (int64_t l = 1; l < config_.n_layer; ++l)
      stashes_.push_back(make_block_stash(config_, *plan_, batch, seq_len,
                                          recompute_ == Recompute::Selective ? &first : nullptr));
  }
  scratch_ = make_block_grad_scratch(config_, *plan_, batch * seq_len);
  d_hidden_ = Tensor::empty({rows, c}, DType::F32, MemCategory::Workspace);
  // The single-process loss takes its logits scratch from here; the vocab-parallel one has
  // its own.
  logits_chunk_ = plan_->tp() > 1 ? Tensor()
                                  : Tensor::empty({rows, std::min(vocab_chunk_, config_.vocab_size)},
                                                  DType::F32, MemCategory::Workspace);
  d_residual_a_ = Tensor::empty({rows, c}, DType::F32, MemCategory::Workspace);
  d_residual_b_ = Tensor::empty({rows, c}, DType::F32, MemCategory::Workspace);
}

void Transformer::check_inputs(const int32_t* tokens, const int32_t* targets, int64_t batch,
                               int64_t seq_len) const {
  if (batch <= 0 || seq_len <= 0) throw_error("batch ", batch, " x sequence ", seq_len, " is empty");
  if (seq_len > config_.max_seq_len)
    throw_error("sequence length ", seq_len, " exceeds the model's max_seq_len ", config_.max_seq_len);
  for (int64_t i = 0; i < batch * seq_len; ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size)
      throw_error("token id ", tokens[i], " at position ", i, " is outside the vocabulary [0, ",
                  config_.vocab_size, ")");
    if (targets && targets[i] >= config_.vocab_size)
      throw_error("target id ", targets[i], " at position ", i, " is outside the vocabulary [0, ",
                  config_.vocab_size, ")");
  }
}

EmbeddingArgs Transformer::embedding_args() const {
  EmbeddingArgs args;
  args.tokens = tokens_.data();
  args.token_table = &token_embedding;
  args.position_table = has_position_embedding() ? &position_embedding : nullptr;
  args.batch = batch_;
  args.seq_len = seq_len_;
  args.dim = config_.n_embd;
  args.vocab = config_.vocab_size;
  return args;
}

template <typename Run>
void Transformer::with_partial_grads(const ParameterList& params, Run run) {
  if (params.empty()) {
    run();
    return;
  }
  std::vector<Tensor> grads;
  for (Parameter* p : params) {
    grads.push_back(p->grad);
    p->grad = Tensor::zeros(p->grad.shape(), DType::F32, MemCategory::Workspace);
  }
  run();
  plan_->sum_partial_grads(params);
  for (size_t i = 0; i < params.size(); ++i) {
    cpu::add_into(grads[i].f32(), params[i]->grad.f32(), grads[i].numel());
    params[i]->grad = grads[i];
  }
}

void Transformer::forward_hidden(const int32_t* tokens, int64_t batch, int64_t seq_len) {
  ensure_activations(batch, seq_len);
  const int64_t rows = plan_->local_rows(batch * seq_len), c = config_.n_embd;
  tokens_.assign(tokens, tokens + batch * seq_len);
  fire(unit_hooks_.before_forward, 0);
  float* residual = residuals_.f32();
  plan_->embed(residual, embedding_args());
  if (bf16_activations_) cpu::round_to_bf16_inplace(residual, rows * c);
  const bool shared = recompute_ == Recompute::Full;
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    BlockStash& stash = stashes_[shared ? 0 : static_cast<size_t>(l)];
    fire(unit_hooks_.before_forward, l + 1);
    blocks[static_cast<size_t>(l)]->forward(residual + (l + 1) * rows * c, residual + l * rows * c,
                                            stash, batch, seq_len);
    fire(unit_hooks_.after_forward, l + 1);
  }
  final_norm->forward(final_norm_out_.f32(), final_norm_stash_,
                      residual + config_.n_layer * rows * c, rows);
  if (bf16_activations_) cpu::round_to_bf16_inplace(final_norm_out_.f32(), rows * c);
}

double Transformer::forward(const int32_t* tokens, const int32_t* targets, int64_t batch,
                            int64_t seq_len, const ForwardOptions& options) {
  check_inputs(tokens, targets, batch, seq_len);
  forward_hidden(tokens, batch, seq_len);
  // The fused loss writes the head's gradient, so with compute_grad the root's backward
  // begins here.
  if (options.compute_grad) fire(unit_hooks_.before_backward, 0);
  const Parameter& head = output_weight();
  cpu::CrossEntropyArgs args{};  // rows and vocab are whole counts; hidden and head this rank's
  args.hidden = final_norm_out_.f32();
  args.weight = head.value.f32();
  args.targets = targets;
  args.rows = batch * seq_len;
  args.dim = config_.n_embd;
  args.vocab = config_.vocab_size;
  args.vocab_chunk = vocab_chunk_;
  args.grad_scale = options.grad_scale;
  args.d_hidden = options.compute_grad ? d_hidden_.f32() : nullptr;
  args.d_weight = options.compute_grad ? head.grad.f32() : nullptr;
  args.workspace = logits_chunk_.defined() ? logits_chunk_.f32() : nullptr;
  grad_ready_ = options.compute_grad;
  const double loss = plan_->head_loss(args);
  if (!options.compute_grad) fire(unit_hooks_.after_forward, 0);
  return loss;
}

void Transformer::backward() {
  if (!grad_ready_) throw_error("backward() needs a forward() with compute_grad first");
  grad_ready_ = false;
  const int64_t rows = plan_->local_rows(batch_ * seq_len_), c = config_.n_embd;
  const bool sequence_parallel = plan_->sequence_parallel() && plan_->tp() > 1;
  float* residual = residuals_.f32();
  float* d_out = d_residual_a_.f32();
  float* d_in = d_residual_b_.f32();
  std::memset(d_out, 0, static_cast<size_t>(rows * c) * sizeof(float));
  ParameterList final_norm_params;
  if (sequence_parallel) final_norm->collect(final_norm_params);
  with_partial_grads(final_norm_params, [&] {
    final_norm->backward(d_out, d_hidden_.f32(), residual + config_.n_layer * rows * c,
                         final_norm_stash_, rows);
  });
  {
    ParameterList head;
    if (!config_.tied_embeddings) head.push_back(&lm_head);
    final_norm->collect(head);
    grads_ready(head);
  }
  const bool shared = recompute_ == Recompute::Full;
  for (int64_t l = config_.n_layer - 1; l >= 0; --l) {
    BlockStash& stash = stashes_[shared ? 0 : static_cast<size_t>(l)];
    fire(unit_hooks_.before_backward, l + 1);
    TransformerBlock& block = *blocks[static_cast<size_t>(l)];
    with_partial_grads(block.partial_grads(), [&] {
      block.backward(d_in, d_out, residual + l * rows * c, stash, scratch_, recompute_, batch_,
                     seq_len_);
    });
    grads_ready(block_parameters_[static_cast<size_t>(l)]);
    fire(unit_hooks_.after_backward, l + 1);
    std::swap(d_in, d_out);
  }
  // Under sequence parallelism the position table meets this rank's rows only.
  ParameterList position_params;
  if (sequence_parallel && has_position_embedding()) position_params.push_back(&position_embedding);
  with_partial_grads(position_params, [&] { plan_->embed_backward(d_out, embedding_args()); });
  ParameterList embeddings{&token_embedding};
  if (has_position_embedding()) embeddings.push_back(&position_embedding);
  grads_ready(embeddings);
  fire(unit_hooks_.after_backward, 0);
}

std::vector<float> Transformer::last_logits(const int32_t* tokens, int64_t batch, int64_t seq_len) {
  check_inputs(tokens, nullptr, batch, seq_len);
  forward_hidden(tokens, batch, seq_len);
  const int64_t v = config_.vocab_size;
  std::vector<float> logits(static_cast<size_t>(batch * v));
  plan_->last_position_logits(logits.data(), final_norm_out_.f32(), output_weight().value.f32(),
                              batch, seq_len, config_.n_embd, v);
  fire(unit_hooks_.after_forward, 0);
  return logits;
}

}  // namespace loom
