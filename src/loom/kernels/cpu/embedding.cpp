#include "loom/kernels/cpu/embedding.hpp"

#include <algorithm>

#include <omp.h>

namespace loom::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* token_table,
                       const float* position_table, int64_t batch, int64_t seq_len, int64_t dim,
                       const int32_t* positions) {
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < batch * seq_len; ++row) {
    const float* tok = token_table + static_cast<int64_t>(tokens[row]) * dim;
    float* dst = out + row * dim;
    if (position_table) {
      const float* pos = position_table + (positions ? positions[row] : row % seq_len) * dim;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) dst[i] = tok[i] + pos[i];
    } else {
      std::copy(tok, tok + dim, dst);
    }
  }
}

void embedding_backward(float* d_token_table, float* d_position_table, const float* d_out,
                        const int32_t* tokens, int64_t batch, int64_t seq_len, int64_t dim,
                        const int32_t* positions) {
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t begin = dim * thread / threads, end = dim * (thread + 1) / threads;
    for (int64_t row = 0; row < batch * seq_len; ++row) {
      const float* src = d_out + row * dim;
      float* tok = d_token_table + static_cast<int64_t>(tokens[row]) * dim;
      for (int64_t i = begin; i < end; ++i) tok[i] += src[i];
      if (d_position_table) {
        float* pos = d_position_table + (positions ? positions[row] : row % seq_len) * dim;
        for (int64_t i = begin; i < end; ++i) pos[i] += src[i];
      }
    }
  }
}

}  // namespace loom::cpu
