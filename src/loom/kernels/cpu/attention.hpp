#pragma once
// Causal self-attention computed tile by tile with an online softmax (FlashAttention,
// Dao et al. 2022): the T x T score matrix is never stored. Forward saves the row-wise
// log-sum-exp; backward recomputes probabilities from it. Grouped-query attention: query
// head h reads key/value head h / (heads / kv_heads).
//
// Layout: qkv is [batch * seq, (heads + 2 * kv_heads) * head_dim] with q | k | v side by
// side in each row (the fused projection's output); out is [batch * seq, heads * head_dim];
// lse is [batch, heads, seq].
//
// Key ranges generalise the causal mask: query row i of sequence b sees exactly the keys
// [begin, end) given for it, which must hold i (so no row is empty) and lie within [0, i].
// Causal attention is (0, i + 1); packed documents are (first token of i's document, i + 1).
// Without ranges the kernels are the causal ones (and give the same bits as ranges (0, i + 1)).
#include <cstdint>

namespace loom::cpu {

struct AttentionShape {
  int64_t batch, seq_len, heads, kv_heads, head_dim;
  int64_t qkv_ld() const { return (heads + 2 * kv_heads) * head_dim; }
  int64_t out_ld() const { return heads * head_dim; }
};

// key_ranges: null (causal), or [batch * seq, 2] int32 (begin, end) per query row.
void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& shape,
                       const int32_t* key_ranges = nullptr);

// Writes (overwrites) d_qkv in the same fused layout as qkv.
void attention_backward(float* d_qkv, const float* d_out, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& shape,
                        const int32_t* key_ranges = nullptr);

// Queries over keys and values held elsewhere: q_len query rows per sequence (head h at column
// h * head_dim of a row of q, stride q_ld) over kv_len key/value rows per sequence (key head g at
// column g * head_dim of a row of kv, value head g at (kv_heads + g) * head_dim, stride kv_ld):
// context parallelism's local queries over the keys and values gathered from the whole
// sequence, or over one block of them (ring attention). key_ranges ([batch * q_len, 2],
// required) are in kv rows: 0 <= begin <= end <= kv_len; a row with begin == end sees no key
// here: its output is 0 and its lse -inf, and its backward adds nothing. out [batch * q_len,
// heads * head_dim], lse [batch, heads, q_len]. Self-attention is the case q = kv rows; the
// arithmetic is the same code.
struct CrossAttentionShape {
  int64_t batch, q_len, kv_len, heads, kv_heads, head_dim;
};
void cross_attention_forward(float* out, float* lse, const float* q, int64_t q_ld, const float* kv,
                             int64_t kv_ld, const CrossAttentionShape& shape, const int32_t* key_ranges);
// Writes (overwrites) the query columns of d_q's rows and all of d_kv's key and value columns.
void cross_attention_backward(float* d_q, float* d_kv, const float* d_out, const float* q, int64_t q_ld,
                              const float* kv, int64_t kv_ld, const float* out, const float* lse,
                              const CrossAttentionShape& shape, const int32_t* key_ranges);

// out, lse += part, part_lse as partial softmaxes over disjoint keys (ops::merge_attention_
// partials): out [batch * seq, heads * head_dim], lse [batch, heads, seq].
void merge_attention_partials(float* out, float* lse, const float* part, const float* part_lse,
                              int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim);

}  // namespace loom::cpu
