#pragma once
// A mixture-of-experts feed-forward layer (Shazeer et al. 2017; Mixtral, Jiang et al. 2024;
// DeepSeek-V3, 2024): a router scores every token against E experts, each token runs through
// the top k of them (SwiGLU MLPs of ffn_hidden), and their outputs are summed with the
// router's weights. Computation is grouped: the routed copies of the tokens are gathered expert
// by expert into one contiguous buffer and each expert multiplies its rows in one GEMM, not a
// loop over tokens.
//
// Dropless by default: every token reaches its k experts, so the routed rows are exactly
// k x rows whatever the balance. With a capacity factor c > 0 each expert takes at most
// ceil(c k rows / E) rows; the slots beyond are dropped in token order (an expert keeps its
// earliest tokens, as GShard and Switch do), and a dropped slot adds nothing (the kept weights
// are not renormalised).
//
// Parameters under Mixtral's Hugging Face names, with `prefix` = "model.layers.N.block_sparse_moe":
// gate.weight [E, C] (the router), experts.i.w1 (gate) and w3 (up) [F, C], w2 (down) [C, F];
// shared experts (DeepSeekMoE) as shared_experts.w1 / w3 / w2, one MLP of S x F for every token.
// The rows live where the layer's input does (host f32, or a GPU in f32 or bf16) and move
// through kernels/ops (moe_gather, moe_combine and their backward); routing runs on the host in
// f32 (cpu::moe_route: the per-expert counts size the experts' GEMMs there anyway), from logits
// computed on the device in the activations' dtype. Expert parallelism's exchange moves rows
// where they are (dist/tensor_comm stages them for the group).
//
// Expert parallelism (GShard, Lepikhin et al. 2020; Megatron-Core's token dispatcher): the ep
// ranks of a group each hold E / ep consecutive experts (rank r: experts r E/ep ...) and their
// own tokens. Every rank routes its tokens against all E experts (the router is replicated),
// applies the capacity to its own tokens, and sends each expert's rows to the rank holding it
// with an all-to-all(v) (the per-expert row counts are exchanged first); the holder regroups
// what it received expert by expert, runs each expert once over all its rows, and the reverse
// all-to-all brings the outputs home, where the router's weights combine them. Backward runs
// the same exchanges the other way. An expert's parameters exist on its holder only
// (Parameter::expert).
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cpu/moe.hpp"
#include "loom/model/config.hpp"
#include "loom/model/fp8_linear.hpp"
#include "loom/model/parameter.hpp"

namespace loom {

// The all-to-all of expert parallelism as the MoE layer sees it; parallel/expert_parallel
// runs it over the ep process group. Every rank of the group calls each method in the same order.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // send[j] values go to rank j; returns what each rank j sent here (all equal length).
  virtual std::vector<int64_t> exchange_counts(std::span<const int64_t> send, int64_t per_rank) = 0;
  // Rows of in's width (tensors of one device and dtype): the first send_rows[0] rows of `in`
  // go to rank 0, the next send_rows[1] to rank 1, ...; `out` receives recv_rows[j] rows from
  // rank j, in rank order.
  virtual void exchange_rows(const Tensor& in, std::span<const int64_t> send_rows,
                             const Tensor& out, std::span<const int64_t> recv_rows) = 0;
};

struct MoeSpec {
  int64_t dim = 0, experts = 0, top_k = 0, ffn_hidden = 0;
  int64_t shared_experts = 0;  // one always-on SwiGLU MLP of shared_experts x ffn_hidden
  MoeRouter router = MoeRouter::Softmax;
  double capacity_factor = 0;  // 0: dropless
  int ep_rank = 0, ep_size = 1;  // expert parallelism: this rank holds experts [first, first + local)
  // Throws loom::Error naming the field at fault.
  void validate() const;
  // Rows one expert takes at most for `rows` tokens (rows x k when dropless).
  int64_t capacity(int64_t rows) const;
  int64_t local_experts() const { return experts / ep_size; }
  int64_t first_expert() const { return ep_rank * local_experts(); }
};

// What the forward keeps for the backward, and what it saw.
struct MoeStash {
  int64_t rows = 0;
  Tensor logits, probs;            // [rows, E], host f32
  std::vector<int32_t> selected;   // [rows, k] expert ids
  Tensor weights;                  // [rows, k]
  Tensor device_weights;           // a copy where the rows are, when that is not the host
  std::vector<int64_t> counts;     // [E] routed slots per expert, before any dropping
  std::vector<int64_t> offsets;    // [E + 1] kept rows of each expert in the routed buffers
  std::vector<int32_t> position;   // [rows, k] row of slot (t, s) in the routed buffers, -1 dropped
  int64_t dropped = 0;             // slots dropped by the capacity
  // The experts' inputs, expert by expert: the tokens' kept copies [kept, C]; under expert
  // parallelism the rows this rank's experts received [received, C], regrouped by expert.
  Tensor routed_input;
  Tensor pre;                      // [rows of routed_input, 2F] gate | up
  Tensor act;                      // [rows of routed_input, F]
  Tensor expert_out;               // [kept, C], back home in the routed order
  // Expert parallelism: rows sent to / received from each ep rank, and for every local expert
  // and source rank how many rows it received (local expert major: [local experts][ep]).
  std::vector<int64_t> send_rows, recv_rows, recv_counts;
  std::vector<int64_t> local_offsets;  // [local experts + 1] rows of each in routed_input
  Tensor shared_pre, shared_act;   // shared experts: [rows, 2 S F] gate | up, [rows, S F]
  cpu::MoeRouterLosses losses;     // the balancing (aux) and z losses of these tokens
};

