// The ops that packed documents and context parallelism add, on CUDA against the CPU (the
// reference, itself checked against PyTorch and by gradient checks in tests/test_kernels.cpp):
// attention with key ranges, queries over another rank's key/value block with f32 or bf16
// storage, the exact merge of partial results, column copies that convert, and position ids in
// RoPE, the embedding and learned-position rows.
// Tolerances: f32 differs from the CPU only in summation order and libdevice's expf (rtol 1e-4,
// atol 1e-5 x max|want|, test_cuda_attention.cpp's bound). A bf16 result is the f32 one rounded
// once (2^-9 relative) on top of that: rtol 2^-8. The CPU gets the same bf16 values as inputs.
// A row that sees no key must give exactly 0 and an lse of exactly -inf on both devices.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "gpu_test_support.hpp"
#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/ops.hpp"
#include "tensor_test_support.hpp"

namespace loom::cuda::test {
namespace {

constexpr double kF32Rel = 1e-4, kBf16Rel = 1.0 / 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// |got - want| <= rel |want| + 1e-5 max|want| everywhere; -inf (a row without keys) must match
// exactly.
void expect_close(const Tensor& device, const Tensor& reference, double rel,
                  const std::string& what) {
  const auto got = device.to_f32_vector(), want = reference.to_f32_vector();
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (float w : want)
    if (std::isfinite(w)) scale = std::max(scale, std::abs(double(w)));
  const double abs = 1e-5 * scale;
  for (size_t i = 0; i < got.size(); ++i) {
    if (want[i] == kNegInf) {
      ASSERT_EQ(got[i], kNegInf) << what << ": element " << i << " should see no key";
      continue;
    }
    ASSERT_LE(std::abs(double(got[i]) - want[i]), abs + rel * std::abs(double(want[i])))
        << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
  }
}

// Packed documents: each row sees its document's keys up to itself. Documents end after an
// end-of-text token at random places (about one in 20 tokens), so tiles hold several.
std::vector<int32_t> document_ranges(int64_t batch, int64_t seq, uint32_t seed) {
  const auto u = random_vector(static_cast<size_t>(batch * seq), seed, 0.0f, 1.0f);
  std::vector<int32_t> ranges(static_cast<size_t>(2 * batch * seq));
  for (int64_t b = 0; b < batch; ++b) {
    int32_t begin = 0;
    for (int64_t t = 0; t < seq; ++t) {
      const size_t row = static_cast<size_t>(b * seq + t);
      ranges[2 * row] = begin;
      ranges[2 * row + 1] = static_cast<int32_t>(t + 1);
      if (u[row] < 0.05f) begin = static_cast<int32_t>(t + 1);  // this token ends its document
    }
  }
  return ranges;
}

// Key ranges into a block of kv_len keys: every fifth row sees none, the rest a random run.
std::vector<int32_t> block_ranges(int64_t rows, int64_t kv_len, uint32_t seed) {
  const auto u = random_vector(static_cast<size_t>(2 * rows), seed, 0.0f, 1.0f);
  std::vector<int32_t> ranges(static_cast<size_t>(2 * rows));
  for (int64_t r = 0; r < rows; ++r) {
    auto a = static_cast<int32_t>(u[2 * r] * float(kv_len + 1)),
         b = static_cast<int32_t>(u[2 * r + 1] * float(kv_len + 1));
    a = std::min<int32_t>(a, int32_t(kv_len)), b = std::min<int32_t>(b, int32_t(kv_len));
    if (r % 5 == 0) b = a;
    ranges[2 * r] = std::min(a, b);
    ranges[2 * r + 1] = std::max(a, b);
  }
  return ranges;
}

class CudaContextOps : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    set_attention_kernel(AttentionKernel::scalar);  // the causal comparison below is against these
  }
  void TearDown() override { set_attention_kernel(AttentionKernel::automatic); }
};

const ops::AttentionShape kDocumentShapes[] = {
    {2, 150, 4, 2, 32},   // three query tiles, the last partial; GQA
    {1, 130, 2, 2, 64},   // the 64-wide instantiation
    {1, 100, 2, 1, 128},  // the 128-wide one, both heads on one kv head
};

