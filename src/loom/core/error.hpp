#pragma once
// One exception type for every user-facing failure: the message names what was wrong,
// the value seen and what was expected, so the CLI can print it as-is and exit non-zero.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Builds a message from any streamable pieces: throw_error("key '", k, "': expected ...").
template <typename... Parts>
[[noreturn]] void throw_error(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  throw Error(out.str());
}

// Internal invariant check; a failure is a bug in loom, not in the user's input.
#define LOOM_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) ::loom::throw_error("internal check failed: " #cond " at " __FILE__ ":", \
                                     __LINE__, " ", ##__VA_ARGS__);                    \
  } while (0)

}  // namespace loom
