#include "dist/agree.hpp"

#include "core/error.hpp"
#include "dist/mpi_check.hpp"

namespace l3::dist {

void agree_on_failure(const World& world, const std::exception_ptr& local) {
  const int mine = local ? core::summarize(local).exit_code : 0;
  int worst = 0;
  check_mpi(MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, world.comm()),
            "MPI_Allreduce(failure)");
  if (worst == 0) return;
  if (local) std::rethrow_exception(local);
  throw core::PeerFailure(worst);
}

}  // namespace l3::dist