TEST_F(CudaContextOps, PackedDocumentAttentionMatchesTheCpuInF32AndBf16) {
  for (const ops::AttentionShape& s : kDocumentShapes) {
    const std::string name =
        "seq " + std::to_string(s.seq_len) + " head_dim " + std::to_string(s.head_dim);
    const int64_t rows = s.batch * s.seq_len;
    const auto ranges = document_ranges(s.batch, s.seq_len, 21);
    const Tensor qkv = host_tensor(random_vector(rows * s.qkv_ld(), 22), {rows, s.qkv_ld()});
    const Tensor d_out = host_tensor(random_vector(rows * s.out_ld(), 23), {rows, s.out_ld()});
    Tensor out = host_zeros({rows, s.out_ld()}), lse = host_zeros({s.batch, s.heads, s.seq_len});
    Tensor d_qkv = host_zeros({rows, s.qkv_ld()});
    ops::attention_forward(out, lse, qkv, s, ranges);
    ops::attention_backward(d_qkv, d_out, qkv, out, lse, s, ranges);

    Tensor out_d = cuda_zeros(out.shape()), lse_d = cuda_zeros(lse.shape()),
           d_qkv_d = cuda_zeros(d_qkv.shape());
    const Tensor qkv_d = on_cuda(qkv);
    ops::attention_forward(out_d, lse_d, qkv_d, s, ranges);
    ops::attention_backward(d_qkv_d, on_cuda(d_out), qkv_d, out_d, lse_d, s, ranges);
    expect_close(out_d, out, kF32Rel, name + " f32 out");
    expect_close(lse_d, lse, kF32Rel, name + " f32 lse");
    expect_close(d_qkv_d, d_qkv, kF32Rel, name + " f32 d_qkv");

    // bf16 storage: the CPU computes from the same bf16 values, the GPU rounds each result once.
    const Tensor qkv_r = rounded(qkv), d_out_r = rounded(d_out);
    Tensor out_b = cuda_zeros(out.shape(), DType::BF16),
           d_qkv_b = cuda_zeros(d_qkv.shape(), DType::BF16);
    ops::attention_forward(out_b, lse_d, on_cuda(qkv_r, DType::BF16), s, ranges);
    const Tensor out_r =
        host_tensor(out_b.to_f32_vector(), out.shape());  // the GPU's own bf16 output
    ops::attention_forward(out, lse, qkv_r, s, ranges);
    expect_close(out_b, out, kBf16Rel, name + " bf16 out");
    expect_close(lse_d, lse, kF32Rel, name + " bf16 lse");
    ops::attention_backward(d_qkv_b, on_cuda(d_out_r, DType::BF16), on_cuda(qkv_r, DType::BF16),
                            out_b, lse_d, s, ranges);
    ops::attention_backward(d_qkv, d_out_r, qkv_r, out_r, lse, s, ranges);
    expect_close(d_qkv_b, d_qkv, kBf16Rel, name + " bf16 d_qkv");
  }
}

// Ranges (0, i + 1) are the causal mask: the ranged kernels walk the same tiles in the same order
// as the causal ones, so the forward agrees to the bit (and so does the backward with one query
// head per kv head, where the dK/dV sums run in the same order).
TEST_F(CudaContextOps, CausalRangesGiveTheCausalKernelsBits) {
  const ops::AttentionShape s{2, 150, 3, 3, 32};
  const int64_t rows = s.batch * s.seq_len;
  std::vector<int32_t> causal(static_cast<size_t>(2 * rows));
  for (int64_t r = 0; r < rows; ++r)
    causal[2 * r] = 0, causal[2 * r + 1] = static_cast<int32_t>(r % s.seq_len + 1);
  const Tensor qkv = on_cuda(host_tensor(random_vector(rows * s.qkv_ld(), 31), {rows, s.qkv_ld()}));
  const Tensor d_out =
      on_cuda(host_tensor(random_vector(rows * s.out_ld(), 32), {rows, s.out_ld()}));
  Tensor out1 = cuda_zeros({rows, s.out_ld()}), out2 = cuda_zeros({rows, s.out_ld()});
  Tensor lse1 = cuda_zeros({s.batch, s.heads, s.seq_len}),
         lse2 = cuda_zeros({s.batch, s.heads, s.seq_len});
  Tensor d1 = cuda_zeros({rows, s.qkv_ld()}), d2 = cuda_zeros({rows, s.qkv_ld()});
  ops::attention_forward(out1, lse1, qkv, s);
  ops::attention_forward(out2, lse2, qkv, s, causal);
  ops::attention_backward(d1, d_out, qkv, out1, lse1, s);
  ops::attention_backward(d2, d_out, qkv, out2, lse2, s, causal);
  EXPECT_EQ(out1.to_f32_vector(), out2.to_f32_vector());
  EXPECT_EQ(lse1.to_f32_vector(), lse2.to_f32_vector());
  EXPECT_EQ(d1.to_f32_vector(), d2.to_f32_vector());
}

