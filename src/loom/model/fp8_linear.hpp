#pragma once
// FP8 training of the linear layers (issue 14), emulated on the CPU: each GEMM of a Linear takes
// its operands quantised to FP8 and dequantised again (kernels/cpu/fp8), with f32 accumulation,
// so the numerics of a recipe are those a GPU's FP8 tensor cores would see with the same scales.
// Forward: input and weight in E4M3. Backward: the output gradient in E5M2 (the "hybrid" format
// of Transformer Engine, whose range suits gradients) or E4M3, times the same quantised input and
// weight. The bias gradient is summed from the unquantised output gradient (Transformer Engine
// fuses it into the cast, from the high-precision gradient).
//
// Recipes:
//   current   scale = fp8_max / amax of the tensor now.
//   delayed   scale = fp8_max / max(amax history) / 2^margin; the history holds the amaxes of the
//             last fp8_amax_history steps (Transformer Engine's DelayedScaling, amax_compute_algo
//             "max"); each step's amax joins it after the step. A layer with no history yet (the
//             first step) takes the current amax: Transformer Engine starts at scale 1, which would
//             flush gradients of order 1 / tokens, below E5M2's 2^-16, to zero.
//   blockwise DeepSeek-V3 (arXiv 2412.19437, section 3.3.2): a scale per 1 x 128 tile of inputs and
//             output gradients and per 128 x 128 block of weights; the weight-gradient GEMM, whose
//             inner dimension is the tokens, reads the input and the output gradient quantised
//             again in 128 x 1 tiles (128 consecutive tokens of one column), as DeepSeek-V3 does
//             and as Transformer Engine's Float8BlockScaling does for its column-wise copies. Those
//             tiles stop at a sequence's end (Fp8Config::sequence_rows), so a data-parallel
//             replica's tiles are the ones one process makes.
// Every scale and amax of a layer lives in its Fp8Linear.
// On CUDA (bf16 activations and weights; every recipe, blockwise on Hopper's block-scaled
// cuBLASLt kernels with 128-multiple widths and sequences) the same recipe runs on FP8 tensor
// cores: each operand is quantised to FP8 codes on the device (the CPU's rounding,
// kernels/cuda/fp8) and cuBLASLt multiplies the codes (accumulating at the FP8 tensor cores'
// precision, promoted to f32 periodically) with the operands' dequantisation factors. The
// backward quantises the output gradient and the input again (the same scales: they do not move
// within a step) with transposed copies, so each product is the "TN" form cuBLASLt's FP8 kernels
// take; a weight's codes, with their transpose, are made at its first product of a step and
// serve the step's others (freed at finish_step). Step amaxes stay on the device until finish_step
// reads them all in one copy; only the current recipe under data parallelism reads one back per
// quantisation, to reduce it over the replicas before it becomes a scale. Products whose row count
// is not a multiple of 16 (sampling, outside any step) run in bf16. Under data parallelism the
// amaxes are reduced (max) over the replicas, as Transformer Engine does over its amax reduction
// group, so every replica uses the scale one process would.
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cpu/fp8.hpp"
#include "loom/kernels/ops.hpp"
#include "loom/model/config.hpp"

