// The attention ops on CUDA (ops_cuda.hpp): causal attention, the same with key ranges (packed
// documents), queries over keys held elsewhere (context parallelism's blocks), the exact merge
// of partial results, and column copies between f32 and bf16 tensors.
#include <type_traits>

#include "loom/core/error.hpp"
#include "loom/kernels/cuda/attention.hpp"
#include "loom/kernels/cuda/elementwise.hpp"
#include "loom/kernels/cuda/ops_cuda.hpp"
#include "loom/kernels/cuda/ops_cuda_common.cuh"

namespace loom::ops::cuda_impl {

namespace {

template <typename T>
T* ptr(const Tensor& t, int64_t offset = 0) {
  return static_cast<T*>(t.raw()) + offset;
}

// Calls f(tag<TQ>, tag<TKV>, tag<TO>) for the element types the ranged kernels are built for
// (attention.hpp): q-side, k/v and output (or gradient) dtypes.
template <typename F>
void with_ranged_types(const char* op, DType q, DType kv, DType o, F f) {
  using std::type_identity;
  if (q == DType::F32 && kv == DType::F32 && o == DType::F32)
    return f(type_identity<float>{}, type_identity<float>{}, type_identity<float>{});
  if (q == DType::BF16 && kv == DType::BF16 && o == DType::BF16)
    return f(type_identity<bf16>{}, type_identity<bf16>{}, type_identity<bf16>{});
  if (q == DType::BF16 && kv == DType::F32 && o == DType::F32)
    return f(type_identity<bf16>{}, type_identity<float>{}, type_identity<float>{});
  if (q == DType::BF16 && kv == DType::F32 && o == DType::BF16)
    return f(type_identity<bf16>{}, type_identity<float>{}, type_identity<bf16>{});
  throw_error(
      "ops::", op, " (cuda): queries ", dtype_name(q), ", keys and values ", dtype_name(kv),
      ", results ", dtype_name(o),
      ": the kernels take all f32, all bf16, or bf16 queries with f32 keys and values (f32 or "
      "bf16 results)");
}

// Key ranges take the scalar ranged kernels; a process that demands the tensor cores
// (LOOM_CUDA_ATTENTION=tensor_cores or pipelined) is told so instead of silently getting them.
void refuse_forced_tensor_cores(const char* op) {
  const cuda::AttentionKernel kernel = cuda::attention_kernel();
  if (kernel == cuda::AttentionKernel::tensor_cores || kernel == cuda::AttentionKernel::pipelined ||
      kernel == cuda::AttentionKernel::cudnn)
    throw_error("ops::", op,
                " (cuda): ", kernel == cuda::AttentionKernel::cudnn ? "cuDNN" : "tensor-core",
                " attention (LOOM_CUDA_ATTENTION=",
                kernel == cuda::AttentionKernel::pipelined ? "pipelined"
                : kernel == cuda::AttentionKernel::cudnn   ? "cudnn"
                                                           : "tensor_cores",
                ") cannot take key ranges (packed documents); the ranged kernels are scalar: use "
                "LOOM_CUDA_ATTENTION=auto");
}

cuda::RangedAttentionShape self_shape(const AttentionShape& s) {
  return {s.batch, s.seq_len, s.seq_len, s.heads, s.kv_heads, s.head_dim};
}
cuda::RangedAttentionShape cross_shape(const CrossAttentionShape& s) {
  return {s.batch, s.q_len, s.kv_len, s.heads, s.kv_heads, s.head_dim};
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& shape, std::span<const int32_t> key_ranges) {
  if (shape.head_dim > cuda::kMaxAttentionHeadDim)
    throw_error("ops::attention_forward (cuda): head_dim ", shape.head_dim,
                " is above the kernel's ", cuda::kMaxAttentionHeadDim);
  const bool bf16_storage = is_bf16("attention_forward", {&out, &qkv});
  if (key_ranges.empty()) {
    if (bf16_storage)
      cuda::attention_forward(b16(out), f32(lse), b16(qkv), shape);
    else
      cuda::attention_forward(f32(out), f32(lse), f32(qkv), shape);
    return;
  }
  // Packed documents: the ranged kernels over the fused row's own k and v columns.
  refuse_forced_tensor_cores("attention_forward");
  const DeviceIds ranges(key_ranges.data(), static_cast<int64_t>(key_ranges.size()));
  const int64_t ld = shape.qkv_ld(), k_col = shape.heads * shape.head_dim,
                v_col = (shape.heads + shape.kv_heads) * shape.head_dim;
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::ranged_attention_forward(
        cuda::RangedForwardArgs<T, T, T>{ptr<T>(out), shape.out_ld(), f32(lse), ptr<T>(qkv), ld,
                                         ptr<T>(qkv, k_col), ptr<T>(qkv, v_col), ld, ranges.get()},
        self_shape(shape));
  };
  if (bf16_storage)
    run(std::type_identity<bf16>{});
  else
    run(std::type_identity<float>{});
}

void attention_backward(const Tensor& d_qkv, const Tensor& d_out, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, const AttentionShape& shape,
                        std::span<const int32_t> key_ranges) {
  const bool bf16_storage = is_bf16("attention_backward", {&d_qkv, &d_out, &qkv, &out});
  if (key_ranges.empty()) {
    if (bf16_storage)
      cuda::attention_backward(b16(d_qkv), b16(d_out), b16(qkv), b16(out), f32(lse), shape);
    else
      cuda::attention_backward(f32(d_qkv), f32(d_out), f32(qkv), f32(out), f32(lse), shape);
    return;
  }
  refuse_forced_tensor_cores("attention_backward");
  const DeviceIds ranges(key_ranges.data(), static_cast<int64_t>(key_ranges.size()));
  const int64_t ld = shape.qkv_ld(), k_col = shape.heads * shape.head_dim,
                v_col = (shape.heads + shape.kv_heads) * shape.head_dim;
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda::RangedBackwardArgs<T, T, T> a{};
    a.d_q = ptr<T>(d_qkv);
    a.d_q_ld = ld;
    a.d_k = ptr<T>(d_qkv, k_col);
    a.d_v = ptr<T>(d_qkv, v_col);
    a.d_kv_ld = ld;
    a.d_out = ptr<T>(d_out);
    a.out = ptr<T>(out);
    a.out_ld = shape.out_ld();
    a.lse = f32(lse);
    a.q = ptr<T>(qkv);
    a.q_ld = ld;
    a.k = ptr<T>(qkv, k_col);
    a.v = ptr<T>(qkv, v_col);
    a.kv_ld = ld;
    a.ranges = ranges.get();
    cuda::ranged_attention_backward(a, self_shape(shape));
  };
  if (bf16_storage)
    run(std::type_identity<bf16>{});
  else
    run(std::type_identity<float>{});
}

