#pragma once
// Rotary position embedding on the device, the twin of loom::cpu's rope.hpp ("rotate half"
// layout: element i of a head pairs with i + head_dim/2). The cos/sin table is the CPU's
// (cpu::make_rope_table, Hugging Face's rounding), uploaded once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/cuda/stream.hpp"
#include "loom/kernels/cpu/rope.hpp"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// Device copy of a cpu::RopeTable ([max_positions, head_dim / 2] cos and sin, f32).
class RopeTableDevice {
 public:
  explicit RopeTableDevice(const cpu::RopeTable& table);  // synchronous upload
  ~RopeTableDevice();
  RopeTableDevice(RopeTableDevice&& other) noexcept;
  RopeTableDevice& operator=(RopeTableDevice&& other) noexcept;
  RopeTableDevice(const RopeTableDevice&) = delete;
  RopeTableDevice& operator=(const RopeTableDevice&) = delete;

  int64_t head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  const float* cos() const { return cos_; }
  const float* sin() const { return sin_; }

 private:
  int64_t head_dim_ = 0, max_positions_ = 0;
  float* cos_ = nullptr;
  float* sin_ = nullptr;
};

// In place on `heads` heads of head_dim per row (rows b*t, position t, or positions[b*t] when
// `positions` (device, one per row, each below the table's max_positions) is given), rows at
// stride row_ld. inverse=true rotates by -angle (the backward of the forward rotation).
void rope_apply(float* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t row_ld,
                const RopeTableDevice& table, bool inverse, const int32_t* positions = nullptr,
                cudaStream_t stream = current_stream());
void rope_apply(bf16* x, int64_t batch, int64_t seq_len, int64_t heads, int64_t row_ld,
                const RopeTableDevice& table, bool inverse, const int32_t* positions = nullptr,
                cudaStream_t stream = current_stream());

}  // namespace loom::cuda
