#include <utility>

#include "loom/core/cuda/cuda_check.hpp"
#include "loom/kernels/cuda/device_common.cuh"
#include "loom/kernels/cuda/rope.hpp"

namespace loom::cuda {

RopeTableDevice::RopeTableDevice(const cpu::RopeTable& table)
    : head_dim_(table.head_dim), max_positions_(table.max_positions) {
  const size_t bytes = table.cos.size() * sizeof(float);
  LOOM_CHECK(table.sin.size() == table.cos.size(), "RoPE table with ", table.cos.size(),
             " cos and ", table.sin.size(), " sin entries");
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&cos_), bytes));
  LOOM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&sin_), bytes));
  // On the current stream, and done before any kernel on any stream reads the tables.
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(cos_, table.cos.data(), bytes, cudaMemcpyHostToDevice, current_stream()));
  LOOM_CUDA_CHECK(
      cudaMemcpyAsync(sin_, table.sin.data(), bytes, cudaMemcpyHostToDevice, current_stream()));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
}

RopeTableDevice::~RopeTableDevice() {
  if (cos_) (void)cudaFree(cos_);
  if (sin_) (void)cudaFree(sin_);
}

RopeTableDevice::RopeTableDevice(RopeTableDevice&& other) noexcept
    : head_dim_(other.head_dim_),
      max_positions_(other.max_positions_),
      cos_(std::exchange(other.cos_, nullptr)),
      sin_(std::exchange(other.sin_, nullptr)) {}

RopeTableDevice& RopeTableDevice::operator=(RopeTableDevice&& other) noexcept {
  if (this != &other) {
    if (cos_) (void)cudaFree(cos_);
    if (sin_) (void)cudaFree(sin_);
    head_dim_ = other.head_dim_;
    max_positions_ = other.max_positions_;
    cos_ = std::exchange(other.cos_, nullptr);
    sin_ = std::exchange(other.sin_, nullptr);
  }
  return *this;
}

namespace {

using detail::from_f32;
using detail::to_f32;

// One thread per rotated pair (row, head, i < half).
template <typename T>
__global__ void rope_kernel(T* x, const float* cos_table, const float* sin_table, int64_t rows,
                            int64_t seq_len, int64_t heads, int64_t row_ld, int64_t head_dim,
                            float sign, const int32_t* positions) {
  const int64_t half = head_dim / 2, total = rows * heads * half;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i = idx % half, h = (idx / half) % heads, row = idx / (half * heads);
    const int64_t pos = positions ? positions[row] : row % seq_len;
    const float c = cos_table[pos * half + i], s = sin_table[pos * half + i];
    T* head = x + row * row_ld + h * head_dim;
    const float a = to_f32(head[i]), b = to_f32(head[i + half]);
    head[i] = from_f32<T>(a * c - sign * b * s);
    head[i + half] = from_f32<T>(b * c + sign * a * s);
  }
}

template <typename T>
void rope_impl(T* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t row_ld,
               const RopeTableDevice& table, bool inverse, const int32_t* positions,
               cudaStream_t stream) {
  LOOM_CHECK(seq_len <= table.max_positions(), "sequence ", seq_len, " longer than RoPE table ",
             table.max_positions());
  const int64_t total = batch * seq_len * heads * (table.head_dim() / 2);
  if (total <= 0) return;
  constexpr int kThreads = 256;
  rope_kernel<<<detail::grid_for(total, kThreads), kThreads, 0, stream>>>(
      x, table.cos(), table.sin(), batch * seq_len, seq_len, heads, row_ld, table.head_dim(),
      inverse ? -1.0f : 1.0f, positions);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_apply(float* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t row_ld,
                const RopeTableDevice& table, bool inverse, const int32_t* positions,
                cudaStream_t stream) {
  rope_impl(x, batch, seq_len, heads, row_ld, table, inverse, positions, stream);
}
void rope_apply(bf16* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t row_ld,
                const RopeTableDevice& table, bool inverse, const int32_t* positions,
                cudaStream_t stream) {
  rope_impl(x, batch, seq_len, heads, row_ld, table, inverse, positions, stream);
}

}  // namespace loom::cuda