namespace loom {

enum class Fp8Recipe { Delayed, Current, Blockwise };
enum class Fp8Formats { Hybrid, E4M3 };  // gradients in E5M2 or E4M3; forward always E4M3

// Defaults are Transformer Engine's DelayedScaling (history 16 in its examples, margin 0).
inline constexpr int64_t kDefaultFp8AmaxHistory = 16;
inline constexpr int64_t kFp8TileSize = 128;  // DeepSeek-V3's tile and block edge

struct Fp8Config {
  Fp8Recipe recipe = Fp8Recipe::Delayed;
  Fp8Formats formats = Fp8Formats::Hybrid;
  int64_t amax_history = kDefaultFp8AmaxHistory;
  int margin = 0;
  // Rows (tokens) per sequence in the products' row order (the trainer's train.seq_len): the
  // blockwise recipe's 128 x 1 tiles do not cross it. 0: no boundary (a lone Linear).
  int64_t sequence_rows = 0;
  cpu::Fp8Format gradient_format() const {
    return formats == Fp8Formats::Hybrid ? cpu::Fp8Format::E5M2 : cpu::Fp8Format::E4M3;
  }
};
const char* fp8_recipe_name(Fp8Recipe recipe);
const char* fp8_formats_name(Fp8Formats formats);

// What the FP8 layers of one model share.
struct Fp8Context {
  Fp8Config config;
  // Max over the data-parallel replicas, in place (the trainer's; null in one process).
  std::function<void(std::span<float>)> reduce_max;
  // Amaxes are recorded, and current amaxes reduced, only inside a training step: evaluation
  // and sampling between steps neither change the history nor call collectives.
  bool in_step = false;
  // CUDA: every layer's step amaxes (input, weight, output gradient: slots 3 i .. 3 i + 2 of
  // layer i) in one device buffer, made at the first quantisation on the device.
  Tensor device_step_amax;
  int64_t layer_count = 0;
  // Counts begin_step calls: a step's device-side caches (each layer's weight codes) are keyed
  // by it.
  int64_t step_serial = 0;
  // CUDA, delayed scaling: the step's scale pairs of every layer's operands (pair 3 i + slot),
  // uploaded in one copy by begin_step once a step has run on the device (device_step_amax
  // exists), in place of one small host-to-device copy per quantisation (four a linear layer a
  // micro-batch). LOOM_FP8_SCALE_PER_CALL=1 keeps the copy per quantisation.
  Tensor step_scale_pairs;
};

// One operand of a linear layer's GEMMs: the amax history (newest first) and the largest amax of
// the step under way.
struct Fp8TensorScaling {
  std::vector<float> history;
  float step_amax = 0.0f;
  float history_amax() const;  // 0 when nothing was recorded yet
};

// Why the blockwise recipe cannot train `model` under tensor parallelism `tp` and context
// parallelism `cp` at `seq_len` (a train.fp8_recipe error naming the width or the chunk), or ""
// where it can. DeepSeek-V3's tiles must be the ones one process makes: a tensor-parallel slice
// that starts or ends inside a 128-wide tile, or a context-parallel chunk inside a 128-token
// tile, would cut tiles one process keeps whole (and scale them differently). The trainer
// refuses such a config; the planner marks such a layout as one the engine does not run.
std::string blockwise_tiles_cut(const ModelConfig& model, int64_t tp, int64_t cp, int64_t seq_len);

// Elements the CPU emulation has quantised in this process, by the scales' shape: one per tensor,
// per 1 x 128 tile along a row, per 128 x 1 tile down a column, per 128 x 128 block. The planner's
// count of the engine's FP8 work (plan/engine_fp8.hpp) is checked against it.
struct Fp8QuantizeTally {
  std::atomic<int64_t> tensor{0}, row_tiles{0}, column_tiles{0}, blocks{0};
  void reset() { tensor = 0, row_tiles = 0, column_tiles = 0, blocks = 0; }
};
Fp8QuantizeTally& fp8_quantize_tally();

class Fp8Linear {
 public:
  explicit Fp8Linear(std::shared_ptr<Fp8Context> context);
  // ops::linear_forward / linear_backward's contracts, on quantised operands.
  void forward(const Tensor& out, int64_t out_col, const Tensor& input, const Tensor& weight,
               const Tensor* bias);
  void backward(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col, const Tensor& input,
                const Tensor& weight);
  // backward in two calls, as tensor-parallel column layers run it (a collective between
  // them): the input gradient, then the weight and bias gradients of the same d_out. Per-tensor
  // recipes quantise the output gradient once for both, as backward does: backward_input_half
  // keeps its quantised form (on a GPU the codes and their transpose) for the
  // backward_weight_half of the same d_out that follows; any other call on the layer drops it.
  // Blockwise tiles the gradient differently for each (1 x 128, then 128 x 1): each its own.
  void backward_input_half(const Tensor& d_input, bool accumulate_input, const Tensor& d_out,
                           int64_t d_out_col, const Tensor& weight);
  void backward_weight_half(const Tensor& d_weight, const Tensor& d_bias, const Tensor& d_out,
                            int64_t d_out_col, const Tensor& input, const Tensor& weight);

  Fp8TensorScaling input, weight, grad_output;
  int64_t index = 0;  // this layer's place among its model's FP8 layers (Fp8Training sets it)
  // Frees the weight codes kept for the step, and a held output gradient
  // (Fp8Training::finish_step).
  void release_step_cache();

