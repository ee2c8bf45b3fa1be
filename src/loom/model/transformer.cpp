#include "loom/model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/core/error.hpp"
#include "loom/core/rng.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/linear.hpp"
#include "loom/model/parameter_specs.hpp"
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
                         std::shared_ptr<const ParallelPlan> plan, std::vector<ModelChunk> chunks)
    : config_(config),
      plan_(plan ? std::move(plan) : single_process_plan()),
      recompute_(recompute),
      vocab_chunk_(vocab_chunk),
      chunks_(chunks.empty() ? whole_model(config.n_layer) : std::move(chunks)) {
  config_.validate();
  // validate() allows squared-ReLU MLPs and latent experts on hybrids only, MTP on any model.
  if (config_.is_hybrid() || config_.mtp_layers > 0)
    throw_error(
        "model: loom's engine builds transformers of SwiGLU or GELU MLPs; a hybrid Mamba stack, a "
        "squared-ReLU "
        "MLP, latent experts and multi-token prediction are for `loom plan` only");
  if (vocab_chunk_ <= 0) throw_error("vocab_chunk: got ", vocab_chunk_, ", expected a positive count");
  holds_embedding_ = holds_head_ = false;
  for (const ModelChunk& chunk : chunks_) {
    if (chunk.first_layer < 0 || chunk.end_layer > config_.n_layer || chunk.layers() < 1)
      throw_error("model chunk of stage ", chunk.stage, " holds layers [", chunk.first_layer, ", ",
                  chunk.end_layer, "), outside the model's ", config_.n_layer, " layers or empty");
    holds_embedding_ = holds_embedding_ || chunk.first_stage();
    holds_head_ = holds_head_ || chunk.last_stage();
  }
  const bool gpt2 = config_.arch == Architecture::GPT2;
  (void)plan_->local_dims(config_);  // a tp that does not divide the heads fails here, first
  // The whole model's parameter order, which fixes each parameter's initialisation stream:
  // token and position embeddings, every block's parameters, the final norm, lm_head.
  const int64_t first_block_index = gpt2 ? 2 : 1;
  const std::string wte_name = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  if (holds_embedding_ || (holds_head_ && config_.tied_embeddings)) {
    allocate_vocab_table(token_embedding, wte_name, *plan_, config_.vocab_size, config_.n_embd);
    token_embedding.pipeline_copy = !holds_embedding_;
    add_parameter(token_embedding, 0);
  }
  if (holds_embedding_ && gpt2) {
    allocate_parameter(position_embedding, "transformer.wpe.weight", {config_.max_seq_len, config_.n_embd}, true);
    add_parameter(position_embedding, 1);
  }
  if (!gpt2)
    rope_ = std::make_shared<ops::Rope>(
        config_.head_dim(), config_.max_seq_len, config_.rope_theta,
        cpu::RopeScaling{config_.rope_scaling_factor, config_.rope_low_freq_factor, config_.rope_high_freq_factor,
                         config_.rope_original_max_positions});
  // Block l's parameters start at first_block_index + the whole parameter counts of the blocks
  // before it (which differ when dense and mixture-of-experts layers mix).
  std::vector<int64_t> block_start(static_cast<size_t>(config_.n_layer + 1), first_block_index);
  for (const ParameterSpec& spec : parameter_specs(config_))
    if (spec.unit > 0)
      for (int64_t later = spec.unit; later <= config_.n_layer; ++later) ++block_start[static_cast<size_t>(later)];
  for (const ModelChunk& chunk : chunks_) {
    chunk_first_block_.push_back(static_cast<int64_t>(blocks.size()));
    for (int64_t l = chunk.first_layer; l < chunk.end_layer; ++l) {
      const std::string prefix = (gpt2 ? "transformer.h." : "model.layers.") + std::to_string(l);
      blocks.push_back(std::make_unique<TransformerBlock>(config_, *plan_, prefix, rope_, l));
      blocks.back()->attention.set_layout(layout_);
      ParameterList& mine = block_parameters_.emplace_back();
      blocks.back()->collect(mine);
      if (blocks.back()->whole_parameter_count() !=
          block_start[static_cast<size_t>(l + 1)] - block_start[static_cast<size_t>(l)])
        throw_error("layer ", l, ": the block has ", blocks.back()->whole_parameter_count(),
                    " parameters, its specification ", block_start[static_cast<size_t>(l + 1)] - block_start[static_cast<size_t>(l)]);
      const std::vector<int64_t> slots = blocks.back()->parameter_slots();
      for (size_t k = 0; k < mine.size(); ++k) add_parameter(*mine[k], block_start[static_cast<size_t>(l)] + slots[k]);
    }
  }
  if (holds_head_) {
    final_norm = std::make_unique<Norm>(gpt2 ? NormKind::LayerNorm : NormKind::RMSNorm,
                                        gpt2 ? "transformer.ln_f" : "model.norm", config_.n_embd,
                                        static_cast<float>(config_.norm_eps));
    ParameterList norm;
    final_norm->collect(norm);
    int64_t index = block_start.back();
    for (Parameter* p : norm) add_parameter(*p, index++);
    if (!config_.tied_embeddings) {
      allocate_vocab_table(lm_head, "lm_head.weight", *plan_, config_.vocab_size, config_.n_embd);
      add_parameter(lm_head, index);
    }
  }
}