// A ring step: this rank's queries (the first H D columns of wider qkv rows) over a block of
// another rank's keys and values, rows that see none of it included; all f32, then bf16 queries
// over f32 blocks with f32 results (the ring's partials and travelling gradients) and bf16
// results (all-gather's output).
void check_queries_over_a_block(const ops::CrossAttentionShape& s,
                                const std::vector<int32_t>& ranges, const std::string& label) {
  const int64_t q_rows = s.batch * s.q_len, kv_rows = s.batch * s.kv_len;
  const int64_t q_ld = (s.heads + 2 * s.kv_heads) * s.head_dim, kv_ld = 2 * s.kv_heads * s.head_dim,
                out_ld = s.heads * s.head_dim;
  const Tensor q = host_tensor(random_vector(q_rows * q_ld, 42), {q_rows, q_ld});
  const Tensor kv = host_tensor(random_vector(kv_rows * kv_ld, 43), {kv_rows, kv_ld});
  const Tensor d_out = host_tensor(random_vector(q_rows * out_ld, 44), {q_rows, out_ld});
  for (const bool bf16_queries : {false, true}) {
    const std::string name = label + (bf16_queries ? ", bf16 queries over f32 keys" : ", f32");
    const Tensor q_ref = bf16_queries ? rounded(q) : q,
                 d_out_ref = bf16_queries ? rounded(d_out) : d_out;
    const DType q_type = bf16_queries ? DType::BF16 : DType::F32;
    Tensor out = host_zeros({q_rows, out_ld}), lse = host_zeros({s.batch, s.heads, s.q_len});
    ops::cross_attention_forward(out, lse, q_ref, kv, s, ranges);
    const Tensor q_d = on_cuda(q_ref, q_type), kv_d = on_cuda(kv);
    Tensor out_d = cuda_zeros(out.shape()), lse_d = cuda_zeros(lse.shape());
    ops::cross_attention_forward(out_d, lse_d, q_d, kv_d, s, ranges);
    expect_close(out_d, out, kF32Rel, name + ": out");
    expect_close(lse_d, lse, kF32Rel, name + ": lse");
    // The backward reads out and d_out in the queries' dtype.
    const Tensor out_q = bf16_queries ? rounded(out) : out;
    Tensor d_q = host_zeros(q.shape()), d_kv = host_zeros(kv.shape());
    ops::cross_attention_backward(d_q, d_kv, d_out_ref, q_ref, kv, out_q, lse, s, ranges);
    Tensor d_q_d = cuda_zeros(q.shape()), d_kv_d = cuda_zeros(kv.shape());
    ops::cross_attention_backward(d_q_d, d_kv_d, on_cuda(d_out_ref, q_type), q_d, kv_d,
                                  on_cuda(out_q, q_type), lse_d, s, ranges);
    // The query gradient's columns past H D are not written: compare the heads' columns only.
    Tensor heads = host_zeros({q_rows, out_ld}), heads_d = cuda_zeros({q_rows, out_ld});
    ops::copy_columns(heads, 0, d_q, 0, out_ld);
    ops::copy_columns(heads_d, 0, d_q_d, 0, out_ld);
    expect_close(heads_d, heads, kF32Rel, name + ": d_q");
    expect_close(d_kv_d, d_kv, kF32Rel, name + ": d_kv");
    if (bf16_queries) {  // the same forward straight into a bf16 output
      Tensor out_b = cuda_zeros(out.shape(), DType::BF16);
      ops::cross_attention_forward(out_b, lse_d, q_d, kv_d, s, ranges);
      expect_close(out_b, out, kBf16Rel, name + ": bf16 out");
    }
  }
  // Rows without keys: exactly zero output and an lse of -inf on both sides.
  Tensor out = cuda_zeros({q_rows, out_ld}), lse = cuda_zeros({s.batch, s.heads, s.q_len});
  ops::cross_attention_forward(out, lse, on_cuda(q), on_cuda(kv), s, ranges);
  const auto o = out.to_f32_vector(), l = lse.to_f32_vector();
  for (int64_t r = 0; r < q_rows; ++r) {
    if (ranges[2 * r] != ranges[2 * r + 1]) continue;
    const int64_t b = r / s.q_len, i = r % s.q_len;
    for (int64_t c = 0; c < out_ld; ++c)
      ASSERT_EQ(o[r * out_ld + c], 0.0f) << label << ": row " << r;
    for (int64_t h = 0; h < s.heads; ++h)
      ASSERT_EQ(l[(b * s.heads + h) * s.q_len + i], kNegInf) << label << ": row " << r;
  }
}

