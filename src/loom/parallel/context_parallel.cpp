#include "loom/parallel/context_parallel.hpp"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/dist/tensor_comm.hpp"
#include "loom/obs/trace.hpp"

namespace loom {

namespace {

// What every way of attending over the split sequence shares: the group, this rank's place in
// the split, and the shapes of a call.
class ContextAttentionBase : public ContextAttention {
 public:
  explicit ContextAttentionBase(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {
    split_.rank = group_->rank();
    split_.size = group_->size();
  }
  ContextSplit split() const override { return split_; }

 protected:
  struct Dims {
    int64_t batch, local_len, seq_len, rows, q_cols, kv_cols;
  };
  Dims dims(const Tensor& qkv, const ops::AttentionShape& s, std::span<const int32_t> ranges) const {
    const Dims d{s.batch, s.seq_len, s.seq_len * split_.size, s.batch * s.seq_len, s.heads * s.head_dim,
                 2 * s.kv_heads * s.head_dim};
    if (qkv.dim() != 2 || qkv.size(0) != d.rows || qkv.size(1) != s.qkv_ld())
      throw_error("context-parallel attention: qkv ", shape_to_string(qkv.shape()), " for ", d.rows,
                  " local rows of ", s.qkv_ld());
    if (static_cast<int64_t>(ranges.size()) != 2 * d.rows)
      throw_error("context-parallel attention: ", ranges.size(), " key-range values for ", d.rows,
                  " local rows, expected 2 per row (global positions)");
    split_.check(d.seq_len);
    return d;
  }
  // This rank's k | v block [rows, 2 KV D], an f32 copy of qkv's key and value columns (bf16
  // ones widened: the blocks travel and their gradients add up in f32).
  Tensor kv_block(const Tensor& qkv, const Dims& d) const {
    Tensor kv = Tensor::empty({d.rows, d.kv_cols}, DType::F32, MemCategory::CommBuffers, qkv.device());
    ops::copy_columns(kv, 0, qkv, d.q_cols, d.kv_cols);
    return kv;
  }
  void count_flops(std::span<const int32_t> ranges, const ops::AttentionShape& s) {
    int64_t pairs = 0;
    for (size_t i = 0; i + 1 < ranges.size(); i += 2) pairs += ranges[i + 1] - ranges[i];
    forward_flops_ += 4 * s.head_dim * s.heads * pairs;
  }
  static ops::CrossAttentionShape cross_shape(const ops::AttentionShape& s, int64_t kv_len) {
    return {s.batch, s.seq_len, kv_len, s.heads, s.kv_heads, s.head_dim};
  }

  // Runs `work` as compute or as an exposed wait, timed and reported to the span hook.
  template <typename Work>
  void timed(const std::string& name, bool compute, Work work) {
    const double start = TraceRecorder::now_s();
    work();
    const double end = TraceRecorder::now_s();
    (compute ? timing_.compute_s : timing_.exposed_comm_s) += end - start;
    if (span_hook_) span_hook_(name, compute ? "cp compute" : "cp communication", start, end);
  }
  void transfer_span(const std::string& name, double issued, double done) const {
    if (span_hook_) span_hook_(name, "cp transfers", issued, done);
  }

  std::shared_ptr<ProcessGroup> group_;
  ContextSplit split_;
};

// ---- all-gather ---------------------------------------------------------------------------

class AllGatherAttention final : public ContextAttentionBase {
 public:
  using ContextAttentionBase::ContextAttentionBase;

  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const ops::AttentionShape& s,
               std::span<const int32_t> ranges) override {
    const Dims d = dims(qkv, s, ranges);
    count_flops(ranges, s);
    Tensor whole;
    timed("all-gather k|v", false, [&] { whole = gather(qkv, d); });
    timed("attention", true, [&] { ops::cross_attention_forward(out, lse, qkv, whole, cross_shape(s, d.seq_len), ranges); });
  }

