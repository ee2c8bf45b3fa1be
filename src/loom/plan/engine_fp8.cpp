#include "loom/plan/engine_fp8.hpp"

#include "loom/core/error.hpp"
#include "loom/plan/collectives.hpp"

namespace loom::plan {

namespace {

// One FP8 linear layer on a rank: `rows` x `in` inputs to `out` outputs (the rank's shard).
struct Fp8Layer {
  double rows, in, out;
  bool bias_copy;  // Fp8Linear::backward copies the output gradient for the bias gradient
  bool expert;     // in the experts' amax group
  double weight;   // how many of these per mean layer
};

}  // namespace

EngineFp8Cost engine_fp8_layer_cost(const ModelConfig& m, const PlanLayout& l,
                                    const ClusterSpec& cluster, const TrainingJob& job) {
  EngineFp8Cost c;
  const EngineFp8& fp8 = job.engine_fp8;
  if (fp8.recipe == EngineFp8Recipe::Off) return c;
  if (!fp8.rates.measured())
    throw_error("plan: FP8 on loom's CPU engine needs the profile's FP8 quantisation rates");
  if (m.is_hybrid())
    throw_error("plan: loom's engine builds no hybrid Mamba stack, in FP8 or otherwise");
  const bool gpt2 = m.arch == Architecture::GPT2;
  const double rows = static_cast<double>(l.micro_batch * job.seq_len / l.cp),
               t = static_cast<double>(l.tp);
  const bool tp = l.tp > 1;
  const double h = static_cast<double>(m.n_embd), q = static_cast<double>(m.q_dim()),
               kv = static_cast<double>(m.kv_dim()), f = static_cast<double>(m.ffn_hidden);
  const double layers = static_cast<double>(m.n_layer);
  const double moe_share = static_cast<double>(m.moe_layer_count()) / layers;

  std::vector<Fp8Layer> fp8_layers;
  // Column-parallel (output split over tp; under tp its backward runs as two halves around
  // the input gradient's collective, which per-tensor recipes feed from one quantisation of
  // the output gradient) and row-parallel (input split; one backward call, its bias gradient
  // apart under sequence parallelism).
  auto column = [&](double out, double weight) {
    fp8_layers.push_back({rows, h, out / t, gpt2, false, weight});
  };
  auto row = [&](double in, double weight) {
    fp8_layers.push_back({rows, in / t, h, gpt2 && !(tp && l.sequence_parallel), false, weight});
  };
  if (gpt2) {
    column(q + 2 * kv, 1);  // c_attn (q | k | v)
    row(q, 1);              // attention c_proj
    column(f, 1);           // c_fc
    row(f, 1);              // MLP c_proj
  } else {
    column(q, 1), column(kv, 1), column(kv, 1), row(q, 1);
    const double dense = 1 - moe_share;
    if (dense > 0) column(f, dense), column(f, dense), row(f, dense);
  }
  if (moe_share > 0) {
    // The block whole on every tp rank: the micro-batch's rows, or under sequence parallelism
    // the rank's own; this ep rank's experts each see k x ep / E of those rows from every ep
    // rank (the busiest rank `imbalance` x that).
    const double own = tp && l.sequence_parallel ? rows / t : rows;
    const double experts = static_cast<double>(m.n_experts), ep = static_cast<double>(l.ep),
                 k = static_cast<double>(m.experts_per_token),
                 fe = static_cast<double>(m.expert_ffn());
    const double imbalance = l.ep > 1 ? moe_imbalance_of(m, job) : 1.0;
    const double expert_rows = imbalance * own * k * ep / experts;
    const double local = experts / ep;
    for (int i = 0; i < 2; ++i)
      fp8_layers.push_back({expert_rows, h, fe, false, true, moe_share * local});
    fp8_layers.push_back({expert_rows, fe, h, false, true, moe_share * local});
    if (m.n_shared_experts > 0) {
      const double width = static_cast<double>(m.n_shared_experts) * fe;
      for (int i = 0; i < 2; ++i) fp8_layers.push_back({own, h, width, false, false, moe_share});
      fp8_layers.push_back({own, width, h, false, false, moe_share});
    }
  }

  const bool blockwise = fp8.recipe == EngineFp8Recipe::Blockwise;
  const bool reduce_each = fp8.recipe == EngineFp8Recipe::Current;
  const Fp8QuantizeRates& r = fp8.rates;
  double dense_forward_reductions = 0, dense_backward_reductions = 0, expert_forward_reductions = 0,
         expert_backward_reductions = 0;
  for (const Fp8Layer& x : fp8_layers) {
    const double inputs = x.rows * x.in, weights = x.out * x.in, grads = x.rows * x.out;
    double forward = 0, backward = 0;
    if (blockwise) {
      forward = r.row_tiles_s * inputs + r.blocks_s * weights;
      backward = r.row_tiles_s * grads + r.blocks_s * weights + r.column_tiles_s * (grads + inputs);
      c.row_tile_elements += x.weight * (inputs + grads);
      c.block_elements += x.weight * 2 * weights;
      c.column_tile_elements += x.weight * (grads + inputs);
    } else {
      forward = r.tensor_s * (inputs + weights);
      backward = r.tensor_s * (grads + weights + inputs);
      c.tensor_elements += x.weight * (2 * inputs + 2 * weights + grads);
    }
    if (x.bias_copy) {
      // Read and write 4 bytes an element at the profile's memory-bound kernels' rate.
      backward += 8 * grads / cluster.gpu.hbm_bandwidth_bytes_per_s;
      c.bias_copy_elements += x.weight * grads;
    }
    c.forward_s += x.weight * forward;
    c.backward_s += x.weight * backward;
    if (reduce_each) {
      (x.expert ? expert_forward_reductions : dense_forward_reductions) += x.weight * 2;
      (x.expert ? expert_backward_reductions : dense_backward_reductions) += x.weight * 3;
    }
  }
  // The amax groups: every rank of a pipeline stage, and those of it holding the same experts.
  const int64_t stage = l.dp * l.cp * l.tp, experts_group = stage / l.ep;
  auto all_reduce_s = [&](int64_t ranks) {
    return ranks > 1 ? collective_time(Collective::AllReduce, 4, group_topology(cluster, ranks, 1))
                           .seconds
                     : 0.0;
  };
  const double dense_s = all_reduce_s(stage), experts_s = all_reduce_s(experts_group);
  if (stage > 1) {
    c.forward_reductions += dense_forward_reductions;
    c.backward_reductions += dense_backward_reductions;
  }
  if (experts_group > 1) {
    c.forward_reductions += expert_forward_reductions;
    c.backward_reductions += expert_backward_reductions;
  }
  c.forward_reduce_s = dense_forward_reductions * dense_s + expert_forward_reductions * experts_s;
  c.backward_reduce_s =
      dense_backward_reductions * dense_s + expert_backward_reductions * experts_s;
  return c;
}

}  // namespace loom::plan
