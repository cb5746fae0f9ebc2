#include "dist/unique_comm.hpp"

#include "dist/mpi_check.hpp"

namespace l3::dist {

void UniqueComm::reset() noexcept {
  if (comm_ != MPI_COMM_NULL && !mpi_is_finalized()) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

UniqueComm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &copy), "MPI_Comm_dup");
  UniqueComm owned(copy);
  check_mpi(MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  return owned;
}

}  // namespace l3::dist
