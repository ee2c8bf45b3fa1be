#include "loom/kernels/cpu/vocab_shard.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "loom/kernels/cpu/fast_math.hpp"
#include "loom/kernels/cpu/gemm.hpp"

namespace loom::cpu {

void embedding_shard_forward(float* out, const int32_t* tokens, const float* table, int64_t rows,
                             int64_t dim, int64_t vocab_begin, int64_t vocab_end) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = out + r * dim;
    const int64_t t = tokens[r];
    if (t >= vocab_begin && t < vocab_end)
      std::copy_n(table + (t - vocab_begin) * dim, dim, dst);
    else
      std::fill_n(dst, dim, 0.0f);
  }
}

void embedding_shard_backward(float* d_table, const float* d_out, const int32_t* tokens,
                              int64_t rows, int64_t dim, int64_t vocab_begin, int64_t vocab_end) {
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t c0 = dim * thread / threads, c1 = dim * (thread + 1) / threads;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tokens[r];
      if (t < vocab_begin || t >= vocab_end) continue;
      const float* src = d_out + r * dim;
      float* dst = d_table + (t - vocab_begin) * dim;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

void add_position_rows(float* out, const float* table, int64_t rows, int64_t dim, int64_t first_row,
                       int64_t seq_len, const int32_t* positions) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* p =
        table + (positions ? positions[first_row + r] : (first_row + r) % seq_len) * dim;
    float* o = out + r * dim;
    for (int64_t c = 0; c < dim; ++c) o[c] += p[c];
  }
}

void position_rows_backward(float* d_table, const float* d_out, int64_t rows, int64_t dim,
                            int64_t first_row, int64_t seq_len, const int32_t* positions) {
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t c0 = dim * thread / threads, c1 = dim * (thread + 1) / threads;
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = d_out + r * dim;
      float* dst =
          d_table + (positions ? positions[first_row + r] : (first_row + r) % seq_len) * dim;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

void add_row_vector(float* out, const float* v, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) out[r * width + j] += v[j];
}

namespace {
int64_t chunk_of(const ShardLogits& a) { return std::max<int64_t>(std::min(a.chunk, a.shard), 1); }

void chunk_logits(const ShardLogits& a, int64_t chunk, int64_t v0, int64_t width) {
  sgemm(false, true, a.rows, width, a.dim, 1.0f, a.hidden, a.dim, a.weight + v0 * a.dim, a.dim,
        0.0f, a.logits, chunk);
}
}  // namespace

void shard_logit_stats(const ShardLogits& a, float* row_max, float* row_sum, float* target_logit) {
  const int64_t chunk = chunk_of(a), rows = a.rows;
  for (int64_t r = 0; r < rows; ++r) {
    row_max[r] = -INFINITY;
    row_sum[r] = 0.0f;
  }
  for (int64_t v0 = 0; v0 < a.shard; v0 += chunk) {
    const int64_t width = std::min(chunk, a.shard - v0);
    chunk_logits(a, chunk, v0, width);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* zr = a.logits + r * chunk;
      float m = row_max[r];
      for (int64_t j = 0; j < width; ++j) m = std::max(m, zr[j]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < width; ++j) sum += fast_exp(zr[j] - m);
      row_sum[r] = row_sum[r] * std::exp(row_max[r] - m) + sum;
      row_max[r] = m;
      const int64_t t = a.targets[r] - a.vocab_begin;  // negative targets never land in range
      if (a.targets[r] >= 0 && t >= v0 && t < v0 + width) target_logit[r] = zr[t - v0];
    }
  }
}

void shard_logit_grad(const ShardLogits& a, const float* lse, float grad_scale, float* d_hidden,
                      float* d_weight, bool logits_kept) {
  const int64_t chunk = chunk_of(a), rows = a.rows, dim = a.dim;
  const bool one_chunk = chunk >= a.shard;
  for (int64_t v0 = 0; v0 < a.shard; v0 += chunk) {
    const int64_t width = std::min(chunk, a.shard - v0);
    if (!(one_chunk && logits_kept)) chunk_logits(a, chunk, v0, width);
    float* z = a.logits;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* zr = z + r * chunk;
      if (a.targets[r] < 0) {
        std::fill(zr, zr + width, 0.0f);
        continue;
      }
      const float row_lse = lse[r];
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) zr[j] = grad_scale * fast_exp(zr[j] - row_lse);
      const int64_t t = a.targets[r] - a.vocab_begin;
      if (t >= v0 && t < v0 + width) zr[t - v0] -= grad_scale;
    }
    if (d_hidden)
      sgemm(false, false, rows, dim, width, 1.0f, z, chunk, a.weight + v0 * dim, dim,
            v0 == 0 ? 0.0f : 1.0f, d_hidden, dim);
    if (d_weight)
      sgemm(true, false, width, dim, rows, 1.0f, z, chunk, a.hidden, dim, 1.0f, d_weight + v0 * dim,
            dim);
  }
}

}  // namespace loom::cpu
