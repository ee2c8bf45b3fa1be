#include "loom/model/fp8_linear.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "loom/core/error.hpp"
#include "loom/kernels/ops.hpp"

namespace loom {

float Fp8TensorScaling::history_amax() const {
  float amax = 0.0f;
  for (float a : history) amax = std::max(amax, a);
  return amax;
}

Fp8Linear::Fp8Linear(std::shared_ptr<Fp8Context> context) : context_(std::move(context)) {
  for (Fp8TensorScaling* s : {&input, &weight, &grad_output})
    s->history.assign(static_cast<size_t>(context_->config.amax_history), 0.0f);
}

Fp8QuantizeTally& fp8_quantize_tally() {
  static Fp8QuantizeTally tally;
  return tally;
}

Tensor Fp8Linear::quantize(const float* x, int64_t rows, int64_t cols, int64_t stride,
                           Fp8TensorScaling& scaling, cpu::Fp8Format format, int64_t tile_rows,
                           int64_t tile_cols) {
  Fp8Context& ctx = *context_;
  Tensor q = Tensor::empty({rows, cols}, DType::F32, MemCategory::Workspace);
  float amax = 0.0f;
  Fp8QuantizeTally& tally = fp8_quantize_tally();
  if (ctx.config.recipe == Fp8Recipe::Blockwise) {
    (tile_rows == 1   ? tally.row_tiles
     : tile_cols == 1 ? tally.column_tiles
                      : tally.blocks) += rows * cols;
    // 1 x 128 tiles never span rows, and 128 x 1 tiles never span sequences, so a replica's
    // rows are quantised as one process would; weights are the same on every replica. Nothing
    // to reduce.
    const int64_t span =
        tile_cols == 1 && ctx.config.sequence_rows > 0 ? ctx.config.sequence_rows : rows;
    for (int64_t r0 = 0; r0 < rows; r0 += span) {
      const float part = cpu::quantize_dequantize_tiles(
          q.f32() + r0 * cols, cols, x + r0 * stride, stride, std::min(span, rows - r0), cols,
          tile_rows, tile_cols, format, ctx.config.margin);
      amax = std::isnan(part) || std::isnan(amax) ? NAN : std::max(amax, part);
    }
  } else {
    tally.tensor += rows * cols;
    for (int64_t r = 0; r < rows; ++r) {
      const float row_amax = cpu::abs_max(x + r * stride, cols);
      amax = std::isnan(row_amax) ? row_amax : std::max(amax, row_amax);
    }
    const float history = scaling.history_amax();
    const bool use_current = ctx.config.recipe == Fp8Recipe::Current || history == 0.0f;
    // The amax one process would see: the max over the replicas' rows.
    if (ctx.in_step && ctx.reduce_max && use_current) ctx.reduce_max(std::span<float>(&amax, 1));
    const float scale = cpu::fp8_scale(use_current ? amax : history, format, ctx.config.margin);
    cpu::quantize_dequantize(q.f32(), cols, x, stride, rows, cols, scale, format);
  }
  if (ctx.in_step) scaling.step_amax = std::isnan(amax) ? amax : std::max(scaling.step_amax, amax);
  return q;
}

namespace {
float nan_max(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
}  // namespace

ops::Fp8Codes Fp8Linear::quantize_on_device(const Tensor& x, int64_t col, int64_t cols,
                                            Fp8TensorScaling& scaling, int slot,
                                            cpu::Fp8Format format, bool transposed) {
  Fp8Context& ctx = *context_;
  LOOM_CHECK(ctx.config.recipe != Fp8Recipe::Blockwise,
             "Fp8Linear: blockwise operands are quantised per tile (quantize_tiles_on_device)");
  const float history = scaling.history_amax();
  const bool use_current = ctx.config.recipe == Fp8Recipe::Current || history == 0.0f;
  if (!use_current) {
    // Delayed, with a history: the scale is known before x is read, so the step's amax comes
    // from the codes pass itself (on an H100 the separate amax pass was a sixth of llama-1b's
    // FP8 step).
    const Tensor pair =
        ctx.in_step && ctx.step_scale_pairs.defined()
            ? ctx.step_scale_pairs.slice_as(2 * (3 * index + slot), {2})  // the same scale
            : ops::fp8_scale_pair(cpu::fp8_scale(history, format, ctx.config.margin));
    if (!ctx.in_step) return ops::fp8_quantize(x, col, cols, pair, format, transposed);
    return ops::fp8_quantize(x, col, cols, pair, format, transposed, &device_step_amax(),
                             3 * index + slot);
  }
  const Tensor amax = ops::fp8_amax(x, col, cols);
  Tensor pair;
  if (ctx.in_step && ctx.reduce_max) {
    // The amax one process would see, reduced over the replicas on the host.
    float reduced = amax.to(Device::CPU, MemCategory::Workspace).f32()[0];
    ctx.reduce_max(std::span<float>(&reduced, 1));
    pair = ops::fp8_scale_pair(cpu::fp8_scale(reduced, format, ctx.config.margin));
    scaling.step_amax = nan_max(scaling.step_amax, reduced);
  } else {
    pair = ops::fp8_scale_pair(amax, format, ctx.config.margin);
  }
  if (ctx.in_step) ops::fp8_max_into(device_step_amax(), 3 * index + slot, amax);
  return ops::fp8_quantize(x, col, cols, pair, format, transposed);
}

const Tensor& Fp8Linear::device_step_amax() {
  Fp8Context& ctx = *context_;
  if (!ctx.device_step_amax.defined())
    ctx.device_step_amax = Tensor::zeros({3 * std::max<int64_t>(ctx.layer_count, index + 1)},
                                         DType::F32, MemCategory::Workspace, Device::CUDA);
  return ctx.device_step_amax;
}

ops::Fp8Codes Fp8Linear::quantize_tiles_on_device(const Tensor& x, int64_t col, int64_t cols,
                                                  int slot, cpu::Fp8Format format, bool along_rows,
                                                  bool down_columns) {
  const Fp8Context& ctx = *context_;
  // 128 x 1 tiles stop at each sequence's end: on the device sequences span whole tiles
  // (train.seq_len a multiple of 128, checked before the run), so plain 128-row tiles do.
  LOOM_CHECK(!down_columns || ctx.config.sequence_rows % kFp8TileSize == 0,
             "blockwise FP8 on CUDA: sequences of ", ctx.config.sequence_rows,
             " tokens, not a multiple of 128");
  if (!ctx.in_step)
    return ops::fp8_quantize_tiles(x, col, cols, format, ctx.config.margin, along_rows,
                                   down_columns);
  return ops::fp8_quantize_tiles(x, col, cols, format, ctx.config.margin, along_rows, down_columns,
                                 &device_step_amax(), 3 * index + slot);
}

const ops::Fp8Codes& Fp8Linear::device_weight_codes(const Tensor& weight_value, int64_t in) {
  const Fp8Context& ctx = *context_;
  const bool kept = ctx.in_step && weight_codes_step_ == ctx.step_serial &&
                    weight_codes_.rows == weight_value.size(0) && weight_codes_.cols == in;
  if (!kept) {
    // Inside a step the transposed copy is made at once: the backward's d_input product takes it.
    if (ctx.config.recipe == Fp8Recipe::Blockwise) {
      LOOM_CHECK(weight_value.size(1) == in, "Fp8Linear: a weight ", weight_value.size(1),
                 " wide for ", in, " inputs");
      weight_codes_ = ctx.in_step ? ops::fp8_quantize_blocks(weight_value, cpu::Fp8Format::E4M3,
                                                             ctx.config.margin, true,
                                                             &device_step_amax(), 3 * index + 1)
                                  : ops::fp8_quantize_blocks(weight_value, cpu::Fp8Format::E4M3,
                                                             ctx.config.margin, false);
    } else {
      weight_codes_ =
          quantize_on_device(weight_value, 0, in, weight, 1, cpu::Fp8Format::E4M3, ctx.in_step);
    }
    weight_codes_step_ = ctx.in_step ? ctx.step_serial : -1;
  }
  return weight_codes_;
}

void Fp8Linear::release_step_cache() {
  weight_codes_ = ops::Fp8Codes{};
  weight_codes_step_ = -1;
  held_gradient_.reset();
}

void Fp8Linear::forward_on_device(const Tensor& out, int64_t out_col, const Tensor& input_value,
                                  const Tensor& weight_value, const Tensor* bias) {
  const int64_t in = input_value.size(1);
  const bool blockwise = context_->config.recipe == Fp8Recipe::Blockwise;
  // cuBLASLt's FP8 kernels take row counts in multiples of 16 (128 for blockwise tiles);
  // training's (tokens per micro-batch) are checked before the run, but sampling's grow one
  // token at a time. Those products run in bf16, outside any step (nothing is recorded).
  const int64_t multiple = blockwise ? kFp8TileSize : 16, rows = input_value.size(0);
  if (rows % multiple != 0 || rows == 0) {
    if (!context_->in_step) {
      if (rows > 0) ops::linear_forward(out, out_col, input_value, weight_value, bias);
      return;
    }
    // Inside a step (a mixture-of-experts expert's rows: any count, none included): the rows
    // padded with zero rows to the multiple, which move no amax and add nothing to a weight
    // gradient. An expert without rows still quantises, so every rank of its group makes the
    // same reductions in the same order.
    const int64_t padded = std::max(multiple, (rows + multiple - 1) / multiple * multiple);
    const int64_t out_features = weight_value.size(0);
    const Tensor x =
        Tensor::zeros({padded, in}, input_value.dtype(), MemCategory::Workspace, Device::CUDA);
    if (rows > 0) x.narrow_rows(0, rows).copy_from(input_value);
    const Tensor y =
        Tensor::empty({padded, out_features}, out.dtype(), MemCategory::Workspace, Device::CUDA);
    forward_on_device(y, 0, x, weight_value, bias);
    if (rows > 0) ops::copy_columns(out, out_col, y.narrow_rows(0, rows), 0, out_features);
    return;
  }
  const ops::Fp8Codes x =
      blockwise ? quantize_tiles_on_device(input_value, 0, in, 0, cpu::Fp8Format::E4M3, true, false)
                : quantize_on_device(input_value, 0, in, input, 0, cpu::Fp8Format::E4M3, false);
  const ops::Fp8Codes& w = device_weight_codes(weight_value, in);
  ops::fp8_gemm(out, out_col, 0.0f, x, false, w, false);  // out = x @ w^T
  // Added after the product's bf16 rounding: two roundings where the CPU makes one (cuBLASLt's
  // bias epilogue for FP8 would make it one; not used until a GPU has shown it works).
  if (bias) ops::add_bias_columns(out, out_col, *bias);
}

void Fp8Linear::backward_on_device(const Tensor& d_input, bool accumulate_input,
                                   const Tensor& d_weight, const Tensor& d_bias,
                                   const Tensor& d_out, int64_t d_out_col,
                                   const Tensor& input_value, const Tensor& weight_value, Half half,
                                   const HeldGradient* held) {
  const int64_t in = weight_value.size(1), out_features = weight_value.size(0);
  const bool blockwise = context_->config.recipe == Fp8Recipe::Blockwise;
  const int64_t multiple = blockwise ? kFp8TileSize : 16, rows = d_out.size(0);
  if (rows % multiple != 0 || rows == 0) {
    // As forward_on_device: zero rows up to the multiple (an expert's rows).
    const int64_t padded = std::max(multiple, (rows + multiple - 1) / multiple * multiple);
    auto zeros = [&](int64_t cols, DType dtype) {
      return Tensor::zeros({padded, cols}, dtype, MemCategory::Workspace, Device::CUDA);
    };
    const Tensor g = zeros(out_features, d_out.dtype());
    if (rows > 0) ops::copy_columns(g.narrow_rows(0, rows), 0, d_out, d_out_col, out_features);
    Tensor x, dx;
    if (d_weight.defined()) {
      x = zeros(in, input_value.dtype());
      if (rows > 0) x.narrow_rows(0, rows).copy_from(input_value);
    }
    if (d_input.defined()) dx = zeros(in, d_input.dtype());
    // (The padded copy is this call's own: nothing is held for, or taken from, another half.)
    backward_on_device(dx, false, d_weight, Tensor(), g, 0, x, weight_value, Half::Whole, nullptr);
    if (rows > 0 && d_input.defined()) {
      if (accumulate_input)
        ops::add_into(d_input, dx.narrow_rows(0, rows));
      else
        d_input.copy_from(dx.narrow_rows(0, rows));
    }
    if (rows > 0 && d_bias.defined()) ops::bias_grad_columns(d_bias, d_out, d_out_col);
    return;
  }
  // Blockwise: the gradient's 1 x 128 tiles for d_input and its 128 x 1 tiles (transposed) for
  // d_weight, whose inner dimension is the tokens.
  // Per tensor, an input half quantises with the transpose its weight half will take.
  const ops::Fp8Codes g = blockwise
                              ? quantize_tiles_on_device(d_out, d_out_col, out_features, 2,
                                                         context_->config.gradient_format(),
                                                         d_input.defined(), d_weight.defined())
                          : held ? held->codes
                                 : quantize_on_device(d_out, d_out_col, out_features, grad_output,
                                                      2, context_->config.gradient_format(),
                                                      d_weight.defined() || half == Half::Input);
  if (half == Half::Input && !blockwise)
    held_gradient_ = HeldGradient{d_out, d_out_col, Tensor(), g};
  if (d_input.defined()) {
    // The step's weight codes (made by this micro-batch's forward or an earlier one), or, outside
    // a step, fresh ones with their transpose.
    const ops::Fp8Codes* w = &device_weight_codes(weight_value, in);
    ops::Fp8Codes fresh;
    if (!w->codes_t.defined()) {
      fresh = blockwise
                  ? ops::fp8_quantize_blocks(weight_value, cpu::Fp8Format::E4M3,
                                             context_->config.margin, true)
                  : quantize_on_device(weight_value, 0, in, weight, 1, cpu::Fp8Format::E4M3, true);
      w = &fresh;
    }
    // d_input [rows, in] (+)= g [rows, out] @ (w^T [in, out])^T
    ops::fp8_gemm(d_input, 0, accumulate_input ? 1.0f : 0.0f, g, false, *w, true);
  }
  if (d_weight.defined()) {
    const ops::Fp8Codes x =
        blockwise
            ? quantize_tiles_on_device(input_value, 0, in, 0, cpu::Fp8Format::E4M3, false, true)
            : quantize_on_device(input_value, 0, in, input, 0, cpu::Fp8Format::E4M3, true);
    // d_weight [out, in] += g^T [out, rows] @ (x^T [in, rows])^T
    ops::fp8_gemm(d_weight, 0, 1.0f, g, true, x, true);
  }
  // From the unquantised gradient, as on the CPU.
  if (d_bias.defined()) ops::bias_grad_columns(d_bias, d_out, d_out_col);
}

void Fp8Linear::forward(const Tensor& out, int64_t out_col, const Tensor& input,
                        const Tensor& weight_value, const Tensor* bias) {
  if (input.device() == Device::CUDA)
    return forward_on_device(out, out_col, input, weight_value, bias);
  LOOM_CHECK(input.dtype() == DType::F32,
             "FP8 linear layers on the CPU are emulated in f32 storage (train.precision = \"fp8\" "
             "keeps f32 activations there)");
  const int64_t rows = input.size(0), in = input.size(1), out_features = weight_value.size(0);
  // Without rows (an expert no token chose) the operands are still quantised: every rank of the
  // layer's group makes the same amax reductions.
  const Tensor x = quantize(input.f32(), rows, in, in, this->input, cpu::Fp8Format::E4M3, 1);
  const Tensor w = quantize(weight_value.f32(), out_features, in, in, weight, cpu::Fp8Format::E4M3,
                            kFp8TileSize);
  if (rows > 0) ops::linear_forward(out, out_col, x, w, bias);
}

bool Fp8Linear::HeldGradient::matches(const Tensor& g, int64_t g_col) const {
  return g.raw() == d_out.raw() && g.shape() == d_out.shape() && g.dtype() == d_out.dtype() &&
         g_col == col;
}

void Fp8Linear::backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                         const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col,
                         const Tensor& input_value, const Tensor& weight_value) {
  backward_part(d_input, accumulate_input, d_weight, d_bias, d_out, d_out_col, input_value,
                weight_value, Half::Whole);
}

void Fp8Linear::backward_input_half(const Tensor& d_input, bool accumulate_input,
                                    const Tensor& d_out, int64_t d_out_col,
                                    const Tensor& weight_value) {
  backward_part(d_input, accumulate_input, Tensor(), Tensor(), d_out, d_out_col, Tensor(),
                weight_value, Half::Input);
}

void Fp8Linear::backward_weight_half(const Tensor& d_weight, const Tensor& d_bias,
                                     const Tensor& d_out, int64_t d_out_col,
                                     const Tensor& input_value, const Tensor& weight_value) {
  backward_part(Tensor(), false, d_weight, d_bias, d_out, d_out_col, input_value, weight_value,
                Half::Weight);
}

void Fp8Linear::backward_part(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                              const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col,
                              const Tensor& input_value, const Tensor& weight_value, Half half) {
  // What an input half kept serves the weight half of the same gradient that follows it, and
  // nothing else: every call takes it off the layer.
  std::optional<HeldGradient> held = std::move(held_gradient_);
  held_gradient_.reset();
  if (held && (half != Half::Weight || !held->matches(d_out, d_out_col))) held.reset();
  if (d_out.device() == Device::CUDA)
    return backward_on_device(d_input, accumulate_input, d_weight, d_bias, d_out, d_out_col,
                              input_value, weight_value, half, held ? &*held : nullptr);
  // Either half may be asked for alone (tensor-parallel layers overlap a collective between
  // them): the input is read only for d_weight, the weight only for d_input.
  const int64_t rows = d_out.size(0), in = weight_value.size(1),
                out_features = weight_value.size(0);
  const float* g = d_out.f32() + d_out_col;
  const cpu::Fp8Format g_format = context_->config.gradient_format();
  const bool blockwise = context_->config.recipe == Fp8Recipe::Blockwise;
  Tensor dq;  // 1 x 128 tiles (blockwise), or the tensor's one scale: then d_weight's operand too
  if (d_input.defined()) {
    // The same quantised weight as the forward: the scales have not moved within the step.
    dq = quantize(g, rows, out_features, d_out.size(1), grad_output, g_format, 1);
    const Tensor w = quantize(weight_value.f32(), out_features, in, in, weight,
                              cpu::Fp8Format::E4M3, kFp8TileSize);
    if (rows > 0) ops::linear_input_grad(d_input, accumulate_input, dq, 0, w);
    if (half == Half::Input && !blockwise) held_gradient_ = HeldGradient{d_out, d_out_col, dq, {}};
  }
  if (held) dq = held->dequantised;  // (only per-tensor recipes hold one)
  if (d_weight.defined()) {
    // Blockwise: d_weight, a sum over tokens, from 128 x 1 tiles of the gradient and the input
    // (the GEMM's inner dimension, as a GPU's block-scaled kernels take it); per-tensor scales
    // quantise every element alike, in whatever tiles.
    const int64_t tile_rows = blockwise ? kFp8TileSize : 1,
                  tile_cols = blockwise ? 1 : kFp8TileSize;
    const Tensor dq_t = dq.defined() && !blockwise
                            ? dq
                            : quantize(g, rows, out_features, d_out.size(1), grad_output, g_format,
                                       tile_rows, tile_cols);
    const Tensor x_t = quantize(input_value.f32(), rows, in, in, input, cpu::Fp8Format::E4M3,
                                tile_rows, tile_cols);
    // (the weight operand is only shape-checked: d_input is not asked for)
    if (rows > 0)
      ops::linear_backward(Tensor(), false, d_weight, Tensor(), dq_t, 0, x_t, weight_value);
  }
  if (d_bias.defined() && rows > 0) {
    Tensor g_high = Tensor::empty({rows, out_features}, DType::F32, MemCategory::Workspace);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(g + r * d_out.size(1), out_features, g_high.f32() + r * out_features);
    ops::bias_grad(d_bias, g_high);
  }
}

Fp8Training::Fp8Training(std::vector<Fp8LayerGroup> groups, int64_t model_layers)
    : groups_(std::move(groups)), model_layers_(model_layers) {
  LOOM_CHECK(!groups_.empty(), "Fp8Training: no layer group");
  for (Fp8LayerGroup& g : groups_) {
    LOOM_CHECK(g.context, "Fp8Training: a group without a context");
    LOOM_CHECK(g.slots.size() == g.layers.size(), "Fp8Training: ", g.slots.size(), " slots for ",
               g.layers.size(), " layers");
    for (int64_t slot : g.slots)
      LOOM_CHECK(slot >= 0 && slot < model_layers_, "Fp8Training: slot ", slot, " of ",
                 model_layers_);
    g.context->layer_count = static_cast<int64_t>(g.layers.size());
    for (size_t i = 0; i < g.layers.size(); ++i) g.layers[i]->index = static_cast<int64_t>(i);
  }
}

namespace {
std::vector<int64_t> first_slots(size_t n) {
  std::vector<int64_t> slots(n);
  for (size_t i = 0; i < n; ++i) slots[i] = static_cast<int64_t>(i);
  return slots;
}
}  // namespace

Fp8Training::Fp8Training(std::shared_ptr<Fp8Context> context, std::vector<Fp8Linear*> layers)
    : Fp8Training({Fp8LayerGroup{std::move(context), layers, first_slots(layers.size())}},
                  static_cast<int64_t>(layers.size())) {}

void Fp8Training::begin_step() {
  for (Fp8LayerGroup& g : groups_) begin_group_step(g);
}

void Fp8Training::begin_group_step(Fp8LayerGroup& group) {
  Fp8Context& context = *group.context;
  for (Fp8Linear* layer : group.layers)
    for (Fp8TensorScaling* s : {&layer->input, &layer->weight, &layer->grad_output})
      s->step_amax = 0.0f;
  if (context.device_step_amax.defined()) context.device_step_amax.zero_();
  ++context.step_serial;
  context.in_step = true;
  // The step's delayed scales, in one upload (Fp8Context::step_scale_pairs): each operand's from
  // its history, as quantize_on_device computes it (an operand without one takes the current
  // scale there and never reads its pair).
  context.step_scale_pairs = Tensor();
  const char* per_call = std::getenv("LOOM_FP8_SCALE_PER_CALL");
  if (context.device_step_amax.defined() && context.config.recipe == Fp8Recipe::Delayed &&
      !(per_call && std::string(per_call) == "1")) {
    std::vector<float> scales;
    for (const Fp8Linear* layer : group.layers) {
      int slot = 0;
      for (const Fp8TensorScaling* s : {&layer->input, &layer->weight, &layer->grad_output}) {
        const cpu::Fp8Format format =
            slot++ == 2 ? context.config.gradient_format() : cpu::Fp8Format::E4M3;
        const float history = s->history_amax();
        scales.push_back(history > 0.0f ? cpu::fp8_scale(history, format, context.config.margin)
                                        : 1.0f);
      }
    }
    context.step_scale_pairs = ops::fp8_scale_pairs(scales);
  }
}

void Fp8Training::finish_step(bool keep) {
  for (Fp8LayerGroup& group : groups_) {
    Fp8Context& context = *group.context;
    context.in_step = false;
    for (Fp8Linear* layer : group.layers) layer->release_step_cache();
    // The device's step amaxes, in one copy (CUDA only).
    std::vector<float> device;
    if (context.device_step_amax.defined()) {
      const Tensor host = context.device_step_amax.to(Device::CPU, MemCategory::Workspace);
      device.assign(host.f32(), host.f32() + host.numel());
    }
    std::vector<float> amaxes;
    size_t slot = 0;
    for (Fp8Linear* layer : group.layers)
      for (Fp8TensorScaling* s : {&layer->input, &layer->weight, &layer->grad_output}) {
        const float on_device = slot < device.size() ? device[slot] : 0.0f;
        amaxes.push_back(nan_max(s->step_amax, on_device));
        ++slot;
      }
    // Every rank of the group calls this, with its layers (the same count on each).
    if (context.reduce_max && !amaxes.empty()) context.reduce_max(amaxes);
    if (!keep) continue;
    size_t k = 0;
    for (Fp8Linear* layer : group.layers)
      for (Fp8TensorScaling* s : {&layer->input, &layer->weight, &layer->grad_output}) {
        const float amax = amaxes[k++];
        if (!std::isfinite(amax) || s->history.empty())
          continue;  // a bad amax never enters the history
        std::rotate(s->history.rbegin(), s->history.rbegin() + 1, s->history.rend());
        s->history.front() = amax;
      }
  }
}

std::vector<float> Fp8Training::amax_history() const {
  const size_t per = static_cast<size_t>(config().amax_history);
  std::vector<float> out(static_cast<size_t>(model_layers_) * 3 * per, 0.0f);
  for (const Fp8LayerGroup& g : groups_)
    for (size_t i = 0; i < g.layers.size(); ++i) {
      auto at =
          out.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(g.slots[i]) * 3 * per);
      for (const Fp8TensorScaling* s :
           {&g.layers[i]->input, &g.layers[i]->weight, &g.layers[i]->grad_output})
        at = std::copy(s->history.begin(), s->history.end(), at);
    }
  return out;
}

void Fp8Training::set_amax_history(const std::vector<float>& values) {
  const size_t per = static_cast<size_t>(config().amax_history);
  const size_t layers = static_cast<size_t>(model_layers_);
  if (values.size() != layers * 3 * per)
    throw_error("FP8 amax history: the checkpoint holds ", values.size(),
                " values, this model needs ", layers,
                " layers x 3 operands x train.fp8_amax_history = ", per, " = ", layers * 3 * per,
                ": set train.fp8_amax_history back to the checkpoint's");
  for (const Fp8LayerGroup& g : groups_)
    for (size_t i = 0; i < g.layers.size(); ++i) {
      size_t k = static_cast<size_t>(g.slots[i]) * 3 * per;
      for (Fp8TensorScaling* s :
           {&g.layers[i]->input, &g.layers[i]->weight, &g.layers[i]->grad_output})
        for (float& h : s->history) h = values[k++];
    }
}

}  // namespace loom
