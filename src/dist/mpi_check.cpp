#include "dist/mpi_check.hpp"

#include <fmt/format.h>

#include <array>

#include "core/error.hpp"

namespace l3::dist {

void check_mpi(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return;
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  if (MPI_Error_string(rc, text.data(), &length) != MPI_SUCCESS) length = 0;
  throw core::internal_error(
      fmt::format("{} failed: {} (MPI error {})", call, std::string_view(text.data(), length), rc));
}

bool mpi_is_initialized() noexcept {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool mpi_is_finalized() noexcept {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

}  // namespace l3::dist
