#include "loom/obs/step_line.hpp"

#include <cmath>
#include <cstdio>

#include "loom/obs/progress.hpp"

namespace loom {
namespace {

std::string printf_string(const char* format, auto... args) {
  char buffer[128];
  std::snprintf(buffer, sizeof buffer, format, args...);
  return buffer;
}

std::string pad_left(const std::string& text, size_t width) {
  return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
}

// Sub-10 ms steps (small models on CPU) need the decimal; longer ones do not.
std::string format_step_ms(double step_ms) {
  return printf_string(step_ms < 10 ? "%.1f" : "%.0f", step_ms);
}

}  // namespace

std::string format_step_line(const StepReport& r) {
  // The step counter is as wide as the total, so "step   12/1000" lines up with "step 1000/1000".
  const int step_width = static_cast<int>(std::to_string(r.total_steps).size());
  std::string line = printf_string("step %*lld/%lld", step_width, static_cast<long long>(r.step),
                                   static_cast<long long>(r.total_steps));
  line += " | loss " + printf_string("%7.4f", r.loss);
  line += " | lr " + printf_string("%.2e", r.lr);
  line += " | norm " + printf_string("%5.2f", r.grad_norm);
  line += " | " + pad_left(format_step_ms(r.step_ms), 5) + " ms";
  line += " | " + pad_left(format_count(r.tokens_per_s), 6) + " tok/s";
  line += " | MFU " +
          (std::isfinite(r.mfu) ? printf_string("%4.1f%%", 100 * r.mfu) : std::string("   --"));
  line += " | mem " + pad_left(r.memory_bytes >= 0 ? format_bytes(r.memory_bytes) : "--", 10);
  return line;
}

nlohmann::json step_report_json(const StepReport& r) {
  return {
      {"kind", "train"},
      {"step", r.step},
      {"total_steps", r.total_steps},
      {"loss", r.loss},
      {"lr", r.lr},
      {"grad_norm", r.grad_norm},
      {"step_ms", r.step_ms},
      {"tokens_per_s", r.tokens_per_s},
      {"mfu", std::isfinite(r.mfu) ? nlohmann::json(r.mfu) : nlohmann::json(nullptr)},
      {"memory_bytes",
       r.memory_bytes >= 0 ? nlohmann::json(r.memory_bytes) : nlohmann::json(nullptr)},
  };
}

}  // namespace loom