TEST_F(CudaContextOps, QueriesOverAKeyBlockMatchTheCpu) {
  // Random runs over the block, every fifth row empty.
  const ops::CrossAttentionShape mixed{2, 80, 70, 4, 2, 32};
  check_queries_over_a_block(mixed, block_ranges(mixed.batch * mixed.q_len, mixed.kv_len, 41),
                             "random runs");
  // A ring block's shape: the first query tile sees nothing (its forward walks no key tile and
  // the dK/dV kernel skips it), the rest see keys inside the second key tile only (the first
  // key tile's gradient is exactly zero); head_dim 128.
  const ops::CrossAttentionShape ring{1, 130, 130, 2, 1, 128};
  std::vector<int32_t> ranges(2 * 130);
  for (int64_t i = 64; i < 130; ++i)
    ranges[2 * i] = 64 + int32_t(i % 7), ranges[2 * i + 1] = 100 + int32_t(i % 5);
  check_queries_over_a_block(ring, ranges, "one key tile");
}

TEST_F(CudaContextOps, UnbuiltTypeMixesAreRefusedWithWhatTheKernelsTake) {
  const ops::CrossAttentionShape s{1, 16, 16, 2, 2, 16};
  const std::vector<int32_t> ranges(2 * 16, 0);
  Tensor out = cuda_zeros({16, 32}), lse = cuda_zeros({1, 2, 16});
  const Tensor q = cuda_zeros({16, 96}), kv = cuda_zeros({16, 64}, DType::BF16);
  try {
    ops::cross_attention_forward(out, lse, q, kv, s, ranges);
    FAIL() << "f32 queries over bf16 keys were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 queries with f32 keys"), std::string::npos)
        << e.what();
  }
  // Key ranges run on the scalar kernels: a process that demands the tensor cores is told so.
  set_attention_kernel(AttentionKernel::tensor_cores);
  const ops::AttentionShape self{1, 16, 2, 2, 64};
  std::vector<int32_t> causal(2 * 16);
  for (int32_t i = 0; i < 16; ++i) causal[2 * i] = 0, causal[2 * i + 1] = i + 1;
  Tensor self_out = cuda_zeros({16, 128}, DType::BF16), self_lse = cuda_zeros({1, 2, 16});
  try {
    ops::attention_forward(self_out, self_lse, cuda_zeros({16, 384}, DType::BF16), self, causal);
    FAIL() << "key ranges ran under LOOM_CUDA_ATTENTION=tensor_cores";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot take key ranges"), std::string::npos) << e.what();
  }
}

TEST_F(CudaContextOps, MergingPartialsMatchesTheCpu) {
  const int64_t batch = 2, seq = 40, heads = 3, dim = 16, rows = batch * seq;
  Tensor out = host_tensor(random_vector(rows * heads * dim, 51), {rows, heads * dim});
  const Tensor part = host_tensor(random_vector(rows * heads * dim, 52), {rows, heads * dim});
  auto lse_values = random_vector(batch * heads * seq, 53, -2.0f, 4.0f);
  auto part_values = random_vector(batch * heads * seq, 54, -2.0f, 4.0f);
  for (size_t i = 0; i < lse_values.size(); i += 7)
    lse_values[i] = kNegInf;  // no key in the result yet
  for (size_t i = 0; i < part_values.size(); i += 5) part_values[i] = kNegInf;  // none in the part
  Tensor lse = host_tensor(lse_values, {batch, heads, seq});
  const Tensor part_lse = host_tensor(part_values, {batch, heads, seq});
  Tensor out_d = on_cuda(out), lse_d = on_cuda(lse);
  ops::merge_attention_partials(out, lse, part, part_lse, batch, heads);
  ops::merge_attention_partials(out_d, lse_d, on_cuda(part), on_cuda(part_lse), batch, heads);
  expect_close(out_d, out, 1e-6, "merged out");
  expect_close(lse_d, lse, 1e-6, "merged lse");
}

