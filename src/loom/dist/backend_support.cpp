#include "loom/dist/backend_support.hpp"

#include <cmath>
#include <numeric>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/dist/mpi_process_group.hpp"  // mpi.h, included the way loom needs it

namespace loom::backend {

void check_mpi(int rc, const char* call, const std::string& context) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw_error(context, ": ", call, " failed: ", std::string(text, static_cast<size_t>(length)));
}

void check_disjoint(const float* in, int64_t in_count, const float* out, int64_t out_count,
                    const std::string& context) {
  if (in_count == 0 || out_count == 0) return;
  const bool overlap = in < out + out_count && out < in + in_count;
  if (overlap)
    throw_error(context, ": the input and output buffers overlap; they must be distinct");
}

void check_buffer(const void* data, int64_t count, const std::string& context, const char* what) {
  if (count > 0 && data == nullptr)
    throw_error(context, ": ", what, " is null but the count is ", count);
}

int64_t sum(const std::vector<int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

std::string describe_op(const char* op_label, const std::string& group, int size) {
  std::ostringstream out;
  out << op_label << " on group '" << group << "' (" << size << (size == 1 ? " rank)" : " ranks)");
  return out.str();
}

void check_rank(int value, int size, const std::string& context, const char* what) {
  if (value < 0 || value >= size)
    throw_error(context, ": ", what, " is ", value, ", expected a rank in [0, ", size - 1, "]");
}

void check_per_rank_counts(const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts, int size,
                           const std::string& context) {
  const auto ranks = static_cast<size_t>(size);
  if (send_counts.size() != ranks || recv_counts.size() != ranks)
    throw_error(context, ": send_counts has ", send_counts.size(), " entries and recv_counts ", recv_counts.size(),
                ", expected one per rank (", size, ")");
  for (size_t peer = 0; peer < ranks; ++peer) {
    if (send_counts[peer] < 0) throw_error(context, ": a send count is ", send_counts[peer], ", expected >= 0");
    if (recv_counts[peer] < 0) throw_error(context, ": a recv count is ", recv_counts[peer], ", expected >= 0");
  }
}

double checked_timeout(double seconds, const std::string& group) {
  if (!std::isfinite(seconds) || seconds <= 0)
    throw_error("process group '", group, "': timeout is ", seconds,
                " s, expected a positive number of seconds");
  return seconds;
}

}  // namespace loom::backend