 private:
  enum class Half { Whole, Input, Weight };
  // The output gradient backward_input_half quantised: d_out (a view, which keeps its storage,
  // so it is matched by identity) and its quantised form, on the host or on the device.
  struct HeldGradient {
    Tensor d_out;
    int64_t col = 0;
    Tensor dequantised;
    ops::Fp8Codes codes;
    bool matches(const Tensor& g, int64_t g_col) const;
  };
  std::optional<HeldGradient> held_gradient_;
  void backward_part(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                     const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col,
                     const Tensor& input, const Tensor& weight, Half half);
  void forward_on_device(const Tensor& out, int64_t out_col, const Tensor& input,
                         const Tensor& weight, const Tensor* bias);
  void backward_on_device(const Tensor& d_input, bool accumulate_input, const Tensor& d_weight,
                          const Tensor& d_bias, const Tensor& d_out, int64_t d_out_col,
                          const Tensor& input, const Tensor& weight, Half half,
                          const HeldGradient* held);
  // Columns [col, col + cols) of a device tensor as FP8 codes (and their transpose), with the
  // recipe's scale; `slot` 0, 1, 2 = input, weight, output gradient.
  ops::Fp8Codes quantize_on_device(const Tensor& x, int64_t col, int64_t cols,
                                   Fp8TensorScaling& scaling, int slot, cpu::Fp8Format format,
                                   bool transposed);
  // Blockwise: the same columns in 1 x 128 tiles (codes) and 128 x 1 tiles (codes_t).
  ops::Fp8Codes quantize_tiles_on_device(const Tensor& x, int64_t col, int64_t cols, int slot,
                                         cpu::Fp8Format format, bool along_rows, bool down_columns);
  // The context's device step amaxes (made at the first quantisation on the device).
  const Tensor& device_step_amax();
  // CUDA: the weight's codes, with their transpose inside a step. The weight and its scale do
  // not change inside a step, so the codes made at the step's first product serve every later
  // one (each micro-batch's forward and backward): one amax and one quantisation of each weight
  // per step instead of two per micro-batch. Held until finish_step (2 bytes per weight).
  const ops::Fp8Codes& device_weight_codes(const Tensor& weight_value, int64_t in);
  ops::Fp8Codes weight_codes_;
  int64_t weight_codes_step_ = -1;  // the step_serial they were made in; -1: none kept
  // A new [rows, cols] tensor of the quantised-dequantised block at `x` (rows `stride` apart).
  // Blockwise: per tile_rows x tile_cols tile (128 x 1 tiles within each sequence).
  Tensor quantize(const float* x, int64_t rows, int64_t cols, int64_t stride,
                  Fp8TensorScaling& scaling, cpu::Fp8Format format, int64_t tile_rows,
                  int64_t tile_cols = kFp8TileSize);
  std::shared_ptr<Fp8Context> context_;
};

// Layers that share an Fp8Context: its reduction group (the trainer's), its device buffers.
// A mixture-of-experts model has two: the dense layers, whose amaxes every rank of a pipeline
// stage reduces, and the experts, whose amaxes only the ranks holding the same experts do.
struct Fp8LayerGroup {
  std::shared_ptr<Fp8Context> context;
  std::vector<Fp8Linear*> layers;  // this rank's
  std::vector<int64_t> slots;      // their places among the whole model's FP8 layers
};

// A model's FP8 layers together: the step's bookkeeping and the state checkpoints carry.
class Fp8Training {
 public:
  // `model_layers`: the whole model's FP8 layers (the same under pipeline and expert
  // parallelism, where a rank holds some of them); every group's slots lie below it.
  Fp8Training(std::vector<Fp8LayerGroup> groups, int64_t model_layers);
  // A model of these layers alone (slots 0, 1, ...), in one group.
  Fp8Training(std::shared_ptr<Fp8Context> context, std::vector<Fp8Linear*> layers);
  const Fp8Config& config() const { return groups_.front().context->config; }
  // Group 0 is the dense layers' (a mixture of experts' experts are group 1).
  Fp8Context& context(size_t group = 0) { return *groups_.at(group).context; }
  size_t group_count() const { return groups_.size(); }
  // Opens a step: amaxes are recorded (and current ones reduced over replicas) until finish_step.
  void begin_step();
  // Reduces the step's amaxes over each group's ranks (one collective a group, every rank) and,
  // when `keep` (not a skipped bad step), pushes them into the histories.
  void finish_step(bool keep);
  // The whole model's input, weight and output-gradient histories, layer by layer in slot
  // order, each newest first; the layers other ranks hold (other pipeline stages, other ep
  // ranks' experts) are zeros (a max over those ranks assembles the whole).
  std::vector<float> amax_history() const;
  // From the whole model's histories (amax_history's layout): this rank's layers take theirs.
  void set_amax_history(const std::vector<float>& values);

 private:
  void begin_group_step(Fp8LayerGroup& group);
  std::vector<Fp8LayerGroup> groups_;
  int64_t model_layers_ = 0;
};

}  // namespace loom