TEST_F(CudaContextOps, ColumnCopiesConvertLikeTheHost) {
  const Tensor src = host_tensor(random_vector(30 * 12, 61, -3.0f, 3.0f), {30, 12});
  const Tensor src_d = on_cuda(src);
  Tensor wide = cuda_zeros({30, 20}), narrow = cuda_zeros({30, 20}, DType::BF16);
  ops::copy_columns(wide, 5, src_d, 2, 8);    // f32 -> f32: exact
  ops::copy_columns(narrow, 3, src_d, 2, 8);  // f32 -> bf16: round to nearest even
  const auto w = wide.to_f32_vector(), n = narrow.to_f32_vector();
  for (int64_t r = 0; r < 30; ++r)
    for (int64_t c = 0; c < 20; ++c) {
      const float x = c >= 5 && c < 13 ? src.f32()[r * 12 + c - 3] : 0.0f;
      ASSERT_EQ(w[r * 20 + c], x) << r << "," << c;
      const float y = c >= 3 && c < 11 ? bf16_to_f32(f32_to_bf16(src.f32()[r * 12 + c - 1])) : 0.0f;
      ASSERT_EQ(n[r * 20 + c], y) << r << "," << c;
    }
  Tensor back = cuda_zeros({30, 8});
  ops::copy_columns(back, 0, narrow, 3, 8);  // bf16 -> f32: exact
  const auto b = back.to_f32_vector();
  for (int64_t r = 0; r < 30; ++r)
    for (int64_t c = 0; c < 8; ++c) ASSERT_EQ(b[r * 8 + c], n[r * 20 + 3 + c]);
}

// Position ids (restarting per document, or a cp rank's global positions) in RoPE, the token
// embedding's learned positions and a block of learned-position rows, forward and backward.
TEST_F(CudaContextOps, PositionIdsMatchTheCpu) {
  const int64_t batch = 2, seq = 12, rows = batch * seq, dim = 16, heads = 3, table_rows = 32;
  std::vector<int32_t> positions(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) positions[r] = static_cast<int32_t>((7 * r + 3) % table_rows);
  const ops::Rope rope(dim, table_rows, 10000.0);
  const Tensor x = host_tensor(random_vector(rows * heads * dim, 71), {rows, heads * dim});
  for (const DType dtype : {DType::F32, DType::BF16}) {
    Tensor cpu = dtype == DType::BF16 ? rounded(x) : x.clone(MemCategory::Workspace);
    Tensor gpu = on_cuda(cpu, dtype);
    rope.apply(cpu, batch, seq, heads, false, positions);
    rope.apply(gpu, batch, seq, heads, false, positions);
    expect_close(gpu, cpu, dtype == DType::BF16 ? kBf16Rel : 1e-5, "rope with positions");
  }
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>((5 * r + 1) % 40);
  const Tensor table = host_tensor(random_vector(40 * dim, 72), {40, dim});
  const Tensor pos_table = host_tensor(random_vector(table_rows * dim, 73), {table_rows, dim});
  Tensor emb = host_zeros({rows, dim}), emb_d = cuda_zeros({rows, dim});
  const Tensor pos_table_d = on_cuda(pos_table);
  ops::embedding_forward(emb, tokens.data(), table, &pos_table, batch, seq, positions);
  ops::embedding_forward(emb_d, tokens.data(), on_cuda(table), &pos_table_d, batch, seq, positions);
  expect_close(emb_d, emb, 0, "embedding with positions (a copy and one add)");
  const Tensor d_out = host_tensor(random_vector(rows * dim, 74), {rows, dim});
  Tensor d_tok = host_zeros({40, dim}), d_pos = host_zeros({table_rows, dim});
  Tensor d_tok_d = cuda_zeros({40, dim}), d_pos_d = cuda_zeros({table_rows, dim});
  ops::embedding_backward(d_tok, &d_pos, d_out, tokens.data(), batch, seq, positions);
  ops::embedding_backward(d_tok_d, &d_pos_d, on_cuda(d_out), tokens.data(), batch, seq, positions);
  expect_close(d_tok_d, d_tok, 1e-6, "embedding backward, tokens");
  expect_close(d_pos_d, d_pos, 1e-6, "embedding backward, positions");
  // Rows 8..19 of the batch as one block (sequence parallelism's slice), positions by id.
  const Tensor block = host_tensor(random_vector(12 * dim, 75), {12, dim});
  Tensor block_cpu = block.clone(MemCategory::Workspace), block_gpu = on_cuda(block);
  ops::add_position_rows(block_cpu, pos_table, 8, seq, positions);
  ops::add_position_rows(block_gpu, pos_table_d, 8, seq, positions);
  expect_close(block_gpu, block_cpu, 0, "position rows with ids");
  Tensor g = host_zeros({table_rows, dim}), g_d = cuda_zeros({table_rows, dim});
  ops::position_rows_backward(g, block, 8, seq, positions);
  ops::position_rows_backward(g_d, on_cuda(block), 8, seq, positions);
  expect_close(g_d, g, 1e-6, "position rows backward with ids");
}

}  // namespace
}  // namespace loom::cuda::test