void Transformer::add_parameter(Parameter& p, int64_t init_index) {
  parameters_.push_back(&p);
  init_index_.push_back(init_index);
}

void Transformer::init_weights(uint64_t seed) {
  constexpr double kStd = 0.02;
  const double residual_std = kStd / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  auto is_residual_output = [](const std::string& name) {
    return name.find("c_proj.weight") != std::string::npos ||
           name.find("o_proj.weight") != std::string::npos ||
           name.find("down_proj.weight") != std::string::npos ||
           name.find(".w2.weight") != std::string::npos;  // a Mixtral expert's down projection
  };
  for (size_t index = 0; index < parameters_.size(); ++index) {
    Parameter& p = *parameters_[index];
    // Values are drawn on the host in f32 and copied to where the parameter lives.
    const bool in_place = p.value.device() == Device::CPU && p.value.dtype() == DType::F32;
    const Tensor host =
        in_place ? p.value : Tensor::empty(p.value.shape(), DType::F32, MemCategory::Workspace);
    const bool is_norm_weight = p.value.dim() == 1 && p.name.find("bias") == std::string::npos;
    if (p.value.dim() == 1) {
      float* v = host.f32();
      for (int64_t i = 0; i < p.value.numel(); ++i) v[i] = is_norm_weight ? 1.0f : 0.0f;
      if (!in_place) p.value.copy_from(host);
      continue;
    }
    const double std = is_residual_output(p.name) ? residual_std : kStd;
    // One stream per parameter (keyed by its index): the same values for any thread count.
    // A shard draws the whole tensor and keeps its part.
    const CounterRng rng(seed, static_cast<uint64_t>(init_index_[index]));
    Tensor full = p.placement.replicated
                      ? host
                      : Tensor::empty(p.placement.full_shape, DType::F32, MemCategory::Workspace);
    float* f = full.f32();
    // Each value is a function of (seed, parameter, index) alone, so threads change nothing
    // (drawn serially, Llama 1B's 1.2G values took about 55 s before its first step).
    const int64_t n = full.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      f[i] = static_cast<float>(std * rng.normal(static_cast<uint64_t>(i)));
    if (!p.placement.replicated)
      p.value.copy_from(take_shard(full, p.placement));
    else if (!in_place)
      p.value.copy_from(host);
  }
}

void Transformer::to_device(Device device, DType compute_dtype) {
  if (compute_dtype != DType::F32 && compute_dtype != DType::BF16)
    throw_error("model compute dtype ", dtype_name(compute_dtype), ": expected f32 or bf16");
  if (device == Device::CPU && compute_dtype != DType::F32)
    throw_error("the CPU computes in f32 and emulates bf16 by rounding (set_bf16_activations); "
                "bf16 storage is for CUDA");
  // Everything is allocated and copied before any parameter changes, so a failure (no device,
  // out of memory) leaves the model as it was.
  std::vector<Tensor> values, grads;
  for (Parameter* p : parameters_) {
    Tensor value = p->value, grad = p->grad;
    if (value.defined() && (value.device() != device || value.dtype() != compute_dtype)) {
      value = Tensor::empty(value.shape(), compute_dtype, MemCategory::Parameters, device);
      value.copy_from(p->value);
    }
    if (grad.defined() && grad.device() != device)
      grad = Tensor::zeros(grad.shape(), DType::F32, MemCategory::Gradients, device);
    values.push_back(value);
    grads.push_back(grad);
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    parameters_[i]->value = values[i];
    parameters_[i]->grad = grads[i];
  }
  format_ = {device, compute_dtype};
  // Scratch and activation sets are made again, on the device, at the next forward.
  batch_ = seq_len_ = 0;
  whole_ = ChunkActivations{};
}

