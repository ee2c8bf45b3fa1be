#include "loom/train/bad_steps.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loom/core/error.hpp"

namespace loom {

namespace {
std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}
}  // namespace

const char* bad_step_name(BadStep kind) {
  switch (kind) {
    case BadStep::None: return "none";
    case BadStep::LossSpike: return "loss spike";
    case BadStep::NonFiniteNorm: return "non-finite gradient norm";
    case BadStep::NonFiniteLoss: return "non-finite loss";
  }
  return "?";
}

BadStepVerdict BadStepGuard::judge(double loss, double grad_norm) const {
  if (!std::isfinite(loss)) return {BadStep::NonFiniteLoss, "loss is " + number(loss)};
  if (!std::isfinite(grad_norm))
    return {BadStep::NonFiniteNorm, "gradient norm is " + number(grad_norm)};
  const double median_loss = median();
  if (config_.loss_spike_factor > 0 && median_loss > 0 &&
      loss > config_.loss_spike_factor * median_loss)
    return {BadStep::LossSpike, "loss " + number(loss) + " is above " +
                                    number(config_.loss_spike_factor) + " x the median " +
                                    number(median_loss) + " of the last " +
                                    std::to_string(window_.size()) + " steps"};
  return {};
}

void BadStepGuard::record(bool bad, double loss) {
  if (bad) {
    ++bad_in_a_row_;
    ++skipped_total_;
    return;
  }
  bad_in_a_row_ = 0;
  window_.push_back(loss);
  while (static_cast<int64_t>(window_.size()) > config_.median_window) window_.pop_front();
}

double BadStepGuard::median() const {
  if (window_.empty() || static_cast<int64_t>(window_.size()) < config_.median_window) return 0.0;
  std::vector<double> sorted(window_.begin(), window_.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

void BadStepGuard::count_rollback(int64_t step) {
  if (rollbacks_ >= config_.max_rollbacks)
    throw_error("training keeps diverging: ", bad_in_a_row_, " bad steps in a row up to step ",
                step, " after ", rollbacks_,
                " rollbacks already (bad_steps.max_rollbacks = ", config_.max_rollbacks,
                "); lower optim.lr, raise bad_steps.max_rollbacks, or check the data");
  ++rollbacks_;
  bad_in_a_row_ = 0;
}

nlohmann::json BadStepGuard::state() const {
  return {{"loss_window", std::vector<double>(window_.begin(), window_.end())},
          {"bad_in_a_row", bad_in_a_row_},
          {"skipped_steps", skipped_total_},
          {"rollbacks", rollbacks_}};
}

void BadStepGuard::restore(const nlohmann::json& state) {
  restore_window(state);
  restore_counters(state);
}

void BadStepGuard::restore_counters(const nlohmann::json& state) {
  bad_in_a_row_ = state.value("bad_in_a_row", int64_t{0});
  skipped_total_ = state.value("skipped_steps", int64_t{0});
  rollbacks_ = state.value("rollbacks", int64_t{0});
}

void BadStepGuard::restore_window(const nlohmann::json& state) {
  window_.clear();
  if (state.contains("loss_window"))
    for (double loss : state.at("loss_window").get<std::vector<double>>()) window_.push_back(loss);
  while (static_cast<int64_t>(window_.size()) > config_.median_window) window_.pop_front();
}

}  // namespace loom
