// Causal flash attention on tensor cores with its memory traffic off the critical path: the
// algorithm of attention_mma.cu (FlashAttention-2, Dao 2023: online softmax forward; backward
// from the saved lse, dK/dV and dQ each computed by one owner, no atomics, so the result is
// deterministic), with the three things that kernel lacks and FlashAttention-2 has:
// - tiles are copied global -> shared with cp.async into two stages, the next tile's copy in
//   flight while the current one is multiplied;
// - every fragment is read with ldmatrix, and operands whose k runs along the sequence (V in
//   P V; dO and Q in dV and dK; K in dQ) with ldmatrix.trans from the row-major tile, so no
//   tile is ever stored transposed (the scalar 2-byte transposing stores of attention_mma.cu
//   took a bank conflict per 8 lanes);
// - at head_dim 64 each forward warp owns 32 query rows (two m16 tiles), so every K and V
//   fragment read from shared memory feeds two products.
//
// Layout: 4 warps; shared rows carry 8 bf16 of padding (a row stride of 144 or 272 bytes, an odd
// number of 16-byte units), so the 8 row addresses of each ldmatrix phase fall in distinct bank
// groups. Softmax runs in base 2 as in attention_mma.cu; lse is stored as the natural-log
// statistic. Fragment layouts: attention_fragments.cuh.
#include <cuda_bf16.h>

#include "loom/kernels/cuda/attention_fragments.cuh"
#include "loom/kernels/cuda/attention_mma.cuh"