  void backward(const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv, const Tensor& out,
                const Tensor& lse, const ops::AttentionShape& s, std::span<const int32_t> ranges) override {
    const Dims d = dims(qkv, s, ranges);
    Tensor whole;  // gathered again: the forward kept nothing of it
    timed("all-gather k|v", false, [&] { whole = gather(qkv, d); });
    const Tensor d_whole = Tensor::empty(whole.shape(), DType::F32, MemCategory::Workspace, qkv.device());
    // The query gradient in f32 like the key/value one: d_qkv itself, or a copy written back.
    const Tensor d_q =
        d_qkv.dtype() == DType::F32
            ? d_qkv
            : Tensor::empty(d_qkv.shape(), DType::F32, MemCategory::Workspace, qkv.device());
    timed("attention backward", true, [&] {
      ops::cross_attention_backward(d_q, d_whole, d_out, qkv, whole, out, lse,
                                    cross_shape(s, d.seq_len), ranges);
    });
    if (d_q.raw() != d_qkv.raw()) ops::copy_columns(d_qkv, 0, d_q, 0, d.q_cols);
    // Every rank's gradient of every block, summed at the block's owner.
    const Tensor blocks = Tensor::empty({split_.size * d.rows, d.kv_cols}, DType::F32, MemCategory::CommBuffers,
                                        qkv.device());
    permute(d_whole, blocks, d, false);
    const Tensor mine = Tensor::empty({d.rows, d.kv_cols}, DType::F32, MemCategory::CommBuffers, qkv.device());
    timed("reduce-scatter d k|v", false, [&] { comm::reduce_scatter(*group_, blocks, mine, ReduceOp::Sum)->wait(); });
    ops::copy_columns(d_qkv, d.q_cols, mine, 0, d.kv_cols);
  }

 private:
  // Every rank's k | v block, in sequence order [batch * T, 2 KV D].
  Tensor gather(const Tensor& qkv, const Dims& d) const {
    const Tensor mine = kv_block(qkv, d);
    const Tensor blocks = Tensor::empty({split_.size * d.rows, d.kv_cols}, DType::F32, MemCategory::CommBuffers,
                                        qkv.device());
    comm::all_gather(*group_, mine, blocks)->wait();
    const Tensor whole = Tensor::empty({d.batch * d.seq_len, d.kv_cols}, DType::F32, MemCategory::Workspace,
                                       qkv.device());
    permute(whole, blocks, d, true);
    return whole;
  }
  // Between the gathered blocks (rank j's rows at block j) and sequence order: each rank's two
  // chunks of each sequence are runs of rows. to_sequence copies blocks into whole, else back.
  void permute(const Tensor& whole, const Tensor& blocks, const Dims& d, bool to_sequence) const {
    const int64_t chunk = d.local_len / 2;
    for (int j = 0; j < split_.size; ++j)
      for (int64_t b = 0; b < d.batch; ++b)
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t block_row = j * d.rows + b * d.local_len + half * chunk;
          const int64_t whole_row = b * d.seq_len + split_.global_position(half * chunk, d.seq_len, j);
          const Tensor w = whole.narrow_rows(whole_row, whole_row + chunk);
          const Tensor k = blocks.narrow_rows(block_row, block_row + chunk);
          (to_sequence ? w : k).copy_from(to_sequence ? k : w);
        }
  }
};

// ---- ring ---------------------------------------------------------------------------------

class RingAttention final : public ContextAttentionBase {
 public:
  using ContextAttentionBase::ContextAttentionBase;

  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const ops::AttentionShape& s,
               std::span<const int32_t> ranges) override {
    const Dims d = dims(qkv, s, ranges);
    count_flops(ranges, s);
    const int n = split_.size;
    Tensor held = kv_block(qkv, d);
    Tensor next = n > 1 ? empty_like(held, MemCategory::CommBuffers) : Tensor();
    // Partial results merge in f32: into out itself, or (bf16 out) a copy written back at the end.
    const Tensor result = out.dtype() == DType::F32 ? out : empty_like(out, MemCategory::Workspace);
    Tensor part, part_lse;
    std::vector<int32_t> block_ranges;
    for (int step = 0; step < n; ++step) {
      WorkHandle exchanged;
      const double issued = TraceRecorder::now_s();
      if (step + 1 < n)  // the next block travels while this one is computed
        exchanged = comm::send_recv(*group_, held, next_rank(), next, previous_rank(), kTagKv);
      const int holder = holder_at(step);
      if (map_ranges(ranges, d, holder, block_ranges))
        timed("attention block of rank " + std::to_string(holder), true, [&] {
          if (step == 0) {  // the diagonal block: every row sees itself, so it starts the result
            ops::cross_attention_forward(result, lse, qkv, held, cross_shape(s, d.local_len),
                                         block_ranges);
            return;
          }
          if (!part.defined()) {
            part = empty_like(out, MemCategory::Workspace);
            part_lse = empty_like(lse, MemCategory::Workspace);
          }
          ops::cross_attention_forward(part, part_lse, qkv, held, cross_shape(s, d.local_len), block_ranges);
          ops::merge_attention_partials(result, lse, part, part_lse, s.batch, s.heads);
        });
      if (exchanged) {
        timed("wait for block", false, [&] { exchanged->wait(); });
        transfer_span("block of rank " + std::to_string(holder_at(step + 1)) + " in", issued, TraceRecorder::now_s());
        std::swap(held, next);
      }
    }
    if (result.raw() != out.raw()) ops::copy_columns(out, 0, result, 0, d.q_cols);
  }