void Transformer::set_bf16_activations(bool on) {
  bf16_activations_ = on;
  for (auto& block : blocks) block->set_bf16_activations(on);
}

ParameterList Transformer::parameters_in_grad_ready_order() {
  ParameterList order;
  if (holds_head_) {
    if (!config_.tied_embeddings) order.push_back(&lm_head);
    final_norm->collect(order);
  }
  for (auto it = block_parameters_.rbegin(); it != block_parameters_.rend(); ++it)
    for (Parameter* p : *it) order.push_back(p);
  if (holds_embedding_ || (holds_head_ && config_.tied_embeddings))
    order.push_back(&token_embedding);
  if (has_position_embedding()) order.push_back(&position_embedding);
  return order;
}

void Transformer::grads_ready(const ParameterList& params) {
  if (!grad_ready_hook_) return;
  for (Parameter* p : params)
    if (std::find(deferred_grads_.begin(), deferred_grads_.end(), p) == deferred_grads_.end())
      grad_ready_hook_(*p);
}

void Transformer::zero_grad() {
  for (Parameter* p : parameters_)
    if (p->grad.defined()) p->grad.zero_();
}

ParameterList Transformer::unit_parameters(int64_t unit) {
  if (!is_whole())
    throw_error("parameter units are whole-model units: a pipeline stage has none (ZeRO-3 does not "
                "compose with pipeline parallelism)");
  if (unit < 0 || unit > config_.n_layer) throw_error("unit ", unit, " is outside [0, ", config_.n_layer, "]");
  if (unit > 0) return block_parameters_[static_cast<size_t>(unit - 1)];
  ParameterList root{&token_embedding};
  if (has_position_embedding()) root.push_back(&position_embedding);
  final_norm->collect(root);
  if (!config_.tied_embeddings) root.push_back(&lm_head);
  return root;
}

// ---- activations ------------------------------------------------------------------------

void Transformer::ensure_shape(int64_t batch, int64_t seq_len) {
  if (batch == batch_ && seq_len == seq_len_) return;
  // No shape until everything is allocated: a failed allocation (out of device memory) must not
  // leave a shape whose buffers are missing. Sets made for the old shape keep their own handles
  // to the Selective shared tensors, so they stay whole.
  batch_ = seq_len_ = 0;
  full_recompute_stash_ = BlockStash{};
  selective_shared_ = BlockStash{};
  if (recompute_ == Recompute::Full)
    full_recompute_stash_ = make_block_stash(config_, *plan_, format_, batch, seq_len, nullptr,
                                             config_.moe_layer_count() < config_.n_layer);
  const int64_t rows = plan_->local_rows(batch * seq_len), c = config_.n_embd;
  scratch_ = make_block_grad_scratch(config_, *plan_, format_, batch * seq_len);
  // The single-process loss on the CPU takes its logits scratch from here; the vocab-parallel
  // one and the CUDA one have their own.
  logits_chunk_ = plan_->tp() > 1 || !holds_head_ || format_.device != Device::CPU
                      ? Tensor()
                      : Tensor::empty({rows, std::min(vocab_chunk_, config_.vocab_size)}, DType::F32,
                                      MemCategory::Workspace, format_.device);
  d_residual_ = Tensor::empty({rows, c}, format_.dtype, MemCategory::Workspace, format_.device);
  batch_ = batch;
  seq_len_ = seq_len;
}

const ModelChunk& Transformer::chunk(int64_t index) const {
  if (index < 0 || index >= static_cast<int64_t>(chunks_.size()))
    throw_error("chunk ", index, " is outside this rank's ", chunks_.size(), " chunk(s)");
  return chunks_[static_cast<size_t>(index)];
}

ChunkActivations Transformer::make_activations(int64_t chunk_index, int64_t batch,
                                               int64_t seq_len) {
  const ModelChunk& c = chunk(chunk_index);
  ensure_shape(batch, seq_len);  // the Selective shared tensors are the current shape's
  return make_chunk_activations(config_, *plan_, format_, c, recompute_, batch, seq_len,
                                selective_shared_);
}

