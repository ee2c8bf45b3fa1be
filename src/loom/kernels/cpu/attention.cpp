#include "loom/kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "loom/kernels/cpu/fast_math.hpp"
#include "loom/kernels/cpu/gemm.hpp"

namespace loom::cpu {

namespace {
// Query rows and keys per tile. 64 x 64 f32 score tiles (16 KiB) and 64 x head_dim operand
// tiles stay in L1/L2; the tile products go through SGEMM (single-threaded inside our
// parallel region, as OpenBLAS does when called from an OpenMP worker).
constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Column offsets of query head h and of its key / value head in a fused qkv row.
struct HeadColumns {
  int64_t q, k, v;
};
HeadColumns head_columns(const AttentionShape& s, int64_t h) {
  const int64_t kvh = h / (s.heads / s.kv_heads);
  return {h * s.head_dim, (s.heads + kvh) * s.head_dim, (s.heads + s.kv_heads + kvh) * s.head_dim};
}

// The keys query row `row` (of the flattened batch * seq rows) sees: [begin, end).
struct KeyRange {
  int64_t begin, end;
};
inline KeyRange key_range(const int32_t* ranges, int64_t row, int64_t i) {
  if (!ranges) return {0, i + 1};
  return {ranges[2 * row], ranges[2 * row + 1]};
}

// The keys any row of a query tile sees: the tile's key tiles start at `begin`, so a causal
// tile (every begin 0) walks the same tiles as before ranges existed.
KeyRange tile_keys(const int32_t* ranges, int64_t first_row, int64_t i0, int64_t rows) {
  KeyRange all = key_range(ranges, first_row, i0);
  for (int64_t r = 1; r < rows; ++r) {
    const KeyRange k = key_range(ranges, first_row + r, i0 + r);
    all.begin = std::min(all.begin, k.begin);
    all.end = std::max(all.end, k.end);
  }
  return all;
}

// The columns [start, stop) of a key tile at j0 (cols wide) that a row with keys `k` sees.
inline KeyRange visible_columns(const KeyRange& k, int64_t j0, int64_t cols) {
  return {std::clamp<int64_t>(k.begin - j0, 0, cols), std::clamp<int64_t>(k.end - j0, 0, cols)};
}
}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& s,
                       const int32_t* ranges) {
  const int64_t ld = s.qkv_ld(), d = s.head_dim, out_ld = s.out_ld();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t query_tiles = (s.seq_len + kQueryTile - 1) / kQueryTile;
  const int64_t tasks = s.batch * s.heads * query_tiles;
#pragma omp parallel
  {
    std::vector<float> scores(kQueryTile * kKeyTile), acc(kQueryTile * d);
    std::vector<float> row_max(kQueryTile), row_sum(kQueryTile);
    // Later query tiles see more keys: dynamic scheduling evens out the causal triangle.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = tasks - 1; task >= 0; --task) {
      const int64_t tile = task % query_tiles, h = (task / query_tiles) % s.heads;
      const int64_t b = task / (query_tiles * s.heads);
      const HeadColumns col = head_columns(s, h);
      const int64_t i0 = tile * kQueryTile, rows = std::min(kQueryTile, s.seq_len - i0);
      const int64_t first_row = b * s.seq_len + i0;
      const KeyRange keys = tile_keys(ranges, first_row, i0, rows);
      const float* base = qkv + b * s.seq_len * ld;
      const float* q = base + i0 * ld + col.q;
      std::fill(acc.begin(), acc.begin() + rows * d, 0.0f);
      std::fill(row_max.begin(), row_max.end(), kNegInf);
      std::fill(row_sum.begin(), row_sum.end(), 0.0f);
      for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, keys.end - j0);
        float* sc = scores.data();
        sgemm(false, true, rows, cols, d, scale, q, ld, base + j0 * ld + col.k, ld, 0.0f, sc, kKeyTile);
        for (int64_t r = 0; r < rows; ++r) {
          float* srow = sc + r * kKeyTile;
          const KeyRange seen = visible_columns(key_range(ranges, first_row + r, i0 + r), j0, cols);
          if (seen.begin >= seen.end) {  // none of this tile: the row's running state stands
            std::fill(srow, srow + cols, 0.0f);
            continue;
          }
          float tile_max = kNegInf;
          for (int64_t c = seen.begin; c < seen.end; ++c) tile_max = std::max(tile_max, srow[c]);
          const float new_max = std::max(row_max[r], tile_max);
          const float correction = std::exp(row_max[r] - new_max);  // exp(-inf) = 0 first time
          float sum = 0.0f;
          for (int64_t c = 0; c < seen.begin; ++c) srow[c] = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t c = seen.begin; c < seen.end; ++c) sum += (srow[c] = fast_exp(srow[c] - new_max));
          for (int64_t c = seen.end; c < cols; ++c) srow[c] = 0.0f;
          row_sum[r] = row_sum[r] * correction + sum;
          row_max[r] = new_max;
          if (correction != 1.0f)
            for (int64_t c = 0; c < d; ++c) acc[r * d + c] *= correction;
        }
        sgemm(false, false, rows, d, cols, 1.0f, sc, kKeyTile, base + j0 * ld + col.v, ld, 1.0f,
              acc.data(), d);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.0f / row_sum[r];
        float* o = out + (b * s.seq_len + i0 + r) * out_ld + h * d;
        for (int64_t c = 0; c < d; ++c) o[c] = acc[r * d + c] * inv;
        lse[(b * s.heads + h) * s.seq_len + i0 + r] = row_max[r] + std::log(row_sum[r]);
      }
    }
  }
}