  // The blocks go round again, each with the gradient of its keys and values: that gradient
  // starts at the holder's successor, gathers every other rank's part, and reaches the holder
  // (which adds its own diagonal part) after C - 1 hops. Each step's transfers are exchanges
  // with both neighbours (ProcessGroup::send_recv), issued in the same order on every rank: the
  // next block at the start of the step, under its compute; the gradient at its end.
  void backward(const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv, const Tensor& out,
                const Tensor& lse, const ops::AttentionShape& s, std::span<const int32_t> ranges) override {
    const Dims d = dims(qkv, s, ranges);
    const int n = split_.size;
    const Device device = qkv.device();
    // The queries alone, compact: the cross-attention backward writes a d_q shaped like its q.
    const Tensor q = Tensor::empty({d.rows, d.q_cols}, qkv.dtype(), MemCategory::Workspace, device);
    ops::copy_columns(q, 0, qkv, 0, d.q_cols);
    const Tensor d_q = Tensor::zeros({d.rows, d.q_cols}, DType::F32, MemCategory::Workspace, device);
    const Tensor d_q_part = empty_like(d_q, MemCategory::Workspace);
    Tensor held = kv_block(qkv, d);
    Tensor next = n > 1 ? empty_like(held, MemCategory::CommBuffers) : Tensor();
    const Tensor own = empty_like(held, MemCategory::Workspace);  // the diagonal block's gradient
    const Tensor travelling =
        n > 1 ? empty_like(held, MemCategory::CommBuffers) : Tensor();  // sent on
    const Tensor arriving = n > 1 ? empty_like(held, MemCategory::CommBuffers) : Tensor();
    WorkHandle
        gradient_exchanged;  // travelling out to the successor, arriving in from the predecessor
    std::vector<int32_t> block_ranges;
    for (int step = 0; step < n; ++step) {
      WorkHandle exchanged;
      if (step + 1 < n)
        exchanged = comm::send_recv(*group_, held, next_rank(), next, previous_rank(), kTagKv);
      // The last step's gradient must have left before its buffer is written again.
      if (gradient_exchanged)
        timed("wait for gradient", false, [&] { gradient_exchanged->wait(); });
      const Tensor& d_block = step == 0 ? own : travelling;
      if (map_ranges(ranges, d, holder_at(step), block_ranges)) {
        timed("attention backward block of rank " + std::to_string(holder_at(step)), true, [&] {
          ops::cross_attention_backward(d_q_part, d_block, d_out, q, held, out, lse, cross_shape(s, d.local_len),
                                        block_ranges);
          ops::add_into(d_q, d_q_part);
        });
      } else {
        d_block.zero_();
      }
      if (step >= 1) {
        if (step >= 2)
          ops::add_into(travelling, arriving);  // the predecessors' parts of this block
        gradient_exchanged = comm::send_recv(*group_, travelling, next_rank(), arriving,
                                             previous_rank(), kTagGradient);
      }
      if (exchanged) {
        timed("wait for block", false, [&] { exchanged->wait(); });
        std::swap(held, next);
      }
    }
    if (n > 1) {  // this rank's own block's gradient, from every other rank
      timed("wait for own gradient", false, [&] { gradient_exchanged->wait(); });
      ops::add_into(own, arriving);
    }
    ops::copy_columns(d_qkv, 0, d_q, 0, d.q_cols);
    ops::copy_columns(d_qkv, d.q_cols, own, 0, d.kv_cols);
  }

