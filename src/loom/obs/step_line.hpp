#pragma once
// What one optimizer step did, as the fixed-width line printed per step and as the record
// written to the metrics log.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace loom {

struct StepReport {
  int64_t step = 0;  // 1-based number of the step just finished
  int64_t total_steps = 0;
  double loss = 0;  // mean cross-entropy over the step's tokens, nats
  double lr = 0;
  double grad_norm = 0;  // global L2 norm before clipping
  double step_ms = 0;
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs utilisation as a fraction (0.412); NaN when no peak is known
  int64_t memory_bytes = 0;  // peak allocator bytes (all categories) this step; negative when unknown
};

// `step   12/1000 | loss 5.4321 | lr 3.00e-04 | norm 1.23 | 812 ms | 1.26k tok/s | MFU 41.2% |
// mem 1.05 GiB`, every field padded so consecutive lines stay aligned.
std::string format_step_line(const StepReport& report);

// {"kind":"train","step":..,"total_steps":..,"loss":..,"lr":..,"grad_norm":..,"step_ms":..,
//  "tokens_per_s":..,"mfu":..,"memory_bytes":..}; an unknown mfu or memory_bytes is null.
nlohmann::json step_report_json(const StepReport& report);

}  // namespace loom
