#pragma once
// Context parallelism as the model sees it. Each sequence of T tokens is cut into 2C chunks of
// T / 2C tokens, and rank r of the C ranks of a cp group holds chunks r and 2C - 1 - r, side by
// side: a causal query row then sees as many keys on every rank (the load-balanced split of
// Megatron-Core, Transformer Engine and PyTorch). Every layer but attention works on this
// rank's T / C tokens alone; attention reaches the keys and values of the whole sequence
// through a ContextAttention (parallel/context_parallel: ring, all-gather or all-to-all).
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "loom/kernels/ops.hpp"

namespace loom {

struct ContextSplit {
  int rank = 0, size = 1;

  // Throws loom::Error unless seq_len splits into 2 x size chunks, naming lengths that would.
  void check(int64_t seq_len) const;
  int64_t local_len(int64_t seq_len) const { return seq_len / size; }
  // The global position of row t (0 <= t < local_len) of the rank `holder`'s tokens.
  int64_t global_position(int64_t t, int64_t seq_len, int holder) const {
    const int64_t chunk = seq_len / (2 * size);
    return t < chunk ? holder * chunk + t : (2 * size - 1 - holder) * chunk + (t - chunk);
  }
  int64_t global_position(int64_t t, int64_t seq_len) const { return global_position(t, seq_len, rank); }
  // The rows of `holder`'s block whose global positions lie below `position`: maps a global key
  // range [begin, end) to that block's rows [rows_below(begin), rows_below(end)).
  int64_t rows_below(int64_t position, int64_t seq_len, int holder) const;
  // Of a [batch, seq_len] row-major array, this rank's [batch, local_len] rows: one value per
  // token (`width` 1) or several (`width` 2: key ranges).
  template <typename T>
  void take_local(const T* whole, T* local, int64_t batch, int64_t seq_len, int64_t width = 1) const {
    const int64_t n = local_len(seq_len);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t k = 0; k < width; ++k)
          local[(b * n + t) * width + k] = whole[(b * seq_len + global_position(t, seq_len)) * width + k];
  }
};

class ContextAttention {
 public:
  virtual ~ContextAttention() = default;
  virtual ContextSplit split() const = 0;
  // This rank's queries of the fused qkv [batch * T/C, (H + 2 KV) D] over the keys of the whole
  // sequence; `local` is the attention shape of this rank's rows (seq_len = T / C). key_ranges (2
  // per local row, required) are global positions [begin, end), end <= the row's position + 1.
  // out and lse as ops::attention_forward's.
  virtual void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const ops::AttentionShape& local, std::span<const int32_t> key_ranges) = 0;
  // d_qkv (written) from d_out, with the forward's out and lse.
  virtual void backward(const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv, const Tensor& out,
                        const Tensor& lse, const ops::AttentionShape& local,
                        std::span<const int32_t> key_ranges) = 0;
  // Attention FLOPs this rank's forwards asked for: 4 D per (query head, visible key) pair,
  // counted from the key ranges (QK^T and PV, 2 D each).
  int64_t forward_flops() const { return forward_flops_; }
  void reset_flops() { forward_flops_ = 0; }

  // Where the time went: attention over blocks, and waits for communication that the compute
  // did not hide (the ring's waits after each block; every collective of the other ways).
  struct Timing {
    double compute_s = 0, exposed_comm_s = 0;
  };
  const Timing& timing() const { return timing_; }
  void reset_timing() { timing_ = {}; }
  // Called with each span of work (name, lane "cp compute" or "cp communication", start and
  // end in TraceRecorder's clock) when set: `--trace` draws the ring's transfers over compute.
  using SpanHook = std::function<void(const std::string& name, const char* lane, double start_s, double end_s)>;
  void set_span_hook(SpanHook hook) { span_hook_ = std::move(hook); }

 protected:
  int64_t forward_flops_ = 0;
  Timing timing_;
  SpanHook span_hook_;
};

}  // namespace loom