void Transformer::fit_activations(int64_t chunk_index, ChunkActivations& a) {
  const ModelChunk& c = chunks_[static_cast<size_t>(chunk_index)];
  a.grad_ready = false;
  if (a.allocated() && a.layers() == c.layers() && a.batch == batch_ && a.seq_len == seq_len_ &&
      a.format == format_) {
    // Made for another chunk of as many layers: the last stage adds its extras on first use.
    if (c.last_stage() && !a.final_norm_out.defined())
      add_last_stage_activations(config_, *plan_, format_, batch_, seq_len_, a);
    return;
  }
  a = ChunkActivations{};  // the old set's memory goes before the new one is taken
  a = make_chunk_activations(config_, *plan_, format_, c, recompute_, batch_, seq_len_,
                             selective_shared_);
}

BlockStash& Transformer::stash_of(ChunkActivations& a, int64_t block_in_chunk) {
  return recompute_ == Recompute::Full ? full_recompute_stash_ : a.stashes[static_cast<size_t>(block_in_chunk)];
}

void Transformer::check_inputs(const int32_t* tokens, const int32_t* targets, int64_t batch,
                               int64_t seq_len) const {
  if (batch <= 0 || seq_len <= 0) throw_error("batch ", batch, " x sequence ", seq_len, " is empty");
  if (seq_len > config_.max_seq_len)
    throw_error("sequence length ", seq_len, " exceeds the model's max_seq_len ", config_.max_seq_len);
  for (int64_t i = 0; i < batch * seq_len; ++i) {
    if (tokens && (tokens[i] < 0 || tokens[i] >= config_.vocab_size))
      throw_error("token id ", tokens[i], " at position ", i, " is outside the vocabulary [0, ",
                  config_.vocab_size, ")");
    if (targets && targets[i] >= config_.vocab_size)
      throw_error("target id ", targets[i], " at position ", i, " is outside the vocabulary [0, ",
                  config_.vocab_size, ")");
  }
}

EmbeddingArgs Transformer::embedding_args(const ChunkActivations& a) const {
  EmbeddingArgs args;
  args.tokens = a.tokens.data();
  args.token_table = &token_embedding;
  args.position_table = has_position_embedding() ? &position_embedding : nullptr;
  args.positions = a.positions;
  args.batch = a.batch;
  args.seq_len = a.seq_len;
  args.dim = config_.n_embd;
  args.vocab = config_.vocab_size;
  return args;
}

// ---- forward ----------------------------------------------------------------------------

void Transformer::forward_layers(int64_t chunk_index, ChunkActivations& a, const Tensor& input) {
  const ModelChunk& chunk = chunks_[static_cast<size_t>(chunk_index)];
  if (chunk.first_stage()) {
    fire(unit_hooks_.before_forward, 0);
    plan_->embed(a.residual(0), embedding_args(a));
    if (bf16_activations_) ops::round_to_bf16_(a.residual(0));
  } else {
    a.residual(0).copy_from(input);
  }
  const int64_t first_block = chunk_first_block_[static_cast<size_t>(chunk_index)];
  for (int64_t i = 0; i < chunk.layers(); ++i) {
    const int64_t unit = chunk.first_layer + i + 1;
    fire(unit_hooks_.before_forward, unit);
    BlockStash& stash = stash_of(a, i);
    stash.moe_loss_scale = a.moe_loss_scale;
    blocks[static_cast<size_t>(first_block + i)]->forward(a.residual(i + 1), a.residual(i), stash, a.batch,
                                                          a.seq_len);
    if (config_.is_moe()) add_moe_totals(first_block + i, stash.moe);
    fire(unit_hooks_.after_forward, unit);
  }
  if (!chunk.last_stage()) return;
  final_norm->forward(a.final_norm_out, a.final_norm_stash, a.residual(chunk.layers()));
  if (bf16_activations_) ops::round_to_bf16_(a.final_norm_out);
}

void Transformer::set_document_mask(int32_t eot_token, bool restart_positions) {
  if (eot_token < -1 || eot_token >= config_.vocab_size)
    throw_error("document mask: end-of-document token ", eot_token, " is outside the vocabulary [0, ",
                config_.vocab_size, ") (-1 turns the mask off)");
  eot_token_ = eot_token;
  restart_positions_ = eot_token >= 0 && restart_positions;
}

