#include "loom/obs/run_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "loom/core/error.hpp"

namespace loom {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A record and where it came from, for errors that name the line.
struct Located {
  const nlohmann::json* record;
  int64_t line;
  int64_t step;
};

// The longest excerpt of a bad value an error quotes.
constexpr size_t kQuoteChars = 60;

[[noreturn]] void bad_field(const std::string& source, int64_t line, const std::string& key,
                            const nlohmann::json& value, const char* expected) {
  throw_error(
      "metrics log '", source, "' line ", line, ": \"", key, "\" is ",
      value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, kQuoteChars),
      ", expected ", expected);
}

// The field as a number: absent gives nullopt, null gives NaN (NaN and infinity are logged as
// null), anything else but a number is an error.
std::optional<double> number_field(const Located& r, const std::string& key,
                                   const std::string& source) {
  const auto it = r.record->find(key);
  if (it == r.record->end()) return std::nullopt;
  if (it->is_null()) return kNaN;
  if (!it->is_number()) bad_field(source, r.line, key, *it, "a number or null");
  return it->get<double>();
}

int64_t integer_field(const nlohmann::json& record, int64_t line, const char* key,
                      const std::string& source) {
  const auto it = record.find(key);
  if (it == record.end())
    throw_error("metrics log '", source, "' line ", line, ": a \"", record.value("kind", ""),
                "\" record without \"", key, "\"");
  if (!it->is_number() || std::floor(it->get<double>()) != it->get<double>())
    bad_field(source, line, key, *it, "a whole number");
  return static_cast<int64_t>(it->get<double>());
}

const nlohmann::json* object_field(const Located& r, const std::string& key,
                                   const std::string& source) {
  const auto it = r.record->find(key);
  if (it == r.record->end() || it->is_null()) return nullptr;
  if (!it->is_object()) bad_field(source, r.line, key, *it, "an object");
  return &*it;
}

bool is_skipped(const Located& r) {
  const auto it = r.record->find("skipped");
  return it != r.record->end() && *it == true;
}

// Display names of the process groups whose wire bytes the trainer logs (trainer.cpp,
// step_record): "comm" is the dp x cp replicas' gradient traffic.
std::string comm_group_name(const std::string& key) {
  static const std::map<std::string, std::string> names = {
      {"comm", "dp replicas"}, {"comm_tp", "tp"}, {"comm_pp", "pp"},
      {"comm_cp", "cp"},       {"comm_ep", "ep"}, {"comm_experts", "expert replicas"}};
  const auto it = names.find(key);
  return it != names.end() ? it->second : key.substr(5);
}

// Communication times the trainer logs, by field.
const std::vector<std::pair<std::string, std::string>>& comm_time_fields() {
  static const std::vector<std::pair<std::string, std::string>> fields = {
      {"cp_exposed_comm_ms", "cp exposed communication"}, {"moe_a2a_ms", "ep all-to-all"}};
  return fields;
}

bool is_comm_group_key(const std::string& key) {
  return key == "comm" || key.rfind("comm_", 0) == 0;
}

// Fields with a chart (or a meaning) of their own, never drawn as "field_<name>".
bool is_known_field(const std::string& key) {
  static const std::set<std::string> known = {"kind",
                                              "step",
                                              "total_steps",
                                              "loss",
                                              "lr",
                                              "grad_norm",
                                              "step_ms",
                                              "tokens_per_s",
                                              "mfu",
                                              "memory_bytes",
                                              "memory_peak_bytes",
                                              "rank_compute_ms",
                                              "skipped",
                                              "skipped_steps",
                                              "bad_step",
                                              "data_position",
                                              "straggler_rank"};
  if (known.count(key) || is_comm_group_key(key)) return true;
  for (const auto& [field, name] : comm_time_fields())
    if (key == field) return true;
  return false;
}

// One line built from the records that have the field; empty when none has it.
template <typename ValueOf>
StepSeries series_of(const std::string& name, const std::vector<Located>& records,
                     ValueOf&& value_of, bool markers = false) {
  StepSeries series{name, {}, {}, markers};
  for (const Located& r : records)
    if (const std::optional<double> value = value_of(r)) {
      series.steps.push_back(static_cast<double>(r.step));
      series.values.push_back(*value);
    }
  return series;
}

bool any_finite(const StepSeries& series) {
  return std::any_of(series.values.begin(), series.values.end(),
                     [](double v) { return std::isfinite(v); });
}

void add_chart(RunMetrics& metrics, MetricChart chart) {
  std::erase_if(chart.lines, [](const StepSeries& s) { return !any_finite(s); });
  if (!chart.lines.empty()) metrics.charts.push_back(std::move(chart));
}

}  // namespace

