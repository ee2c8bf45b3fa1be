#pragma once
// Helpers the test files share, so each is written (and fixed) once.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "loom/ckpt/atomic_file.hpp"  // loom::read_file_bytes: the tests' way to read a file's bytes
#include "loom/core/error.hpp"

namespace loom::test {

// Tests that write files need a private directory, gone afterwards even when the test fails:
// a fresh one under the system temp dir named `prefix`_XXXXXX, removed with its contents.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;  // a copy would remove the directory twice
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Error tests check what a loom::Error says: this returns the message `action` throws, and
// fails the test (returning "") if it throws none, so no assertion can pass on a missing error.
template <typename Action>
std::string error_message(Action&& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::Error";
  return "";
}

// An error message must name everything the user needs; one failure per missing fragment.
inline void expect_contains(const std::string& message, const std::vector<std::string>& fragments) {
  for (const std::string& fragment : fragments)
    EXPECT_NE(message.find(fragment), std::string::npos) << "message lacks '" << fragment << "': " << message;
}

// The whole file as a string (bytes unchanged); a loom::Error names the path if it cannot be read.
inline std::string read_text_file(const std::filesystem::path& path) {
  const std::vector<uint8_t> bytes = read_file_bytes(path.string());
  return std::string(bytes.begin(), bytes.end());
}

// Writes a test input exactly as given; throws if it cannot.
inline void write_text_file(const std::filesystem::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  if (!out) throw std::runtime_error("cannot write test file " + path.string());
}

}  // namespace loom::test