void cross_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                             const Tensor& kv, const CrossAttentionShape& shape,
                             std::span<const int32_t> key_ranges) {
  const DeviceIds ranges(key_ranges.data(), static_cast<int64_t>(key_ranges.size()));
  const int64_t kv_ld = kv.size(1), v_col = shape.kv_heads * shape.head_dim;
  with_ranged_types("cross_attention_forward", q.dtype(), kv.dtype(), out.dtype(),
                    [&](auto tq, auto tkv, auto to) {
                      using TQ = typename decltype(tq)::type;
                      using TKV = typename decltype(tkv)::type;
                      using TO = typename decltype(to)::type;
                      cuda::ranged_attention_forward(
                          cuda::RangedForwardArgs<TQ, TKV, TO>{
                              ptr<TO>(out), shape.heads * shape.head_dim, f32(lse), ptr<TQ>(q),
                              q.size(1), ptr<TKV>(kv), ptr<TKV>(kv, v_col), kv_ld, ranges.get()},
                          cross_shape(shape));
                    });
}

void cross_attention_backward(const Tensor& d_q, const Tensor& d_kv, const Tensor& d_out,
                              const Tensor& q, const Tensor& kv, const Tensor& out,
                              const Tensor& lse, const CrossAttentionShape& shape,
                              std::span<const int32_t> key_ranges) {
  if (d_q.dtype() != d_kv.dtype())
    throw_error("ops::cross_attention_backward (cuda): d_q is ", dtype_name(d_q.dtype()),
                " and d_kv ", dtype_name(d_kv.dtype()), "; both gradients take one dtype");
  (void)is_bf16("cross_attention_backward", {&q, &d_out, &out});  // the query side shares one dtype
  const DeviceIds ranges(key_ranges.data(), static_cast<int64_t>(key_ranges.size()));
  const int64_t v_col = shape.kv_heads * shape.head_dim;
  with_ranged_types("cross_attention_backward", q.dtype(), kv.dtype(), d_q.dtype(),
                    [&](auto tq, auto tkv, auto tg) {
                      using TQ = typename decltype(tq)::type;
                      using TKV = typename decltype(tkv)::type;
                      using TG = typename decltype(tg)::type;
                      cuda::RangedBackwardArgs<TQ, TKV, TG> a{};
                      a.d_q = ptr<TG>(d_q);
                      a.d_q_ld = d_q.size(1);
                      a.d_k = ptr<TG>(d_kv);
                      a.d_v = ptr<TG>(d_kv, v_col);
                      a.d_kv_ld = d_kv.size(1);
                      a.d_out = ptr<TQ>(d_out);
                      a.out = ptr<TQ>(out);
                      a.out_ld = shape.heads * shape.head_dim;
                      a.lse = f32(lse);
                      a.q = ptr<TQ>(q);
                      a.q_ld = q.size(1);
                      a.k = ptr<TKV>(kv);
                      a.v = ptr<TKV>(kv, v_col);
                      a.kv_ld = kv.size(1);
                      a.ranges = ranges.get();
                      cuda::ranged_attention_backward(a, cross_shape(shape));
                    });
}

