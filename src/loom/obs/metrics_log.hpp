#pragma once
// Training metrics as JSON Lines: one record per line, flushed as soon as it is written, so a
// run that is killed keeps every line it finished and the file can be plotted at any time.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom {

class MetricsLog {
 public:
  // Append continues the file of a resumed run; Truncate starts a fresh one.
  enum class Mode { Append, Truncate };

  // Throws loom::Error naming the path if the file cannot be opened. In Append mode a partial
  // last line left by a killed run is cut off first, so new records start on a line of their own.
  MetricsLog(const std::string& path, Mode mode);

  // Writes `record` as one compact line and flushes it to the OS; throws loom::Error on failure.
  // NaN and infinity become null (JSON has no spelling for them).
  void write(const nlohmann::json& record);

  const std::string& path() const { return path_; }

  // Every record in the file, in order. A last line without its newline is kept only if it
  // parses (a killed writer leaves a fragment that does not); a malformed complete line, or a
  // file that cannot be read, throws loom::Error with the path and line number. When given,
  // `line_numbers` receives each record's 1-based line, for errors about its contents.
  static std::vector<nlohmann::json> read_all(const std::string& path,
                                              std::vector<int64_t>* line_numbers = nullptr);

 private:
  struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  std::string path_;
  std::unique_ptr<std::FILE, CloseFile> file_;
};

}  // namespace loom
