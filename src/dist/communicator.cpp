#include "dist/communicator.hpp"

#include <fmt/format.h>

#include <array>
#include <string>

#include "core/error.hpp"
#include "dist/wait_policy.hpp"

namespace l3::dist {

void check_mpi(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return;
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  if (MPI_Error_string(rc, text.data(), &length) != MPI_SUCCESS) length = 0;
  throw core::internal_error(
      fmt::format("{} failed: {} (MPI error {})", call, std::string_view(text.data(), length), rc));
}

void check_mpi(int rc, std::string_view call, std::string_view what) {
  if (rc == MPI_SUCCESS) return;
  check_mpi(rc, what.empty() ? std::string(call) : fmt::format("{}({})", call, what));
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

void UniqueComm::reset() noexcept {
  if (comm_ != MPI_COMM_NULL && !mpi_is_finalized()) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

UniqueComm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  arrive_quietly(comm, "MPI_Comm_dup");  // a blocking collective: ranks sharing cores arrive first
  check_mpi(MPI_Comm_dup(comm, &copy), "MPI_Comm_dup");
  UniqueComm owned(copy);
  check_mpi(MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return owned;
}

UniqueComm split(MPI_Comm comm, int color, int key, std::string_view what) {
  MPI_Comm part = MPI_COMM_NULL;
  arrive_quietly(comm, what);
  check_mpi(MPI_Comm_split(comm, color, key, &part), "MPI_Comm_split", what);
  return UniqueComm(part);
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 1;
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  return size;
}

}  // namespace l3::dist
