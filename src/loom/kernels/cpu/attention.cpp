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

// Where every operand lives: query rows of one buffer, key and value rows of another (the same
// fused qkv buffer for self-attention), each with its own leading dimension and length per
// sequence, and the gradients' buffers laid out alike.
struct Operands {
  const float* q;
  int64_t q_ld, q_len;
  const float* kv;
  int64_t kv_ld, kv_len, k_col, v_col;  // key head g at column k_col + g * d, value at v_col + g * d
  int64_t batch, heads, kv_heads, d;
  int64_t group() const { return heads / kv_heads; }
  const float* q_row(int64_t b, int64_t i, int64_t h) const { return q + (b * q_len + i) * q_ld + h * d; }
  int64_t k_offset(int64_t b, int64_t j, int64_t g) const { return (b * kv_len + j) * kv_ld + k_col + g * d; }
  int64_t v_offset(int64_t b, int64_t j, int64_t g) const { return (b * kv_len + j) * kv_ld + v_col + g * d; }
};

Operands fused(const float* qkv, const AttentionShape& s) {
  const int64_t ld = s.qkv_ld(), d = s.head_dim;
  return {qkv, ld, s.seq_len, qkv, ld, s.seq_len, s.heads * d, (s.heads + s.kv_heads) * d,
          s.batch, s.heads, s.kv_heads, d};
}

Operands separate(const float* q, int64_t q_ld, const float* kv, int64_t kv_ld, const CrossAttentionShape& s) {
  return {q, q_ld, s.q_len, kv, kv_ld, s.kv_len, 0, s.kv_heads * s.head_dim,
          s.batch, s.heads, s.kv_heads, s.head_dim};
}

// The keys query row `row` (of the flattened batch * q_len rows) sees: [begin, end).
struct KeyRange {
  int64_t begin, end;
};
inline KeyRange key_range(const int32_t* ranges, int64_t row, int64_t i) {
  if (!ranges) return {0, i + 1};
  return {ranges[2 * row], ranges[2 * row + 1]};
}

// The keys any row of a query tile sees: the tile's key tiles start at `begin`, so a causal
// tile (every begin 0) walks the same tiles as before ranges existed.
// Rows that see no key (cross-attention over a block outside their range) add nothing.
KeyRange tile_keys(const int32_t* ranges, int64_t first_row, int64_t i0, int64_t rows) {
  KeyRange all{std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  for (int64_t r = 0; r < rows; ++r) {
    const KeyRange k = key_range(ranges, first_row + r, i0 + r);
    if (k.begin >= k.end) continue;
    all.begin = std::min(all.begin, k.begin);
    all.end = std::max(all.end, k.end);
  }
  return all.begin < all.end ? all : KeyRange{0, 0};
}

// The columns [start, stop) of a key tile at j0 (cols wide) that a row with keys `k` sees.
inline KeyRange visible_columns(const KeyRange& k, int64_t j0, int64_t cols) {
  return {std::clamp<int64_t>(k.begin - j0, 0, cols), std::clamp<int64_t>(k.end - j0, 0, cols)};
}

void forward_impl(float* out, float* lse, const Operands& o, const int32_t* ranges) {
  const int64_t d = o.d, out_ld = o.heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t query_tiles = (o.q_len + kQueryTile - 1) / kQueryTile;
  const int64_t tasks = o.batch * o.heads * query_tiles;
#pragma omp parallel
  {
    std::vector<float> scores(kQueryTile * kKeyTile), acc(kQueryTile * d);
    std::vector<float> row_max(kQueryTile), row_sum(kQueryTile);
    // Later query tiles see more keys: dynamic scheduling evens out the causal triangle.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = tasks - 1; task >= 0; --task) {
      const int64_t tile = task % query_tiles, h = (task / query_tiles) % o.heads;
      const int64_t b = task / (query_tiles * o.heads), g = h / o.group();
      const int64_t i0 = tile * kQueryTile, rows = std::min(kQueryTile, o.q_len - i0);
      const int64_t first_row = b * o.q_len + i0;
      const KeyRange keys = tile_keys(ranges, first_row, i0, rows);
      const float* q = o.q_row(b, i0, h);
      std::fill(acc.begin(), acc.begin() + rows * d, 0.0f);
      std::fill(row_max.begin(), row_max.end(), kNegInf);
      std::fill(row_sum.begin(), row_sum.end(), 0.0f);
      for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, keys.end - j0);
        float* sc = scores.data();
        sgemm(false, true, rows, cols, d, scale, q, o.q_ld, o.kv + o.k_offset(b, j0, g), o.kv_ld, 0.0f,
              sc, kKeyTile);
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
        sgemm(false, false, rows, d, cols, 1.0f, sc, kKeyTile, o.kv + o.v_offset(b, j0, g), o.kv_ld, 1.0f,
              acc.data(), d);
      }
      for (int64_t r = 0; r < rows; ++r) {
        // A row that saw no key: zero output and a log-sum-exp of -inf, which a merge of
        // partial results weighs by exp(-inf) = 0.
        const float inv = row_sum[r] > 0.0f ? 1.0f / row_sum[r] : 0.0f;
        float* dst = out + (b * o.q_len + i0 + r) * out_ld + h * d;
        for (int64_t c = 0; c < d; ++c) dst[c] = acc[r * d + c] * inv;
        lse[(b * o.heads + h) * o.q_len + i0 + r] = row_sum[r] > 0.0f ? row_max[r] + std::log(row_sum[r]) : kNegInf;
      }
    }
  }
}