void merge_attention_partials(const Tensor& out, const Tensor& lse, const Tensor& part,
                              const Tensor& part_lse, int64_t batch, int64_t heads) {
  for (const Tensor* t : {&out, &lse, &part, &part_lse})
    if (t->dtype() != DType::F32)
      throw_error("ops::merge_attention_partials (cuda): a ", dtype_name(t->dtype()), " tensor ",
                  shape_to_string(t->shape()), "; partial results merge in f32");
  const int64_t rows = out.size(0);
  cuda::merge_attention_partials(f32(out), f32(lse), f32(part), f32(part_lse), batch, rows / batch,
                                 heads, out.size(1) / heads);
}

void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col,
                  int64_t cols) {
  const int64_t rows = dst.size(0), dst_ld = dst.size(1), src_ld = src.size(1);
  const bool dst_bf16 = dst.dtype() == DType::BF16, src_bf16 = src.dtype() == DType::BF16;
  for (const Tensor* t : {&dst, &src})
    if (t->dtype() != DType::F32 && t->dtype() != DType::BF16)
      throw_error("ops::copy_columns (cuda): a ", dtype_name(t->dtype()),
                  " tensor; it copies f32 and bf16");
  if (dst_bf16 && src_bf16)
    cuda::copy_columns(b16(dst) + dst_col, dst_ld, b16(src) + src_col, src_ld, rows, cols);
  else if (dst_bf16)
    cuda::copy_columns(b16(dst) + dst_col, dst_ld, f32(src) + src_col, src_ld, rows, cols);
  else if (src_bf16)
    cuda::copy_columns(f32(dst) + dst_col, dst_ld, b16(src) + src_col, src_ld, rows, cols);
  else
    cuda::copy_columns(f32(dst) + dst_col, dst_ld, f32(src) + src_col, src_ld, rows, cols);
}

}  // namespace loom::ops::cuda_impl
