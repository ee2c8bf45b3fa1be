#pragma once
// A timeline in the Chrome trace-event format (chrome://tracing, ui.perfetto.dev): complete
// events ("ph": "X") with a start and a duration in microseconds, one process per rank and
// one thread per lane (compute, communication), written as one JSON file per rank.
#include <string>
#include <vector>

namespace loom {

class TraceRecorder {
 public:
  TraceRecorder(std::string path, int rank);
  // Seconds on std::chrono::steady_clock (time_since_epoch), the clock loom's timings use.
  static double now_s();
  void span(const std::string& name, const std::string& lane, double start_s, double end_s);
  void write() const;  // atomically replaces the file
  const std::string& path() const { return path_; }

 private:
  struct Event {
    std::string name, lane;
    double start_s, end_s;
  };
  std::string path_;
  int rank_;
  std::vector<Event> events_;
};

}  // namespace loom