namespace loom::cuda::detail {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kKeys = 64;  // keys per tile in the forward and dQ kernels, per CTA in dK/dV
constexpr int kPad = 8;

template <int D>
constexpr int kStride = D + kPad;  // elements per shared row

// Rows [row0, row0 + kRows) of a [seq, D] bf16 slice (rows at stride ld) into a shared tile
// [kRows][D + 8], 16 bytes per cp.async; rows past the sequence end are zero-filled (their
// source is not read). The caller commits the group.
template <int D, int kRows>
__device__ __forceinline__ void copy_rows_async(bf16* tile, const bf16* src, int64_t ld, int row0,
                                                int seq) {
  constexpr int kVectors = D / 8;
  static_assert((kRows * kVectors) % kThreads == 0, "every thread issues the same copies");
#pragma unroll
  for (int idx = threadIdx.x; idx < kRows * kVectors; idx += kThreads) {
    const int r = idx / kVectors, v = idx % kVectors;
    const bool valid = row0 + r < seq;
    const bf16* from = src + (valid ? int64_t{row0 + r} * ld : int64_t{0}) + v * 8;
    copy_async_16(tile + r * kStride<D> + v * 8, from, valid);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward: one CTA per (query tile of 64 kM rows, head, batch), heaviest (latest) tiles first.
// Warp w's m tile mi holds query rows i0 + 64 mi + 16 w + [0, 16), so both halves of a CTA's
// rows, and so the causal work, are spread over every warp. Shared memory: two stages of
// {K, V} [64][D + 8]; the Q tile is first copied into stage 1 (it is the same size or smaller),
// read into registers, and stage 1 is then free for the second key tile.
template <int D, int kM>
constexpr size_t forward_shared_bytes() {
  static_assert(kWarps * 16 * kM <= 2 * kKeys, "the Q tile fits in one {K, V} stage");
  return size_t(4) * kKeys * kStride<D> * sizeof(bf16);
}

template <int D, int kM>
__global__ void __launch_bounds__(kThreads)
    pipelined_forward_kernel(bf16* out, float* lse, const bf16* qkv, AttentionDims d) {
  constexpr int kS = kStride<D>, kRows = kWarps * 16 * kM, kDimTiles = D / 8, kSlabs = D / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* const stages = reinterpret_cast<bf16*>(smem);  // stage s: K at 2s, V at 2s + 1
  auto k_stage = [&](int s) { return stages + (2 * s) * kKeys * kS; };
  auto v_stage = [&](int s) { return stages + (2 * s + 1) * kKeys * kS; };

  const int query_tiles = (d.seq + kRows - 1) / kRows;
  const int q_tile = query_tiles - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / d.group;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int i0 = q_tile * kRows;
  const bf16* base = qkv + int64_t{b} * d.seq * d.qkv_ld;
  const bf16* k_src = base + k_column(d, kvh);
  const bf16* v_src = base + v_column(d, kvh);
  const float scale_log2 = d.scale * kLog2e;
  // Keys up to the CTA's last row (or the sequence's end).
  const int key_tiles = (min(i0 + kRows, d.seq) - 1) / kKeys + 1;

  int row[kM][2];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
    for (int r = 0; r < 2; ++r) row[mi][r] = i0 + 64 * mi + 16 * warp + g + 8 * r;

  // Group 1: Q into stage 1. Group 2: key tile 0 into stage 0.
  copy_rows_async<D, kRows>(k_stage(1), base + q_column(d, h), d.qkv_ld, i0, d.seq);
  commit_copies();
  copy_rows_async<D, kKeys>(k_stage(0), k_src, d.qkv_ld, 0, d.seq);
  copy_rows_async<D, kKeys>(v_stage(0), v_src, d.qkv_ld, 0, d.seq);
  commit_copies();
  wait_copies<1>();  // Q has landed
  __syncthreads();
  uint32_t qf[kM][kSlabs][4];
#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int kk = 0; kk < kSlabs; ++kk)
      fragment_a(qf[mi][kk], k_stage(1), kS, 64 * mi + 16 * warp, 16 * kk, lane);
  __syncthreads();  // stage 1 is rewritten by key tile 1's copies

  float o[kM][kDimTiles][4];
  float m[kM][2], l[kM][2];  // running max (base 2) and this lane's part of the running sum
#pragma unroll
  for (int mi = 0; mi < kM; ++mi) {
#pragma unroll
    for (int dt = 0; dt < kDimTiles; ++dt)
      o[mi][dt][0] = o[mi][dt][1] = o[mi][dt][2] = o[mi][dt][3] = 0.0f;
    m[mi][0] = m[mi][1] = kNegInfinity;
    l[mi][0] = l[mi][1] = 0.0f;
  }

  for (int kt = 0; kt < key_tiles; ++kt) {
    const int stage = kt & 1, j0 = kt * kKeys;
    if (kt + 1 < key_tiles) {
      copy_rows_async<D, kKeys>(k_stage(stage ^ 1), k_src, d.qkv_ld, j0 + kKeys, d.seq);
      copy_rows_async<D, kKeys>(v_stage(stage ^ 1), v_src, d.qkv_ld, j0 + kKeys, d.seq);
    }
    commit_copies();   // possibly empty, so that one pending group always means "the next tile"
    wait_copies<1>();  // this tile has landed
    __syncthreads();
    const bf16* k_tile = k_stage(stage);
    const bf16* v_tile = v_stage(stage);
    // With two m tiles, the CTA's last key tile lies wholly above the first m tile's rows
    // (i0 .. i0 + 63): its products, softmax update and P V would add exactly nothing there, so
    // they are skipped (the same for every warp: no divergence).
    const bool skip_first = kM == 2 && j0 >= i0 + 64;

    float s[kM][8][4];
#pragma unroll
    for (int mi = 0; mi < kM; ++mi)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
        s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSlabs; ++kk)
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t kb[4];
        fragments_b_along_rows(kb, k_tile, kS, 16 * np, 16 * kk, lane);
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          if (mi == 0 && skip_first) continue;
          mma(s[mi][2 * np], qf[mi][kk], kb[0], kb[1]);
          mma(s[mi][2 * np + 1], qf[mi][kk], kb[2], kb[3]);
        }
      }

    // Causal mask where a key can pass the CTA's first row, and keys past the end.
    const bool masked = j0 + kKeys - 1 > i0 || j0 + kKeys > d.seq;
#pragma unroll
    for (int mi = 0; mi < kM; ++mi) {
      if (mi == 0 && skip_first) continue;
      float tile_max[2] = {kNegInfinity, kNegInfinity};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j0 + nt * 8 + 2 * t + (e & 1), r = e >> 1;
          float v = s[mi][nt][e] * scale_log2;
          if (masked && (key > row[mi][r] || key >= d.seq)) v = kNegInfinity;
          s[mi][nt][e] = v;
          tile_max[r] = fmaxf(tile_max[r], v);
        }
      float reference[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float new_m = fmaxf(m[mi][r], row_quad_max(tile_max[r]));
        // A row that has seen no visible key keeps exp2(-inf - 0) = 0 rather than NaN; every
        // row sees key 0 in the first tile, so this is a guard, not a path.
        reference[r] = new_m == kNegInfinity ? 0.0f : new_m;
        const float correction = exp2f(m[mi][r] - reference[r]);
        m[mi][r] = new_m;
        l[mi][r] *= correction;
#pragma unroll
        for (int dt = 0; dt < kDimTiles; ++dt) {
          o[mi][dt][2 * r] *= correction;
          o[mi][dt][2 * r + 1] *= correction;
        }
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = exp2f(s[mi][nt][e] - reference[e >> 1]);
          s[mi][nt][e] = p;
          l[mi][e >> 1] += p;
        }
    }

#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t pa[kM][4];
#pragma unroll
      for (int mi = 0; mi < kM; ++mi) accumulators_to_a(pa[mi], s[mi][2 * ks], s[mi][2 * ks + 1]);
#pragma unroll
      for (int dp = 0; dp < kSlabs; ++dp) {
        uint32_t vb[4];
        fragments_b_down_rows(vb, v_tile, kS, 16 * ks, 16 * dp, lane);
#pragma unroll
        for (int mi = 0; mi < kM; ++mi) {
          if (mi == 0 && skip_first) continue;
          mma(o[mi][2 * dp], pa[mi], vb[0], vb[1]);
          mma(o[mi][2 * dp + 1], pa[mi], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // this stage is rewritten by the copies issued in the next iteration
  }

#pragma unroll
  for (int mi = 0; mi < kM; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float total = row_quad_sum(l[mi][r]);
      if (row[mi][r] >= d.seq) continue;
      const float inv = 1.0f / total;
      bf16* dst = out + (int64_t{b} * d.seq + row[mi][r]) * d.out_ld + q_column(d, h);
#pragma unroll
      for (int dt = 0; dt < kDimTiles; ++dt)  // inline: store_row here costs this kernel a spill
        store_pair(dst + dt * 8 + 2 * t, o[mi][dt][2 * r] * inv, o[mi][dt][2 * r + 1] * inv);
      if (t == 0)
        lse[(int64_t{b} * d.heads + h) * d.seq + row[mi][r]] = (m[mi][r] + log2f(total)) * kLn2;
    }
}

// ---------------------------------------------------------------------------------------------
// dK and dV: one CTA per (key tile of 64, kv head, batch); warp w owns keys j0 + 16 w + [0, 16).
// It walks every query head of the group and every kQ-query tile from the diagonal on, as one
// sequence of steps whose Q, dO, lse and delta are copied a step ahead into two stages.
// Products, with keys as rows: S^T = K Q^T and dP^T = V dO^T (B read along Q's and dO's rows),
// then dV += P^T dO and dK += dS^T Q (B read down their rows, transposed).
template <int D, int kQ>
constexpr size_t kv_shared_bytes() {
  return (size_t(2) * kKeys * kStride<D> + size_t(4) * kQ * kStride<D>)*sizeof(bf16) +
         size_t(4) * kQ * sizeof(float);
}

template <int D, int kQ>
__global__ void __launch_bounds__(kThreads)
    pipelined_backward_kv_kernel(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                                 const float* delta, AttentionDims d) {
  constexpr int kS = kStride<D>, kDimTiles = D / 8, kSlabs = D / 16, kQTiles = kQ / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* const k_s = reinterpret_cast<bf16*>(smem);  // [64][D + 8]
  bf16* const v_s = k_s + kKeys * kS;
  bf16* const q_stages = v_s + kKeys * kS;  // stage s: Q at 2s, dO at 2s + 1, each [kQ][D + 8]
  float* const stat_stages = reinterpret_cast<float*>(q_stages + 4 * kQ * kS);  // lse, delta
  auto q_stage = [&](int s) { return q_stages + (2 * s) * kQ * kS; };
  auto do_stage = [&](int s) { return q_stages + (2 * s + 1) * kQ * kS; };
  auto lse_stage = [&](int s) { return stat_stages + (2 * s) * kQ; };
  auto delta_stage = [&](int s) { return stat_stages + (2 * s + 1) * kQ; };

  const int kt = static_cast<int>(blockIdx.x), kvh = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4, w0 = 16 * warp;
  const int j0 = kt * kKeys;
  const int key[2] = {j0 + w0 + g, j0 + w0 + g + 8};
  const bf16* base = qkv + int64_t{b} * d.seq * d.qkv_ld;
  const bf16* d_out_base = d_out + int64_t{b} * d.seq * d.out_ld;
  const float scale_log2 = d.scale * kLog2e;
  const int first_tile = j0 / kQ;  // the first query tile reaching this key tile's diagonal
  const int per_head = (d.seq + kQ - 1) / kQ - first_tile;
  const int steps = d.group * per_head;

  // Step s's query head and first query row.
  auto head_of = [&](int s) { return kvh * d.group + s / per_head; };
  auto row0_of = [&](int s) { return (first_tile + s % per_head) * kQ; };
  auto copy_step = [&](int s) {
    const int h = head_of(s), i0 = row0_of(s), stage = s & 1;
    copy_rows_async<D, kQ>(q_stage(stage), base + q_column(d, h), d.qkv_ld, i0, d.seq);
    copy_rows_async<D, kQ>(do_stage(stage), d_out_base + q_column(d, h), d.out_ld, i0, d.seq);
    const float* stats = lse + (int64_t{b} * d.heads + h) * d.seq;
    const float* deltas = delta + (int64_t{b} * d.heads + h) * d.seq;
    for (int idx = threadIdx.x; idx < 2 * kQ; idx += kThreads) {
      const int r = idx % kQ;
      const bool valid = i0 + r < d.seq;
      const int at = valid ? i0 + r : 0;
      if (idx < kQ)
        copy_async_4(lse_stage(stage) + r, stats + at, valid);
      else
        copy_async_4(delta_stage(stage) + r, deltas + at, valid);
    }
  };

  // Group 1: K, V and step 0.
  copy_rows_async<D, kKeys>(k_s, base + k_column(d, kvh), d.qkv_ld, j0, d.seq);
  copy_rows_async<D, kKeys>(v_s, base + v_column(d, kvh), d.qkv_ld, j0, d.seq);
  copy_step(0);
  commit_copies();

  float dk[kDimTiles][4], dv[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.0f;

  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1, i0 = row0_of(step);
    if (step + 1 < steps) copy_step(step + 1);
    commit_copies();
    wait_copies<1>();
    __syncthreads();
    const bf16* q_tile = q_stage(stage);
    const bf16* do_tile = do_stage(stage);
    const float* lse_tile = lse_stage(stage);
    const float* delta_tile = delta_stage(stage);

    float st[kQTiles][4], dpt[kQTiles][4];  // keys x queries
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kSlabs; ++kk) {
      uint32_t ka[4], va[4];
      fragment_a(ka, k_s, kS, w0, 16 * kk, lane);
      fragment_a(va, v_s, kS, w0, 16 * kk, lane);
#pragma unroll
      for (int np = 0; np < kQ / 16; ++np) {
        uint32_t qb[4], ob[4];
        fragments_b_along_rows(qb, q_tile, kS, 16 * np, 16 * kk, lane);
        mma(st[2 * np], ka, qb[0], qb[1]);
        mma(st[2 * np + 1], ka, qb[2], qb[3]);
        fragments_b_along_rows(ob, do_tile, kS, 16 * np, 16 * kk, lane);
        mma(dpt[2 * np], va, ob[0], ob[1]);
        mma(dpt[2 * np + 1], va, ob[2], ob[3]);
      }
    }
    // P^T, and dS^T / scale (the scale is applied to dK once, at the end).
#pragma unroll
    for (int nt = 0; nt < kQTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int local = nt * 8 + 2 * t + (e & 1), query = i0 + local;
        const int r = e >> 1;
        const bool visible = query >= key[r] && query < d.seq && key[r] < d.seq;
        const float p = visible ? exp2f(st[nt][e] * scale_log2 - lse_tile[local] * kLog2e) : 0.0f;
        st[nt][e] = p;
        dpt[nt][e] = p * (dpt[nt][e] - delta_tile[local]);
      }
#pragma unroll
    for (int ks = 0; ks < kQ / 16; ++ks) {
      uint32_t pa[4], dsa[4];
      accumulators_to_a(pa, st[2 * ks], st[2 * ks + 1]);
      accumulators_to_a(dsa, dpt[2 * ks], dpt[2 * ks + 1]);
#pragma unroll
      for (int dp = 0; dp < kSlabs; ++dp) {
        uint32_t ob[4], qb[4];
        fragments_b_down_rows(ob, do_tile, kS, 16 * ks, 16 * dp, lane);
        mma(dv[2 * dp], pa, ob[0], ob[1]);  // dV += P^T dO
        mma(dv[2 * dp + 1], pa, ob[2], ob[3]);
        fragments_b_down_rows(qb, q_tile, kS, 16 * ks, 16 * dp, lane);
        mma(dk[2 * dp], dsa, qb[0], qb[1]);  // dK += dS^T Q
        mma(dk[2 * dp + 1], dsa, qb[2], qb[3]);
      }
    }
    __syncthreads();  // this stage is rewritten by the copies issued in the next iteration
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= d.seq) continue;
    bf16* dst = d_qkv + (int64_t{b} * d.seq + key[r]) * d.qkv_ld;
    store_row(dst + k_column(d, kvh), dk, r, t, d.scale);
    store_row(dst + v_column(d, kvh), dv, r, t, 1.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// dQ: one CTA per (query tile of 64, head, batch) over the key tiles up to the diagonal, copied
// a tile ahead into two {K, V} stages; warp w owns query rows i0 + 16 w + [0, 16), with its Q
// and dO fragments in registers (copied first into stage 1, as in the forward). Keys are taken
// kN at a time (32 at head_dim 128, to keep S and dP in registers beside dQ).
template <int D>
constexpr size_t q_shared_bytes() {
  return size_t(4) * kKeys * kStride<D> * sizeof(bf16);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    pipelined_backward_q_kernel(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                                const float* delta, AttentionDims d) {
  constexpr int kS = kStride<D>, kDimTiles = D / 8, kSlabs = D / 16;
  constexpr int kN = D == 64 ? 64 : 32, kNTiles = kN / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* const stages = reinterpret_cast<bf16*>(smem);  // stage s: K at 2s, V at 2s + 1
  auto k_stage = [&](int s) { return stages + (2 * s) * kKeys * kS; };
  auto v_stage = [&](int s) { return stages + (2 * s + 1) * kKeys * kS; };

  const int q_tile = d.tiles - 1 - static_cast<int>(blockIdx.x);  // heaviest first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / d.group;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int g = lane / 4, t = lane % 4, w0 = 16 * warp;
  const int i0 = q_tile * kKeys;
  const int row[2] = {i0 + w0 + g, i0 + w0 + g + 8};
  const bf16* base = qkv + int64_t{b} * d.seq * d.qkv_ld;
  const bf16* k_src = base + k_column(d, kvh);
  const bf16* v_src = base + v_column(d, kvh);
  const float scale_log2 = d.scale * kLog2e;

  // Group 1: Q and dO into stage 1. Group 2: key tile 0 into stage 0.
  copy_rows_async<D, kKeys>(k_stage(1), base + q_column(d, h), d.qkv_ld, i0, d.seq);
  copy_rows_async<D, kKeys>(v_stage(1), d_out + int64_t{b} * d.seq * d.out_ld + q_column(d, h),
                            d.out_ld, i0, d.seq);
  commit_copies();
  copy_rows_async<D, kKeys>(k_stage(0), k_src, d.qkv_ld, 0, d.seq);
  copy_rows_async<D, kKeys>(v_stage(0), v_src, d.qkv_ld, 0, d.seq);
  commit_copies();

  float lse2[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const bool valid = row[r] < d.seq;
    const int64_t at = (int64_t{b} * d.heads + h) * d.seq + row[r];
    lse2[r] = valid ? lse[at] * kLog2e : 0.0f;
    row_delta[r] = valid ? delta[at] : 0.0f;
  }

  wait_copies<1>();  // Q and dO have landed
  __syncthreads();
  uint32_t qf[kSlabs][4], of[kSlabs][4];
#pragma unroll
  for (int kk = 0; kk < kSlabs; ++kk) {
    fragment_a(qf[kk], k_stage(1), kS, w0, 16 * kk, lane);
    fragment_a(of[kk], v_stage(1), kS, w0, 16 * kk, lane);
  }
  __syncthreads();  // stage 1 is rewritten by key tile 1's copies

  float dq[kDimTiles][4];
#pragma unroll
  for (int dt = 0; dt < kDimTiles; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

  const int key_tiles = q_tile + 1;  // through the diagonal
  for (int kt = 0; kt < key_tiles; ++kt) {
    const int stage = kt & 1, j0 = kt * kKeys;
    if (kt + 1 < key_tiles) {
      copy_rows_async<D, kKeys>(k_stage(stage ^ 1), k_src, d.qkv_ld, j0 + kKeys, d.seq);
      copy_rows_async<D, kKeys>(v_stage(stage ^ 1), v_src, d.qkv_ld, j0 + kKeys, d.seq);
    }
    commit_copies();
    wait_copies<1>();
    __syncthreads();
    const bf16* k_tile = k_stage(stage);
    const bf16* v_tile = v_stage(stage);

#pragma unroll
    for (int c0 = 0; c0 < kKeys; c0 += kN) {
      float s[kNTiles][4], dp[kNTiles][4];  // S = Q K^T and dP = dO V^T
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kSlabs; ++kk)
#pragma unroll
        for (int np = 0; np < kN / 16; ++np) {
          uint32_t kb[4], vb[4];
          fragments_b_along_rows(kb, k_tile, kS, c0 + 16 * np, 16 * kk, lane);
          mma(s[2 * np], qf[kk], kb[0], kb[1]);
          mma(s[2 * np + 1], qf[kk], kb[2], kb[3]);
          fragments_b_along_rows(vb, v_tile, kS, c0 + 16 * np, 16 * kk, lane);
          mma(dp[2 * np], of[kk], vb[0], vb[1]);
          mma(dp[2 * np + 1], of[kk], vb[2], vb[3]);
        }
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j0 + c0 + nt * 8 + 2 * t + (e & 1), r = e >> 1;
          const bool visible = key <= row[r] && key < d.seq && row[r] < d.seq;
          const float p = visible ? exp2f(s[nt][e] * scale_log2 - lse2[r]) : 0.0f;
          s[nt][e] = p * (dp[nt][e] - row_delta[r]);  // dS / scale
        }
#pragma unroll
      for (int ks = 0; ks < kN / 16; ++ks) {
        uint32_t dsa[4];
        accumulators_to_a(dsa, s[2 * ks], s[2 * ks + 1]);
#pragma unroll
        for (int dt2 = 0; dt2 < kSlabs; ++dt2) {
          uint32_t kb[4];
          fragments_b_down_rows(kb, k_tile, kS, c0 + 16 * ks, 16 * dt2, lane);
          mma(dq[2 * dt2], dsa, kb[0], kb[1]);  // dQ += dS K
          mma(dq[2 * dt2 + 1], dsa, kb[2], kb[3]);
        }
      }
    }
    __syncthreads();  // this stage is rewritten by the copies issued in the next iteration
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= d.seq) continue;
    store_row(d_qkv + (int64_t{b} * d.seq + row[r]) * d.qkv_ld + q_column(d, h), dq, r, t, d.scale);
  }
}

// Two m tiles per warp at head_dim 64 (each K and V fragment feeds two products); one at 128,
// where two would not fit the registers beside 128-wide accumulators.
template <int D>
constexpr int kForwardMTiles = D == 64 ? 2 : 1;
// Queries per dK/dV step: 32 at head_dim 128 keeps S^T and dP^T in registers beside dK and dV.
template <int D>
constexpr int kKvQueries = D == 64 ? 64 : 32;

// The launches below are the host's; tools/cuda_emulation launches the kernels itself.
#if !defined(LOOM_CUDA_EMULATION)
template <int D>
void forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d, cudaStream_t stream) {
  constexpr int kM = kForwardMTiles<D>, kRows = kWarps * 16 * kM;
  constexpr size_t bytes = forward_shared_bytes<D, kM>();
  allow_shared_memory(pipelined_forward_kernel<D, kM>, bytes);
  const dim3 grid(static_cast<unsigned>((d.seq + kRows - 1) / kRows),
                  static_cast<unsigned>(d.heads), static_cast<unsigned>(d.batch));
  pipelined_forward_kernel<D, kM><<<grid, kThreads, bytes, stream>>>(out, lse, qkv, d);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <int D>
void backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse, const float* delta,
              const AttentionDims& d, cudaStream_t stream) {
  constexpr int kQ = kKvQueries<D>;
  constexpr size_t kv_bytes = kv_shared_bytes<D, kQ>(), q_bytes = q_shared_bytes<D>();
  allow_shared_memory(pipelined_backward_kv_kernel<D, kQ>, kv_bytes);
  allow_shared_memory(pipelined_backward_q_kernel<D>, q_bytes);
  const auto tiles = static_cast<unsigned>(d.tiles);  // 64-row tiles: kKeys == kAttnTile
  static_assert(kKeys == kAttnTile, "d.tiles counts 64-row tiles");
  pipelined_backward_kv_kernel<D, kQ>
      <<<dim3(tiles, static_cast<unsigned>(d.kv_heads), static_cast<unsigned>(d.batch)), kThreads,
         kv_bytes, stream>>>(d_qkv, d_out, qkv, lse, delta, d);
  LOOM_CUDA_CHECK_LAUNCH();
  pipelined_backward_q_kernel<D>
      <<<dim3(tiles, static_cast<unsigned>(d.heads), static_cast<unsigned>(d.batch)), kThreads,
         q_bytes, stream>>>(d_qkv, d_out, qkv, lse, delta, d);
  LOOM_CUDA_CHECK_LAUNCH();
}
#endif  // !LOOM_CUDA_EMULATION

}  // namespace

#if !defined(LOOM_CUDA_EMULATION)
void pipelined_attention_forward(bf16* out, float* lse, const bf16* qkv, const AttentionDims& d,
                                 cudaStream_t stream) {
  if (d.head_dim == 64)
    forward<64>(out, lse, qkv, d, stream);
  else if (d.head_dim == 128)
    forward<128>(out, lse, qkv, d, stream);
  else
    throw_error("pipelined tensor-core attention takes head_dim 64 or 128, got ", d.head_dim);
}

void pipelined_attention_backward(bf16* d_qkv, const bf16* d_out, const bf16* qkv, const float* lse,
                                  const float* delta, const AttentionDims& d, cudaStream_t stream) {
  if (d.head_dim == 64)
    backward<64>(d_qkv, d_out, qkv, lse, delta, d, stream);
  else if (d.head_dim == 128)
    backward<128>(d_qkv, d_out, qkv, lse, delta, d, stream);
  else
    throw_error("pipelined tensor-core attention takes head_dim 64 or 128, got ", d.head_dim);
}
#endif  // !LOOM_CUDA_EMULATION

}  // namespace loom::cuda::detail
