#include "dist/mpi_type.hpp"

#include <fmt/format.h>

#include <limits>

#include "core/error.hpp"

namespace l3::dist {

MPI_Op mpi_op(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::bitwise_or:
      return MPI_BOR;
    case ReduceOp::bitwise_xor:
      return MPI_BXOR;
  }
  return MPI_OP_NULL;
}

int mpi_count(std::size_t n, std::string_view call, std::string_view what) {
  if (n <= static_cast<std::size_t>(std::numeric_limits<int>::max())) return static_cast<int>(n);
  throw core::internal_error(fmt::format("{}{}{}{}: {} elements, more than one MPI call can move",
                                         call, what.empty() ? "" : "(", what,
                                         what.empty() ? "" : ")", n));
}

}  // namespace l3::dist
