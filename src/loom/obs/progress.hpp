#pragma once
// A one-line progress bar for an interactive terminal, and the human formats of durations,
// byte sizes and counts that the bar and the per-step lines share.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace loom {

// "12.3s" under a minute, "3m05s" under an hour, then "1h02m"; "--" for NaN, infinite or negative.
std::string format_duration(double seconds);
// Binary units with three significant digits: "512 B", "1.23 GiB", "12.3 MiB", "123 KiB".
std::string format_bytes(int64_t bytes);
// Decimal suffixes k, M, B, T with trailing zeros dropped: "812", "3.2k", "1.26k", "124.4M".
std::string format_count(double count);

// `[#####.....] 45/100 45% ETA 1m23s <suffix>`; an unknown ETA prints "ETA --".
std::string progress_line(int64_t step, int64_t total_steps, std::optional<double> eta_seconds,
                          const std::string& suffix);

class ProgressBar {
 public:
  // Draws on stderr, and only when stderr is a terminal: in a log file the step lines already
  // say everything and carriage returns would only garble it.
  explicit ProgressBar(int64_t total_steps);
  // Draws on `out` exactly when `interactive`; for tests and callers that decide themselves.
  ProgressBar(int64_t total_steps, std::FILE* out, bool interactive);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Redraws the line in place. The ETA extrapolates the time per step since the first update,
  // so a resumed run's earlier steps do not count. Redraws are rate-limited, except the last step.
  void update(int64_t step, const std::string& suffix);
  // Erases the bar so the caller can print a full line; the next update() draws it again.
  void clear();
  // Ends the bar's line; idempotent, and done by the destructor.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  int64_t total_steps_;
  std::FILE* out_;
  bool interactive_;
  bool drawn_ = false;  // the cursor sits at the end of a drawn bar
  std::optional<int64_t> first_step_;
  Clock::time_point first_time_, last_draw_time_;
};

}  // namespace loom
