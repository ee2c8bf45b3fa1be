#pragma once
// Running the `loom` binary from a test: its exit code and everything it printed.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace loom::test {

struct CommandResult {
  int exit_code;
  std::string output;
};

inline CommandResult run_loom(const std::string& args) {
  const std::string command = std::string(LOOM_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer{};
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe))
    output.append(buffer.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

}  // namespace loom::test