 private:
  static constexpr int kTagKv = 1, kTagGradient = 2;
  int next_rank() const { return (split_.rank + 1) % split_.size; }
  int previous_rank() const { return (split_.rank + split_.size - 1) % split_.size; }
  // Whose block this rank holds at `step`: its own, then its predecessors'.
  int holder_at(int step) const { return (split_.rank - step + split_.size) % split_.size; }
  static Tensor empty_like(const Tensor& t, MemCategory category) {
    return Tensor::empty(t.shape(), DType::F32, category, t.device());
  }
  // The global key ranges as rows of `holder`'s block; false when no row sees any of it.
  bool map_ranges(std::span<const int32_t> ranges, const Dims& d, int holder, std::vector<int32_t>& out) const {
    out.resize(ranges.size());
    bool any = false;
    for (size_t i = 0; i < ranges.size(); i += 2) {
      out[i] = static_cast<int32_t>(split_.rows_below(ranges[i], d.seq_len, holder));
      out[i + 1] = static_cast<int32_t>(split_.rows_below(ranges[i + 1], d.seq_len, holder));
      any = any || out[i] < out[i + 1];
    }
    return any;
  }
};

// ---- all-to-all (Ulysses) ----------------------------------------------------------------

// Rank j of C attends with head group j (H / C query heads, KV / C kv heads) over the whole
// sequence: an all-to-all turns this rank's rows of every head into every rank's rows of its
// heads, attention runs as on one process, and an all-to-all turns the output back. The
// log-sum-exps and the backward's operands travel the same way. Rows are packed and unpacked
// with ops::copy_columns on views, so the same code runs on either device; the all-to-all's
// buffers are f32 (bf16 activations are widened on the way in and rounded on the way out).
class AllToAllAttention final : public ContextAttentionBase {
 public:
  using ContextAttentionBase::ContextAttentionBase;

  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const ops::AttentionShape& s,
               std::span<const int32_t> ranges) override {
    const Dims d = dims(qkv, s, ranges);
    const Heads h = heads(s);
    const std::vector<int32_t> all_ranges = whole_ranges(ranges, d);
    count_flops(all_ranges, {s.batch, s.seq_len, h.q, h.kv, s.head_dim});
    const Tensor qkv_heads = to_heads(qkv, qkv_columns(s, h), d);
    const ops::AttentionShape mine{d.batch, d.seq_len, h.q, h.kv, s.head_dim};
    const Tensor out_heads =
        workspace({d.batch * d.seq_len, h.q * s.head_dim}, qkv.dtype(), qkv.device());
    const Tensor lse_heads = workspace({d.batch, h.q, d.seq_len}, DType::F32, qkv.device());
    timed("attention", true, [&] { ops::attention_forward(out_heads, lse_heads, qkv_heads, mine, all_ranges); });
    from_heads(out_heads, out, out_columns(s, h), d);
    const Tensor lse_rows = workspace({d.rows, s.heads}, DType::F32, qkv.device());
    from_heads(rows_of_lse(lse_heads, d.batch, h.q, d.seq_len), lse_rows, lse_columns(h), d);
    lse_from_rows(lse_rows, lse, d.batch, s.heads, d.local_len);
  }

  void backward(const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                const ops::AttentionShape& s, std::span<const int32_t> ranges) override {
    const Dims d = dims(qkv, s, ranges);
    const Heads h = heads(s);
    const std::vector<int32_t> all_ranges = whole_ranges(ranges, d);
    const Tensor qkv_heads = to_heads(qkv, qkv_columns(s, h), d);
    const Tensor out_heads = to_heads(out, out_columns(s, h), d);
    const Tensor d_out_heads = to_heads(d_out, out_columns(s, h), d);
    const Tensor lse_heads = lse_from_row_layout(to_heads(rows_of_lse(lse, d.batch, s.heads, d.local_len),
                                                          lse_columns(h), d),
                                                 d.batch, h.q, d.seq_len);
    const Tensor d_qkv_heads = workspace(qkv_heads.shape(), qkv_heads.dtype(), qkv.device());
    timed("attention backward", true, [&] {
      ops::attention_backward(d_qkv_heads, d_out_heads, qkv_heads, out_heads, lse_heads,
                              {d.batch, d.seq_len, h.q, h.kv, s.head_dim}, all_ranges);
    });
    from_heads(d_qkv_heads, d_qkv, qkv_columns(s, h), d);
  }

 private:
  struct Heads {
    int64_t q, kv;  // per rank of the cp group
  };
  // Column runs [first, first + width) of a local row that go to head group j, in order.
  using Columns = std::function<std::vector<std::pair<int64_t, int64_t>>(int j)>;

  Heads heads(const ops::AttentionShape& s) const {
    if (s.heads % split_.size != 0 || s.kv_heads % split_.size != 0)
      throw_error("cp_comm = \"a2a\" (Ulysses): ", s.heads, " attention heads and ", s.kv_heads,
                  " kv heads per rank do not split over cp = ", split_.size);
    return {s.heads / split_.size, s.kv_heads / split_.size};
  }
  static Columns qkv_columns(const ops::AttentionShape& s, const Heads& h) {
    const int64_t dd = s.head_dim;
    return [=](int j) {
      return std::vector<std::pair<int64_t, int64_t>>{{j * h.q * dd, h.q * dd},
                                                       {(s.heads + j * h.kv) * dd, h.kv * dd},
                                                       {(s.heads + s.kv_heads + j * h.kv) * dd, h.kv * dd}};
    };
  }
  static Columns out_columns(const ops::AttentionShape& s, const Heads& h) {
    const int64_t dd = s.head_dim;
    return [=](int j) { return std::vector<std::pair<int64_t, int64_t>>{{j * h.q * dd, h.q * dd}}; };
  }
  static Columns lse_columns(const Heads& h) {
    return [=](int j) { return std::vector<std::pair<int64_t, int64_t>>{{j * h.q, h.q}}; };
  }
  static int64_t width(const Columns& columns) {
    int64_t w = 0;
    for (const auto& [first, cols] : columns(0)) w += cols;
    return w;
  }
  static Tensor workspace(const Shape& shape, DType dtype, Device device) {
    return Tensor::empty(shape, dtype, MemCategory::Workspace, device);
  }

  // Every rank's key ranges (global positions) in sequence order, from this rank's.
  std::vector<int32_t> whole_ranges(std::span<const int32_t> ranges, const Dims& d) const {
    std::vector<float> mine(ranges.begin(), ranges.end()), all(ranges.size() * static_cast<size_t>(split_.size));
    comm::all_gather(*group_, mine.data(), all.data(), static_cast<int64_t>(mine.size()))->wait();
    std::vector<int32_t> whole(static_cast<size_t>(2 * d.batch * d.seq_len));
    for (int i = 0; i < split_.size; ++i)
      for (int64_t b = 0; b < d.batch; ++b)
        for (int64_t t = 0; t < d.local_len; ++t)
          for (int64_t k = 0; k < 2; ++k)
            whole[static_cast<size_t>(2 * (b * d.seq_len + split_.global_position(t, d.seq_len, i)) + k)] =
                static_cast<int32_t>(all[static_cast<size_t>(2 * (i * d.rows + b * d.local_len + t) + k)]);
    return whole;
  }

  // Rank i's rows of the all-to-all's [C rows, w] buffer <-> their places in sequence order
  // [batch * T, w]: each of rank i's two chunks of each sequence is a run of rows on both sides.
  void permute(const Tensor& sequence, const Tensor& ranks, const Dims& d, bool to_sequence) const {
    const int64_t chunk = d.local_len / 2, w = sequence.size(1);
    for (int i = 0; i < split_.size; ++i)
      for (int64_t b = 0; b < d.batch; ++b)
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t rank_row = i * d.rows + b * d.local_len + half * chunk;
          const int64_t seq_row =
              b * d.seq_len + split_.global_position(half * chunk, d.seq_len, i);
          const Tensor in_sequence = sequence.narrow_rows(seq_row, seq_row + chunk);
          const Tensor in_ranks = ranks.narrow_rows(rank_row, rank_row + chunk);
          if (to_sequence)
            ops::copy_columns(in_sequence, 0, in_ranks, 0, w);
          else
            ops::copy_columns(in_ranks, 0, in_sequence, 0, w);
        }
  }

  // This rank's rows of every head -> every rank's rows of this rank's heads, in sequence order
  // [batch * T, width], in `local`'s dtype.
  Tensor to_heads(const Tensor& local, const Columns& columns, const Dims& d) {
    const int64_t w = width(columns), n = split_.size;
    const Tensor send =
        Tensor::empty({n * d.rows, w}, DType::F32, MemCategory::CommBuffers, local.device());
    const Tensor received =
        Tensor::empty(send.shape(), DType::F32, MemCategory::CommBuffers, local.device());
    for (int j = 0; j < n; ++j) {
      const Tensor block = send.narrow_rows(j * d.rows, (j + 1) * d.rows);
      int64_t col = 0;
      for (const auto& [first, cols] : columns(j)) {
        ops::copy_columns(block, col, local, first, cols);
        col += cols;
      }
    }
    timed("all-to-all", false, [&] { comm::all_to_all(*group_, send, received)->wait(); });
    const Tensor heads = workspace({d.batch * d.seq_len, w}, local.dtype(), local.device());
    permute(heads, received, d, true);
    return heads;
  }

  // The inverse: this rank's heads over the whole sequence -> its rows of every head, written
  // into `local`'s columns.
  void from_heads(const Tensor& heads, const Tensor& local, const Columns& columns, const Dims& d) {
    const int64_t w = width(columns), n = split_.size;
    const Tensor send =
        Tensor::empty({n * d.rows, w}, DType::F32, MemCategory::CommBuffers, local.device());
    const Tensor received =
        Tensor::empty(send.shape(), DType::F32, MemCategory::CommBuffers, local.device());
    permute(heads, send, d, false);
    timed("all-to-all", false, [&] { comm::all_to_all(*group_, send, received)->wait(); });
    for (int j = 0; j < n; ++j) {
      const Tensor block = received.narrow_rows(j * d.rows, (j + 1) * d.rows);
      int64_t col = 0;
      for (const auto& [first, cols] : columns(j)) {
        ops::copy_columns(local, first, block, col, cols);
        col += cols;
      }
    }
  }

  // lse [batch, heads, len] <-> rows [batch * len, heads], so it travels like the activations:
  // one column copy per (sequence, head).
  static Tensor rows_of_lse(const Tensor& lse, int64_t batch, int64_t heads, int64_t len) {
    const Tensor rows = workspace({batch * len, heads}, DType::F32, lse.device());
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        ops::copy_columns(rows.narrow_rows(b * len, (b + 1) * len), h,
                          lse.slice_as((b * heads + h) * len, {len, 1}), 0, 1);
    return rows;
  }
  static void lse_from_rows(const Tensor& rows, const Tensor& lse, int64_t batch, int64_t heads,
                            int64_t len) {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h)
        ops::copy_columns(lse.slice_as((b * heads + h) * len, {len, 1}), 0,
                          rows.narrow_rows(b * len, (b + 1) * len), h, 1);
  }
  static Tensor lse_from_row_layout(const Tensor& rows, int64_t batch, int64_t heads, int64_t len) {
    const Tensor lse = workspace({batch, heads, len}, DType::F32, rows.device());
    lse_from_rows(rows, lse, batch, heads, len);
    return lse;
  }
};

}  // namespace

std::shared_ptr<ContextAttention> make_context_attention(std::shared_ptr<ProcessGroup> group, CpComm comm) {
  if (!group) throw_error("context-parallel attention needs its cp group");
  switch (comm) {
    case CpComm::P2P: return std::make_shared<RingAttention>(std::move(group));
    case CpComm::AllGather: return std::make_shared<AllGatherAttention>(std::move(group));
    case CpComm::AllToAll: return std::make_shared<AllToAllAttention>(std::move(group));
  }
  throw_error("unknown cp_comm");
}

}  // namespace loom
