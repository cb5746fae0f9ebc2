#include "dist/quiet_barrier.hpp"

#include <thread>

#include "dist/mpi_check.hpp"

namespace l3::dist {

void quiet_barrier(MPI_Comm comm, std::chrono::microseconds poll) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm, &request), "MPI_Ibarrier");
  int done = 0;
  for (;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done != 0) return;
    std::this_thread::sleep_for(poll);
  }
}

}  // namespace l3::dist