class MoeLayer {
 public:
  // Under expert parallelism (spec.ep_size > 1) only this rank's experts are built, and
  // `exchange` moves the rows; it must outlive the layer.
  MoeLayer(const MoeSpec& spec, const std::string& prefix, ExpertExchange* exchange = nullptr);
  const MoeSpec& spec() const { return spec_; }
  // Where each collected parameter sits in the whole layer's collect order (router, every
  // expert's w1 w3 w2, the shared experts): its initialisation stream, the same on every ep.
  std::vector<int64_t> parameter_slots() const;
  int64_t whole_parameter_count() const;

  // out [rows, C] = sum over each token's kept slots of weight x expert(x). x [rows, C].
  void forward(const Tensor& out, const Tensor& x, MoeStash& stash) const;
  // d_x [rows, C] (written) and every parameter's gradient (accumulated) of
  //   sum(d_out . out) + aux_scale * aux + z_scale * z.
  void backward(const Tensor& d_x, const Tensor& d_out, const Tensor& x, const MoeStash& stash, float aux_scale,
                float z_scale);
  void collect(ParameterList& out);
  // Mixed precision on the CPU: round what the layer stores for backward (the experts' and the
  // shared experts' pre-activations, activations and outputs) to bf16 values, as the dense MLP
  // does; the router's logits and probabilities stay f32 (a sensitive op). With real bf16
  // storage (CUDA) the router GEMM writes bf16 logits (Megatron's default; DeepSeek-V3 keeps
  // them f32), which are routed in f32 from there, so near ties may route differently from the
  // CPU's emulation.
  void set_bf16_activations(bool on) { bf16_activations_ = on; }

  // Expert parallelism's three steps, which forward and backward use (public for tests):
  // plan_exchange sends every holder the counts of the rows it will get (`kept` per expert, the
  // routed order of s.offsets) and fills s's send/receive layout; dispatch moves rows in the
  // routed order ([kept, C], home) to the holders, expert by expert ([received, C]);
  // bring_home moves such rows back to the routed order. Collective over the ep group.
  void plan_exchange(MoeStash& s, const std::vector<int64_t>& kept) const;
  void dispatch(const Tensor& home, const Tensor& at_experts, const MoeStash& s) const;
  void bring_home(const Tensor& at_experts, const Tensor& home, const MoeStash& s) const;

  // Auxiliary-loss-free balancing (DeepSeek-V3, sec. 2.1.2): the selection bias of an expert
  // that got more than the mean load falls by `rate`, one that got less rises by it. `counts`
  // are routed slots per expert (summed over the step's micro-batches). Sigmoid router only.
  void update_bias(const std::vector<int64_t>& counts, float rate);
  const std::vector<float>& bias() const { return bias_; }
  // Restores a bias saved with a checkpoint; throws loom::Error on a size mismatch.
  void set_bias(const std::vector<float>& bias);

  // FP8 training (model/fp8_linear.hpp): every local expert's gate, up and down GEMMs on FP8
  // operands, each with scales of its own, in the `experts` context, and the shared experts'
  // in `shared`; the router stays in high precision. An expert no token chose still quantises
  // (no rows), so the ranks holding it reduce its amaxes together whatever their tokens.
  struct Fp8Layers {
    std::vector<Fp8Linear*> experts;  // expert by expert: gate, up, down
    std::vector<Fp8Linear*> shared;   // gate, up, down; empty without shared experts
  };
  Fp8Layers enable_fp8(const std::shared_ptr<Fp8Context>& experts,
                       const std::shared_ptr<Fp8Context>& shared);

  Parameter router;                        // [E, C]
  std::vector<Parameter> gate, up, down;   // per local expert: [F, C], [F, C], [C, F]
  Parameter shared_gate, shared_up, shared_down;  // with shared experts: [S F, C], [S F, C], [C, S F]

 private:
  // The experts over their routed rows, in place in the stash: s.pre, s.act and `out`, one
  // GEMM each over s.local_offsets.
  void run_experts(const Tensor& out, MoeStash& s) const;
  void run_experts_backward(const Tensor& d_in, const Tensor& d_out, const MoeStash& s);

  // FP8: 3 per local expert (gate, up, down) and 3 for the shared experts; empty: off.
  std::vector<std::unique_ptr<Fp8Linear>> fp8_experts_, fp8_shared_;
  Fp8Linear* expert_fp8(size_t expert, size_t projection) const {
    return fp8_experts_.empty() ? nullptr : fp8_experts_[3 * expert + projection].get();
  }
  Fp8Linear* shared_fp8(size_t projection) const {
    return fp8_shared_.empty() ? nullptr : fp8_shared_[projection].get();
  }

  MoeSpec spec_;
  ExpertExchange* exchange_ = nullptr;
  bool bf16_activations_ = false;
  std::vector<float> bias_;  // [E] selection bias (sigmoid router), not a trained parameter
};

}  // namespace loom