std::vector<int32_t> Transformer::document_key_ranges(const int32_t* tokens, int64_t batch,
                                                      int64_t seq_len, int32_t eot_token) {
  std::vector<int32_t> ranges(static_cast<size_t>(2 * batch * seq_len));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t begin = 0;  // the current document's first position
    for (int64_t t = 0; t < seq_len; ++t) {
      const int64_t row = b * seq_len + t;
      ranges[static_cast<size_t>(2 * row)] = begin;
      ranges[static_cast<size_t>(2 * row + 1)] = static_cast<int32_t>(t + 1);
      if (tokens[row] == eot_token) begin = static_cast<int32_t>(t + 1);
    }
  }
  return ranges;
}

void Transformer::set_context_parallel(std::shared_ptr<ContextAttention> cp) {
  cp_split_ = cp ? cp->split() : ContextSplit{};
  cp_ = cp_split_.size > 1 ? std::move(cp) : nullptr;
  for (auto& block : blocks) block->attention.set_context_parallel(cp_);
}

void Transformer::fill_sequence_layout(ChunkActivations& a, const int32_t* tokens, int64_t batch,
                                  int64_t seq_len) const {
  a.key_ranges.clear();
  a.positions.clear();
  a.window_key_ranges.clear();
  const bool documents = eot_token_ >= 0, split = cp_split_.size > 1,
             window = config_.windowed_layer_count() > 0;
  if (!documents && !split && !window) return;
  if (documents && !tokens)
    throw_error("packed documents (document mask on end-of-document token ", eot_token_,
                ") need the tokens on every pipeline stage, to find the documents");
  // Key ranges over the whole sequences: each token's document (or all before it) up to itself.
  std::vector<int32_t> ranges;
  if (documents) {
    ranges = document_key_ranges(tokens, batch, seq_len, eot_token_);
  } else {
    ranges.resize(static_cast<size_t>(2 * batch * seq_len));
    for (int64_t row = 0; row < batch * seq_len; ++row) {
      ranges[static_cast<size_t>(2 * row)] = 0;
      ranges[static_cast<size_t>(2 * row + 1)] = static_cast<int32_t>(row % seq_len + 1);
    }
  }
  // Positions: the token's place in its sequence, or in its document when they restart. A cp
  // rank's tokens are not consecutive, so it always carries them.
  std::vector<int32_t> positions;
  if (restart_positions_ || split) {
    positions.resize(static_cast<size_t>(batch * seq_len));
    for (int64_t row = 0; row < batch * seq_len; ++row)
      positions[static_cast<size_t>(row)] =
          static_cast<int32_t>(row % seq_len) - (restart_positions_ ? ranges[static_cast<size_t>(2 * row)] : 0);
  }
  // The window: the last sliding_window keys of the row's range, itself included.
  std::vector<int32_t> windowed;
  if (window) {
    windowed = ranges;
    for (int64_t row = 0; row < batch * seq_len; ++row) {
      int32_t& begin = windowed[static_cast<size_t>(2 * row)];
      begin = std::max<int32_t>(begin,
                                static_cast<int32_t>(row % seq_len + 1 - config_.sliding_window));
    }
  }
  if (!split) {
    if (documents) a.key_ranges = std::move(ranges);  // else the global layers run plain causal
    a.positions = std::move(positions);
    a.window_key_ranges = std::move(windowed);
    return;
  }
  const int64_t local = cp_split_.local_len(seq_len);
  a.key_ranges.resize(static_cast<size_t>(2 * batch * local));
  a.positions.resize(static_cast<size_t>(batch * local));
  cp_split_.take_local(ranges.data(), a.key_ranges.data(), batch, seq_len, 2);
  cp_split_.take_local(positions.data(), a.positions.data(), batch, seq_len);
  if (window) {
    a.window_key_ranges.resize(static_cast<size_t>(2 * batch * local));
    cp_split_.take_local(windowed.data(), a.window_key_ranges.data(), batch, seq_len, 2);
  }
}

