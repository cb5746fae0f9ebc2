#include "dist/mpi_runtime.hpp"

#include <mpi.h>

#include <cstdlib>

#include "core/error.hpp"
#include "dist/communicator.hpp"

namespace l3::dist {

std::string_view thread_level_name(int level) noexcept {
  if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
  if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
  if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
  if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
  return "unknown";
}

void abort_job(MPI_Comm comm, int code) noexcept {
  MPI_Abort(comm, code);
  std::_Exit(code);  // MPI_Abort should not return; make sure
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  if (mpi_is_finalized()) {
    throw core::internal_error(
        "MPI has already been finalized in this process; it cannot be "
        "initialised again");
  }
  if (mpi_is_initialized()) {
    MPI_Query_thread(&provided_);
    return;
  }
  // MPI_ERRORS_ARE_FATAL is the default on MPI_COMM_WORLD until World installs ERRORS_RETURN
  // on its own communicators, so a failure here aborts with MPI's own message.
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_);
  initialized_here_ = true;
}

MpiRuntime::~MpiRuntime() {
  if (initialized_here_ && !mpi_is_finalized()) MPI_Finalize();
}

}  // namespace l3::dist
