#include "loom/train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"

namespace loom {

LrScheduleKind parse_lr_schedule(const std::string& text) {
  if (text == "cosine") return LrScheduleKind::Cosine;
  if (text == "wsd") return LrScheduleKind::WSD;
  if (text == "constant") return LrScheduleKind::Constant;
  throw_error("optim.schedule: got '", text, "', expected one of cosine, wsd, constant");
}

const char* lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::Cosine: return "cosine";
    case LrScheduleKind::WSD: return "wsd";
    case LrScheduleKind::Constant: return "constant";
  }
  return "?";
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (kind == LrScheduleKind::Constant) return peak_lr;
  if (kind == LrScheduleKind::Cosine) {
    const double span = std::max<int64_t>(1, total_steps - warmup_steps);
    const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
  }
  const auto decay_steps = static_cast<int64_t>(std::ceil(decay_fraction * static_cast<double>(total_steps)));
  const int64_t decay_start = total_steps - decay_steps;
  if (step < decay_start || decay_steps <= 0) return peak_lr;
  const double progress = std::min(1.0, static_cast<double>(step - decay_start + 1) / static_cast<double>(decay_steps));
  return peak_lr + (min_lr - peak_lr) * progress;
}

}  // namespace loom
