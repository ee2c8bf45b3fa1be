#include "loom/model/context_parallel.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom {

void ContextSplit::check(int64_t seq_len) const {
  if (size < 1 || rank < 0 || rank >= size) throw_error("context-parallel rank ", rank, " of ", size);
  const int64_t chunks = 2 * int64_t{size};
  if (seq_len % chunks == 0 && seq_len > 0) return;
  const int64_t below = seq_len / chunks * chunks, above = below + chunks;
  throw_error("sequence length ", seq_len, " does not split into 2 x cp = ", chunks,
              " equal chunks (each cp rank holds two, for equal causal work): use a multiple of ", chunks,
              below > 0 ? " such as " + std::to_string(below) + " or " + std::to_string(above)
                        : " such as " + std::to_string(above));
}

int64_t ContextSplit::rows_below(int64_t position, int64_t seq_len, int holder) const {
  const int64_t chunk = seq_len / (2 * size);
  const int64_t first = holder * chunk, second = (2 * size - 1 - holder) * chunk;
  return std::clamp<int64_t>(position - first, 0, chunk) + std::clamp<int64_t>(position - second, 0, chunk);
}

}  // namespace loom
