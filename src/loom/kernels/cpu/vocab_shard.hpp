#pragma once
// Kernels over one tensor-parallel rank's piece of the model: a block of vocabulary rows of
// the token table and output head (ids [vocab_begin, vocab_end)), and the row-wise adds that
// run after a reduction (a bias, learned positions of a block of rows). The communication
// between them is the parallel code's (parallel/vocab_parallel, tensor_parallel_linear).
#include <cstdint>

namespace loom::cpu {

// out[r] = table[tokens[r] - vocab_begin] for ids in [vocab_begin, vocab_end), zeros otherwise.
void embedding_shard_forward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                             int64_t dim, int64_t vocab_begin, int64_t vocab_end);
// d_table[tokens[r] - vocab_begin] += d_out[r] for ids in range. Threads split the channels,
// so repeated tokens never race.
void embedding_shard_backward(float* d_table, const float* d_out, const int32_t* tokens,
                              int64_t rows, int64_t dim, int64_t vocab_begin, int64_t vocab_end);
// out[r] += table[p] for rows [0, rows), p = positions[first_row + r] or (first_row + r) %
// seq_len without them: the learned positions of a block of rows that starts at row first_row
// of the whole [batch * seq_len].
void add_position_rows(float* out, const float* table, int64_t rows, int64_t dim, int64_t first_row,
                       int64_t seq_len, const int32_t* positions = nullptr);
// d_table[p] += d_out[r], rows in order, p as above.
void position_rows_backward(float* d_table, const float* d_out, int64_t rows, int64_t dim,
                            int64_t first_row, int64_t seq_len, const int32_t* positions = nullptr);
// out[r, :] += v for every row.
void add_row_vector(float* out, const float* v, int64_t rows, int64_t width);

// The output head over a vocabulary shard, in chunks of logits (the passes of
// lm_head_cross_entropy, split so that the reductions over the ranks sit between them).
struct ShardLogits {
  const float* hidden = nullptr;     // [rows, dim]
  const float* weight = nullptr;     // [shard, dim]: ids [vocab_begin, vocab_begin + shard)
  const int32_t* targets = nullptr;  // [rows] full-vocabulary ids; negative: ignored
  int64_t rows = 0, dim = 0, shard = 0, vocab_begin = 0;
  int64_t chunk = 0;        // logits per chunk (clamped to [1, shard])
  float* logits = nullptr;  // [rows, chunk] scratch
};
// Pass 1, per row: max over the shard's logits, sum of exp(logit - max), and the target's
// logit when the shard owns it (left untouched otherwise; callers start it at 0).
void shard_logit_stats(const ShardLogits& a, float* row_max, float* row_sum, float* target_logit);
// Pass 2: each chunk's grad_scale * (exp(logit - lse) - onehot) (zero for ignored rows) into
// d_hidden (overwritten; null to skip) and d_weight (accumulated; null to skip). With a single
// chunk, pass 1's logits are reused when `logits_kept`.
void shard_logit_grad(const ShardLogits& a, const float* lse, float grad_scale, float* d_hidden,
                      float* d_weight, bool logits_kept);

}  // namespace loom::cpu
