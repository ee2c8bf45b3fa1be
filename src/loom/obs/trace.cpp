#include "loom/obs/trace.hpp"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "loom/core/error.hpp"

namespace loom {

TraceRecorder::TraceRecorder(std::string path, int rank) : path_(std::move(path)), rank_(rank) {}

double TraceRecorder::now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void TraceRecorder::span(const std::string& name, const std::string& lane, double start_s, double end_s) {
  events_.push_back({name, lane, start_s, end_s});
}

void TraceRecorder::write() const {
  nlohmann::json events = nlohmann::json::array();
  const double origin = events_.empty() ? 0.0 : events_.front().start_s;
  std::vector<std::string> lanes;
  for (const Event& e : events_) {
    size_t tid = 0;
    while (tid < lanes.size() && lanes[tid] != e.lane) ++tid;
    if (tid == lanes.size()) lanes.push_back(e.lane);
    events.push_back({{"name", e.name}, {"cat", e.lane}, {"ph", "X"}, {"pid", rank_}, {"tid", tid},
                      {"ts", (e.start_s - origin) * 1e6}, {"dur", (e.end_s - e.start_s) * 1e6}});
  }
  for (size_t tid = 0; tid < lanes.size(); ++tid)  // lane names shown by the viewers
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", tid},
                      {"args", {{"name", lanes[tid]}}}});
  const std::string tmp = path_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) throw_error("trace: cannot write ", tmp);
  const std::string text = nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path_.c_str()) != 0)
    throw_error("trace: cannot write ", path_);
}

}  // namespace loom
