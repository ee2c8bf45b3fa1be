// libFuzzer target: a published-runs file (JSON) through parse_published_runs and
// check_published_run, as `loom plan --validate FILE` reads and predicts it: every record is
// answered, refused with a reason, or marked malformed; the only exception allowed out is a
// loom::Error for the file itself (not JSON, not an array). A crash, a sanitizer report (an
// integer division by zero, an overflow) or any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/plan/published_runs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<loom::plan::PublishedRun> runs;
  try {
    runs = loom::plan::parse_published_runs(text, "fuzz.json");
  } catch (const loom::Error&) {
    return 0;
  }
  // A few records per input keep each run short; the search per record is bounded anyway.
  for (size_t i = 0; i < runs.size() && i < 4; ++i) {
    const loom::plan::RunCheck check = loom::plan::check_published_run(runs[i]);
    if (check.answered && check.figures.size() != runs[i].measured.size()) __builtin_trap();
  }
  return 0;
}