// d_q and d_kv are laid out as o.q and o.kv (the same buffer for self-attention, whose query
// and key/value columns never overlap).
void backward_impl(float* d_q, float* d_kv, const float* d_out, const Operands& o, const float* out,
                   const float* lse, const int32_t* ranges) {
  const int64_t d = o.d, out_ld = o.heads * d, group = o.group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One task per (batch, kv head): it owns dK and dV of that head (shared by `group` query
  // heads) and dQ of those query heads, so no two threads write the same gradient.
#pragma omp parallel
  {
    std::vector<float> probs(kQueryTile * kKeyTile), d_scores(kQueryTile * kKeyTile);
    std::vector<float> d_query(kQueryTile * d), delta(kQueryTile);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < o.batch * o.kv_heads; ++task) {
      const int64_t b = task / o.kv_heads, g = task % o.kv_heads;
      for (int64_t t = 0; t < o.kv_len; ++t) {
        std::memset(d_kv + o.k_offset(b, t, g), 0, static_cast<size_t>(d) * sizeof(float));
        std::memset(d_kv + o.v_offset(b, t, g), 0, static_cast<size_t>(d) * sizeof(float));
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i0 = 0; i0 < o.q_len; i0 += kQueryTile) {
          const int64_t rows = std::min(kQueryTile, o.q_len - i0);
          const float* q = o.q_row(b, i0, h);
          const float* dout = d_out + (b * o.q_len + i0) * out_ld + h * d;
          const float* row_lse = lse + (b * o.heads + h) * o.q_len + i0;
          const int64_t first_row = b * o.q_len + i0;
          const KeyRange keys = tile_keys(ranges, first_row, i0, rows);
          for (int64_t r = 0; r < rows; ++r)  // D_i = dO_i . O_i = sum_j P_ij dP_ij
            delta[r] = dot(dout + r * out_ld, out + (b * o.q_len + i0 + r) * out_ld + h * d, d);
          std::fill(d_query.begin(), d_query.begin() + rows * d, 0.0f);
          for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kKeyTile) {
            const int64_t cols = std::min(kKeyTile, keys.end - j0);
            const float* k = o.kv + o.k_offset(b, j0, g);
            const float* v = o.kv + o.v_offset(b, j0, g);
            float* p = probs.data();
            float* ds = d_scores.data();
            sgemm(false, true, rows, cols, d, scale, q, o.q_ld, k, o.kv_ld, 0.0f, p, kKeyTile);
            sgemm(false, true, rows, cols, d, 1.0f, dout, out_ld, v, o.kv_ld, 0.0f, ds, kKeyTile);
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
                  d_kv + o.v_offset(b, j0, g), o.kv_ld);
            sgemm(true, false, cols, d, rows, 1.0f, ds, kKeyTile, q, o.q_ld, 1.0f,
                  d_kv + o.k_offset(b, j0, g), o.kv_ld);
            sgemm(false, false, rows, d, cols, 1.0f, ds, kKeyTile, k, o.kv_ld, 1.0f, d_query.data(), d);
          }
          float* dq = d_q + (q - o.q);  // the same row and column in d_q's layout
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(dq + r * o.q_ld, d_query.data() + r * d, static_cast<size_t>(d) * sizeof(float));
        }
      }
    }
  }
}
}  // namespace

void attention_forward(float* out, float* lse, const float* qkv, const AttentionShape& s,
                       const int32_t* ranges) {
  forward_impl(out, lse, fused(qkv, s), ranges);
}

void attention_backward(float* d_qkv, const float* d_out, const float* qkv, const float* out,
                        const float* lse, const AttentionShape& s, const int32_t* ranges) {
  backward_impl(d_qkv, d_qkv, d_out, fused(qkv, s), out, lse, ranges);
}

void cross_attention_forward(float* out, float* lse, const float* q, int64_t q_ld, const float* kv,
                             int64_t kv_ld, const CrossAttentionShape& s, const int32_t* key_ranges) {
  forward_impl(out, lse, separate(q, q_ld, kv, kv_ld, s), key_ranges);
}

void cross_attention_backward(float* d_q, float* d_kv, const float* d_out, const float* q, int64_t q_ld,
                              const float* kv, int64_t kv_ld, const float* out, const float* lse,
                              const CrossAttentionShape& s, const int32_t* key_ranges) {
  backward_impl(d_q, d_kv, d_out, separate(q, q_ld, kv, kv_ld, s), out, lse, key_ranges);
}

void merge_attention_partials(float* out, float* lse, const float* part, const float* part_lse,
                              int64_t batch, int64_t seq_len, int64_t heads, int64_t head_dim) {
  const int64_t out_ld = heads * head_dim;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < seq_len; ++t) {
        float& l = lse[(b * heads + h) * seq_len + t];
        const float p = part_lse[(b * heads + h) * seq_len + t];
        const float m = std::max(l, p);
        if (m == kNegInf) continue;  // neither saw a key
        const float w_old = std::exp(l - m), w_new = std::exp(p - m), sum = w_old + w_new;
        const float a = w_old / sum, c = w_new / sum;
        float* o = out + (b * seq_len + t) * out_ld + h * head_dim;
        const float* q = part + (b * seq_len + t) * out_ld + h * head_dim;
        for (int64_t k = 0; k < head_dim; ++k) o[k] = a * o[k] + c * q[k];
        l = m + std::log(sum);
      }
}

}  // namespace loom::cpu
