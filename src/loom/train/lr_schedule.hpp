#pragma once
// Learning-rate schedules: linear warmup, then cosine decay to min_lr (GPT-3 / Chinchilla
// practice), warmup-stable-decay (WSD, Hu et al. 2024 "MiniCPM": constant, then a linear
// decay over the last `decay_fraction` of training), or constant after warmup.
#include <cstdint>
#include <string>

namespace loom {

enum class LrScheduleKind { Cosine, WSD, Constant };
LrScheduleKind parse_lr_schedule(const std::string& text);
const char* lr_schedule_name(LrScheduleKind kind);

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::Cosine;
  double peak_lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double decay_fraction = 0.2;  // WSD only

  // Learning rate for optimizer step `step` (0-based).
  double at(int64_t step) const;
};

}  // namespace loom