void attention_backward(float* d_qkv, const float* d_out, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& s, const int32_t* ranges) {
  const int64_t ld = s.qkv_ld(), d = s.head_dim, out_ld = s.out_ld();
  const int64_t group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One task per (batch, kv head): it owns dK and dV of that head (shared by `group` query
  // heads) and dQ of those query heads, so no two threads write the same gradient.
#pragma omp parallel
  {
    std::vector<float> probs(kQueryTile * kKeyTile), d_scores(kQueryTile * kKeyTile);
    std::vector<float> d_query(kQueryTile * d), delta(kQueryTile);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < s.batch * s.kv_heads; ++task) {
      const int64_t b = task / s.kv_heads, kvh = task % s.kv_heads;
      const float* base = qkv + b * s.seq_len * ld;
      float* d_base = d_qkv + b * s.seq_len * ld;
      const HeadColumns first = head_columns(s, kvh * group);
      for (int64_t t = 0; t < s.seq_len; ++t) {
        std::memset(d_base + t * ld + first.k, 0, static_cast<size_t>(d) * sizeof(float));
        std::memset(d_base + t * ld + first.v, 0, static_cast<size_t>(d) * sizeof(float));
      }
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const HeadColumns col = head_columns(s, h);
        for (int64_t i0 = 0; i0 < s.seq_len; i0 += kQueryTile) {
          const int64_t rows = std::min(kQueryTile, s.seq_len - i0);
          const float* q = base + i0 * ld + col.q;
          const float* dout = d_out + (b * s.seq_len + i0) * out_ld + h * d;
          const float* row_lse = lse + (b * s.heads + h) * s.seq_len + i0;
          const int64_t first_row = b * s.seq_len + i0;
          const KeyRange keys = tile_keys(ranges, first_row, i0, rows);
          for (int64_t r = 0; r < rows; ++r)  // D_i = dO_i . O_i = sum_j P_ij dP_ij
            delta[r] = dot(dout + r * out_ld, out + (b * s.seq_len + i0 + r) * out_ld + h * d, d);
          std::fill(d_query.begin(), d_query.begin() + rows * d, 0.0f);
          for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kKeyTile) {
            const int64_t cols = std::min(kKeyTile, keys.end - j0);
            const float* k = base + j0 * ld + col.k;
            const float* v = base + j0 * ld + col.v;
            float* p = probs.data();
            float* ds = d_scores.data();
            sgemm(false, true, rows, cols, d, scale, q, ld, k, ld, 0.0f, p, kKeyTile);
            sgemm(false, true, rows, cols, d, 1.0f, dout, out_ld, v, ld, 0.0f, ds, kKeyTile);
            for (int64_t r = 0; r < rows; ++r) {
              const KeyRange seen =
                  visible_columns(key_range(ranges, first_row + r, i0 + r), j0, cols);
              float* prow = p + r * kKeyTile;
              float* dsrow = ds + r * kKeyTile;
              const float l = row_lse[r], dl = delta[r];
              for (int64_t c = 0; c < seen.begin; ++c) prow[c] = dsrow[c] = 0.0f;
#pragma omp simd
              for (int64_t c = seen.begin; c < seen.end; ++c) {
                prow[c] = fast_exp(prow[c] - l);
                dsrow[c] = prow[c] * (dsrow[c] - dl) * scale;
              }
              for (int64_t c = std::max(seen.begin, seen.end); c < cols; ++c) prow[c] = dsrow[c] = 0.0f;
            }
            // dV += P^T dO; dK += dS^T Q; dQ += dS K
            sgemm(true, false, cols, d, rows, 1.0f, p, kKeyTile, dout, out_ld, 1.0f,
                  d_base + j0 * ld + col.v, ld);
            sgemm(true, false, cols, d, rows, 1.0f, ds, kKeyTile, q, ld, 1.0f,
                  d_base + j0 * ld + col.k, ld);
            sgemm(false, false, rows, d, cols, 1.0f, ds, kKeyTile, k, ld, 1.0f, d_query.data(), d);
          }
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(d_base + (i0 + r) * ld + col.q, d_query.data() + r * d,
                        static_cast<size_t>(d) * sizeof(float));
        }
      }
    }
  }
}

}  // namespace loom::cpu
