#pragma once
// Token (and learned position) embedding lookup and its backward.
#include <cstdint>

namespace loom::cpu {

// out[b*t, dim] = token_table[tokens[b*t]] (+ position_table[position] when position_table !=
// null, position = positions[b*t], or t without them).
void embedding_forward(float* out, const int32_t* tokens, const float* token_table,
                       const float* position_table, int64_t batch, int64_t seq_len, int64_t dim,
                       const int32_t* positions = nullptr);

// d_token_table[tokens[i]] += d_out[i]; d_position_table[t] += sum over batch of d_out[b, t].
// Threads split the channel dimension, so repeated tokens never race.
void embedding_backward(float* d_token_table, float* d_position_table, const float* d_out,
                        const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t dim,
                        const int32_t* positions = nullptr);

}  // namespace loom::cpu
