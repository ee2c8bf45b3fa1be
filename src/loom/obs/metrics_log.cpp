#include "loom/obs/metrics_log.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "loom/core/error.hpp"

namespace loom {
namespace {

// Length of `path` up to and including its last '\n': what survives of a file whose writer
// may have died mid-line.
std::uintmax_t complete_lines_length(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw_error("metrics log '", path, "': cannot read it to resume: ", std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto last_newline = text.rfind('\n');
  return last_newline == std::string::npos ? 0 : last_newline + 1;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, Mode mode) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (mode == Mode::Append && fs::exists(path, ec)) {
    const auto keep = complete_lines_length(path);
    const auto size = fs::file_size(path, ec);
    if (!ec && keep != size) fs::resize_file(path, keep, ec);
    if (ec)
      throw_error("metrics log '", path, "': cannot drop its partial last line: ", ec.message());
  }
  file_.reset(std::fopen(path.c_str(), mode == Mode::Append ? "ab" : "wb"));
  if (!file_)
    throw_error("metrics log '", path, "': cannot open for writing: ", std::strerror(errno));
}

void MetricsLog::write(const nlohmann::json& record) {
  // Replace invalid UTF-8 rather than throw: a stray byte in a label must not end a training run.
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line += '\n';
  // One fwrite of the whole line, then a flush, so a crash leaves at most one partial line.
  const bool written = std::fwrite(line.data(), 1, line.size(), file_.get()) == line.size();
  if (!written || std::fflush(file_.get()) != 0)
    throw_error("metrics log '", path_, "': write failed: ", std::strerror(errno));
}

std::vector<nlohmann::json> MetricsLog::read_all(const std::string& path,
                                                 std::vector<int64_t>* line_numbers) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error("metrics log '", path, "': cannot open for reading: ", std::strerror(errno));
  std::vector<nlohmann::json> records;
  if (line_numbers) line_numbers->clear();
  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    const bool complete = !in.eof();  // getline stopped at a '\n', not at the end of the file
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (record.is_discarded()) {
      if (!complete) break;  // fragment of a record whose writer was killed
      throw_error("metrics log '", path, "' line ", line_number,
                  ": not valid JSON: ", line.substr(0, 80));
    }
    records.push_back(std::move(record));
    if (line_numbers) line_numbers->push_back(line_number);
  }
  return records;
}

}  // namespace loom