const std::vector<std::string>& metric_chart_order() {
  static const std::vector<std::string> order = {
      "loss", "lr",     "grad_norm",  "tokens_per_s", "step_ms",
      "mfu",  "memory", "comm_bytes", "comm_ms",      "rank_compute_ms"};
  return order;
}

RunMetrics extract_run_metrics(const std::vector<nlohmann::json>& records,
                               const std::vector<int64_t>& line_numbers,
                               const std::string& source) {
  if (line_numbers.size() != records.size())
    throw_error("metrics log '", source, "': ", records.size(), " records but ",
                line_numbers.size(), " line numbers");
  RunMetrics metrics;
  std::vector<Located> train, val;
  for (size_t i = 0; i < records.size(); ++i) {
    const nlohmann::json& record = records[i];
    const int64_t line = line_numbers[i];
    if (!record.is_object())
      throw_error("metrics log '", source, "' line ", line, ": expected a JSON object, found ",
                  record.dump().substr(0, kQuoteChars));
    const auto kind_it = record.find("kind");
    if (kind_it == record.end() || !kind_it->is_string()) continue;  // not a record we draw
    const std::string kind = kind_it->get<std::string>();
    if (kind == "train") {
      const Located r{&record, line, integer_field(record, line, "step", source)};
      if (record.contains("total_steps"))
        metrics.total_steps =
            std::max(metrics.total_steps, integer_field(record, line, "total_steps", source));
      if (is_skipped(r)) {
        const auto reason = record.find("bad_step");
        metrics.skipped_steps.push_back({r.step, reason != record.end() && reason->is_string()
                                                     ? reason->get<std::string>()
                                                     : "skipped"});
      }
      train.push_back(r);
    } else if (kind == "val") {
      val.push_back({&record, line, integer_field(record, line, "step", source)});
    } else if (kind == "rollback") {
      // The steps after the checkpoint are trained again and logged again: the later records win.
      const int64_t to_step = integer_field(record, line, "to_step", source);
      const auto checkpoint = record.find("checkpoint");
      metrics.rollbacks.push_back({integer_field(record, line, "step", source),
                                   "rolled back to step " + std::to_string(to_step) +
                                       (checkpoint != record.end() && checkpoint->is_string()
                                            ? " (" + checkpoint->get<std::string>() + ")"
                                            : "")});
      for (std::vector<Located>* kept : {&train, &val})
        std::erase_if(*kept, [to_step](const Located& r) { return r.step > to_step; });
    }
  }

  auto number = [&](const std::string& key) {
    return [&, key](const Located& r) { return number_field(r, key, source); };
  };
  // A skipped step's loss and norm never reached the weights; the marks show where they were.
  std::vector<Located> applied;
  for (const Located& r : train)
    if (!is_skipped(r)) applied.push_back(r);

  add_chart(metrics, {"loss",
                      "Training loss",
                      "cross-entropy (nats/token)",
                      MetricUnit::Plain,
                      true,
                      {series_of("train loss", applied, number("loss")),
                       series_of("val loss", val, number("val_loss"), true)}});
  add_chart(metrics, {"lr",
                      "Learning rate",
                      "learning rate",
                      MetricUnit::Plain,
                      false,
                      {series_of("lr", train, number("lr"))}});
  add_chart(metrics, {"grad_norm",
                      "Gradient norm (before clipping)",
                      "global L2 norm",
                      MetricUnit::Plain,
                      true,
                      {series_of("grad norm", applied, number("grad_norm"))}});
  add_chart(metrics, {"tokens_per_s",
                      "Throughput",
                      "tokens/s",
                      MetricUnit::Plain,
                      false,
                      {series_of("tokens/s", train, number("tokens_per_s"))}});
  add_chart(metrics, {"step_ms",
                      "Step time",
                      "ms per step",
                      MetricUnit::Plain,
                      false,
                      {series_of("step time", train, number("step_ms"))}});
  // MFU is logged as a fraction, and as 0 where no peak is known (no chart then).
  StepSeries mfu = series_of("MFU", train, [&](const Located& r) -> std::optional<double> {
    const auto v = number_field(r, "mfu", source);
    return v ? std::optional<double>(100 * *v) : std::nullopt;
  });
  if (std::any_of(mfu.values.begin(), mfu.values.end(), [](double v) { return v > 0; }))
    add_chart(metrics,
              {"mfu", "Model FLOPs utilisation", "MFU (%)", MetricUnit::Plain, false, {mfu}});

  // Memory: one line per category that was ever non-zero, and the peak of their sum.
  std::vector<std::string> categories;
  for (const Located& r : train)
    if (const nlohmann::json* peaks = object_field(r, "memory_peak_bytes", source))
      for (const auto& [category, bytes] : peaks->items()) {
        if (!bytes.is_number() && !bytes.is_null())
          bad_field(source, r.line, "memory_peak_bytes." + category, bytes, "a number of bytes");
        if (bytes.is_number() && bytes.get<double>() != 0 &&
            std::find(categories.begin(), categories.end(), category) == categories.end())
          categories.push_back(category);
      }
  MetricChart memory{"memory", "Peak memory by category", "peak bytes", MetricUnit::Bytes, false,
                     {}};
  for (const std::string& category : categories)
    memory.lines.push_back(
        series_of(category, train, [&](const Located& r) -> std::optional<double> {
          const nlohmann::json* peaks = object_field(r, "memory_peak_bytes", source);
          if (!peaks) return std::nullopt;
          const auto it = peaks->find(category);
          return it != peaks->end() && it->is_number() ? it->get<double>() : 0.0;
        }));
  memory.lines.push_back(series_of("total", train, number("memory_bytes")));
  add_chart(metrics, std::move(memory));

  // Wire bytes each group sent in the step, summed over its collectives. A group logs only
  // collectives it called, so a step of a group the run has, without an entry, sent nothing.
  std::vector<std::string> groups;
  for (const Located& r : train)
    for (const auto& [key, value] : r.record->items())
      if (is_comm_group_key(key)) {
        const nlohmann::json* ops = object_field(r, key, source);
        if (!ops) continue;
        for (const auto& [op, stats] : ops->items()) {
          if (!stats.is_object()) bad_field(source, r.line, key + "." + op, stats, "an object");
          const auto sent = stats.find("bytes_sent");
          if (sent != stats.end() && !sent->is_number())
            bad_field(source, r.line, key + "." + op + ".bytes_sent", *sent, "a number of bytes");
        }
        if (std::find(groups.begin(), groups.end(), key) == groups.end()) groups.push_back(key);
      }
  MetricChart comm_bytes{"comm_bytes",
                         "Communication: wire bytes sent per step",
                         "bytes sent per step",
                         MetricUnit::Bytes,
                         false,
                         {}};
  for (const std::string& group : groups)
    comm_bytes.lines.push_back(
        series_of(comm_group_name(group), train, [&](const Located& r) -> std::optional<double> {
          const nlohmann::json* ops = object_field(r, group, source);
          double sent = 0;
          if (ops)
            for (const auto& [op, stats] : ops->items()) sent += stats.value("bytes_sent", 0.0);
          return sent;
        }));
  add_chart(metrics, std::move(comm_bytes));

  MetricChart comm_ms{"comm_ms", "Communication time", "ms per step", MetricUnit::Plain, false, {}};
  for (const auto& [field, name] : comm_time_fields())
    comm_ms.lines.push_back(series_of(name, train, number(field)));
  add_chart(metrics, std::move(comm_ms));

  // Each rank's forward + backward time per step since the last log point, over the ranks.
  MetricChart ranks{"rank_compute_ms",
                    "Compute time across ranks",
                    "ms per step (forward + backward)",
                    MetricUnit::Plain,
                    false,
                    {}};
  for (const char* statistic : {"min", "median", "max"})
    ranks.lines.push_back(series_of(
        statistic, train,
        [&](const Located& r) -> std::optional<double> {
          const nlohmann::json* times = object_field(r, "rank_compute_ms", source);
          if (!times || !times->contains(statistic)) return std::nullopt;
          const nlohmann::json& v = (*times)[statistic];
          if (v.is_null()) return kNaN;
          if (!v.is_number())
            bad_field(source, r.line, std::string("rank_compute_ms.") + statistic, v, "a number");
          return v.get<double>();
        },
        true));
  add_chart(metrics, std::move(ranks));

  // Every other numeric field (MoE losses and loads, cp attention time, ...): a chart each,
  // with dots where only some steps log it.
  std::set<std::string> other;
  for (const Located& r : train)
    for (const auto& [key, value] : r.record->items())
      if (!is_known_field(key) && (value.is_number() || value.is_null())) other.insert(key);
  for (const std::string& key : other) {
    StepSeries line = series_of(key, train, number(key));
    line.markers = line.steps.size() < train.size();
    add_chart(metrics,
              {"field_" + key,
               key,
               key,
               key.find("bytes") != std::string::npos ? MetricUnit::Bytes : MetricUnit::Plain,
               false,
               {std::move(line)}});
  }

  metrics.train_records = static_cast<int64_t>(train.size());
  for (const Located& r : train) {
    metrics.last_step = std::max(metrics.last_step, r.step);
    const double ms = number_field(r, "step_ms", source).value_or(kNaN);
    const double tokens_per_s = number_field(r, "tokens_per_s", source).value_or(kNaN);
    if (std::isfinite(ms)) metrics.step_seconds_total += ms / 1e3;
    if (std::isfinite(ms) && std::isfinite(tokens_per_s) && ms > 0)
      metrics.tokens_per_step = std::llround(tokens_per_s * ms / 1e3);
  }
  return metrics;
}

}  // namespace loom
