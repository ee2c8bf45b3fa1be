#include "loom/obs/progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace loom {
namespace {

constexpr int kBarWidth = 30;
// Fast steps (a tiny model on CPU) would otherwise spend their time writing to the terminal.
constexpr std::chrono::milliseconds kMinRedrawInterval{100};
constexpr const char* kEraseToEndOfLine = "\033[K";

std::string printf_string(const char* format, auto... args) {
  char buffer[128];
  std::snprintf(buffer, sizeof buffer, format, args...);
  return buffer;
}

// Fixed-point text with up to `decimals` decimals, trailing zeros (and a bare '.') removed.
std::string trimmed_fixed(double value, int decimals) {
  std::string text = printf_string("%.*f", decimals, value);
  if (text.find('.') != std::string::npos) {
    text.erase(text.find_last_not_of('0') + 1);
    if (text.back() == '.') text.pop_back();
  }
  return text;
}

// Columns of the terminal behind `out`, or 0 when unknown.
int terminal_columns(std::FILE* out) {
  winsize size{};
  return ioctl(fileno(out), TIOCGWINSZ, &size) == 0 ? size.ws_col : 0;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--";
  if (seconds < 59.95) return printf_string("%.1fs", seconds);  // 59.96 would print "60.0s"
  const int64_t whole_seconds = std::llround(seconds);
  if (whole_seconds < 3600)
    return printf_string("%lldm%02llds", static_cast<long long>(whole_seconds / 60),
                         static_cast<long long>(whole_seconds % 60));
  const int64_t minutes = std::llround(seconds / 60);
  return printf_string("%lldh%02lldm", static_cast<long long>(minutes / 60),
                       static_cast<long long>(minutes % 60));
}

std::string format_bytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const char* sign = bytes < 0 ? "-" : "";
  double value = std::abs(static_cast<double>(bytes));
  if (value < 1024) return printf_string("%s%.0f B", sign, value);
  size_t unit = 0;
  value /= 1024;
  // Promote at 1023.5, not 1024, so rounding never prints "1024 KiB".
  while (value >= 1023.5 && unit + 1 < std::size(kUnits)) value /= 1024, ++unit;
  const int decimals = value < 9.995 ? 2 : value < 99.95 ? 1 : 0;
  return printf_string("%s%.*f %s", sign, decimals, value, kUnits[unit]);
}

std::string format_count(double count) {
  if (std::isnan(count)) return "nan";
  if (std::isinf(count)) return count < 0 ? "-inf" : "inf";
  static constexpr const char* kSuffixes[] = {"", "k", "M", "B", "T"};
  const char* sign = count < 0 ? "-" : "";
  double value = std::abs(count);
  size_t suffix = 0;
  // Promote at 999.95, which one decimal would round to "1000".
  while (value >= 999.95 && suffix + 1 < std::size(kSuffixes)) value /= 1000, ++suffix;
  const int decimals = value < 9.995 ? 2 : 1;  // three significant digits at least
  return sign + trimmed_fixed(value, decimals) + kSuffixes[suffix];
}

std::string progress_line(int64_t step, int64_t total_steps, std::optional<double> eta_seconds,
                          const std::string& suffix) {
  const double fraction =
      total_steps > 0
          ? std::clamp(static_cast<double>(step) / static_cast<double>(total_steps), 0.0, 1.0)
          : 1.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string line = "[" + std::string(filled, '#') + std::string(kBarWidth - filled, '.') + "] ";
  line += std::to_string(step) + "/" + std::to_string(total_steps) + " " +
          std::to_string(static_cast<int>(fraction * 100)) + "% ETA " +
          (eta_seconds ? format_duration(*eta_seconds) : std::string("--"));
  if (!suffix.empty()) line += " " + suffix;
  return line;
}

ProgressBar::ProgressBar(int64_t total_steps)
    : ProgressBar(total_steps, stderr, isatty(fileno(stderr)) != 0) {}

ProgressBar::ProgressBar(int64_t total_steps, std::FILE* out, bool interactive)
    : total_steps_(total_steps), out_(out), interactive_(interactive) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(int64_t step, const std::string& suffix) {
  if (!interactive_) return;
  const auto now = Clock::now();
  if (!first_step_) first_step_ = step, first_time_ = now;
  const bool last = step >= total_steps_;
  if (drawn_ && !last && now - last_draw_time_ < kMinRedrawInterval) return;

  std::optional<double> eta_seconds;
  if (step > *first_step_) {
    const double elapsed = std::chrono::duration<double>(now - first_time_).count();
    eta_seconds = elapsed / static_cast<double>(step - *first_step_) *
                  static_cast<double>(std::max<int64_t>(total_steps_ - step, 0));
  }
  std::string line = progress_line(step, total_steps_, eta_seconds, suffix);
  // A line wider than the terminal wraps, and '\r' would then redraw only its last row.
  const int columns = terminal_columns(out_);
  if (columns > 1 && line.size() >= static_cast<size_t>(columns)) line.resize(columns - 1);
  std::fprintf(out_, "\r%s%s", line.c_str(), kEraseToEndOfLine);
  std::fflush(out_);
  drawn_ = true;
  last_draw_time_ = now;
}

void ProgressBar::clear() {
  if (!drawn_) return;
  std::fprintf(out_, "\r%s", kEraseToEndOfLine);
  std::fflush(out_);
  drawn_ = false;
}

void ProgressBar::finish() {
  if (!drawn_) return;
  std::fputc('\n', out_);
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace loom