double Transformer::forward_chunk(int64_t chunk_index, ChunkActivations& a, const int32_t* tokens,
                                  const int32_t* targets, const Tensor& input, int64_t batch,
                                  int64_t seq_len, const ForwardOptions& options) {
  const ModelChunk& chunk = this->chunk(chunk_index);
  if (chunk.first_stage() && !tokens) throw_error("the first pipeline stage needs tokens");
  if (!chunk.first_stage() && !input.defined())
    throw_error("pipeline stage ", chunk.stage, " needs the previous stage's output");
  if (chunk.last_stage() && !targets) throw_error("the last pipeline stage needs targets");
  if (options.loss_sum && options.loss_sum->device() != device())
    throw_error("the loss sum is on ", device_name(options.loss_sum->device()), ", the model on ",
                device_name(device()));
  check_inputs(chunk.first_stage() ? tokens : nullptr, chunk.last_stage() ? targets : nullptr, batch, seq_len);
  if (cp_) cp_split_.check(seq_len);
  const int64_t local_len = cp_split_.local_len(seq_len);  // this cp rank's tokens per sequence
  if (!chunk.first_stage() && input.numel() != local_rows(batch, seq_len) * config_.n_embd)
    throw_error("pipeline stage ", chunk.stage, ": input ", shape_to_string(input.shape()), " for ",
                local_rows(batch, seq_len), " rows of ", config_.n_embd);
  ensure_shape(batch, local_len);
  fit_activations(chunk_index, a);
  if (chunk.first_stage()) {
    a.tokens.resize(static_cast<size_t>(batch * local_len));
    cp_split_.take_local(tokens, a.tokens.data(), batch, seq_len);
  }
  if (chunk.last_stage() && cp_) {
    local_targets_.resize(static_cast<size_t>(batch * local_len));
    cp_split_.take_local(targets, local_targets_.data(), batch, seq_len);
    targets = local_targets_.data();
  }
  fill_sequence_layout(a, tokens, batch, seq_len);
  use_layout_of(a);
  a.moe_loss_scale = options.grad_scale * static_cast<float>(local_rows(batch, seq_len));
  forward_layers(chunk_index, a, input);
  if (!chunk.last_stage()) {
    a.grad_ready = options.compute_grad;
    return 0.0;
  }
  // The fused loss writes the head's gradient, so with compute_grad the root's backward
  // begins here.
  if (options.compute_grad) fire(unit_hooks_.before_backward, 0);
  const Parameter& head = output_weight();
  ops::CrossEntropyArgs args;  // hidden and head are this rank's
  args.hidden = a.final_norm_out;
  args.weight = head.value;
  args.targets = targets;
  args.vocab_chunk = vocab_chunk_;
  args.grad_scale = options.grad_scale;
  if (options.compute_grad) {
    args.d_hidden = a.d_hidden;
    args.d_weight = head.grad;
  }
  args.workspace = logits_chunk_;
  if (options.loss_sum) args.loss_sum = options.loss_sum->slot();
  double loss = plan_->head_loss(args, batch * local_len, config_.vocab_size);
  if (options.loss_sum) {  // what the plan's head held on the host, if anything
    options.loss_sum->add(loss);
    loss = 0.0;
  }
  a.grad_ready = options.compute_grad;
  if (!options.compute_grad) fire(unit_hooks_.after_forward, 0);
  return loss;
}

double Transformer::forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq_len,
                            const ForwardOptions& options) {
  if (!is_whole()) throw_error("forward() runs the whole model; a pipeline stage runs forward_chunk()");
  // A forward without the backward of the previous one simply replaces it.
  return forward_chunk(0, whole_, tokens, targets, Tensor(), batch, seq_len, options);
}

std::vector<float> Transformer::last_logits(const int32_t* tokens, int64_t batch, int64_t seq_len) {
  if (!is_whole()) throw_error("last_logits() needs the whole model, not one pipeline stage");
  if (cp_)
    throw_error("last_logits() under context parallelism: generation runs the whole sequence on one rank; "
                "load the checkpoint into a model without cp");
  check_inputs(tokens, nullptr, batch, seq_len);
  ensure_shape(batch, seq_len);
  fit_activations(0, whole_);  // a forward awaiting its backward is replaced
  whole_.tokens.assign(tokens, tokens + batch * seq_len);
  fill_sequence_layout(whole_, tokens, batch, seq_len);
  use_layout_of(whole_);
  forward_layers(0, whole_, Tensor());
  std::vector<float> logits = plan_->last_position_logits(
      whole_.final_norm_out, output_weight().value, batch, seq_len, config_.vocab_size);
  fire(unit_hooks_.after_forward, 0);
  return logits;
}

}  // namespace loom
