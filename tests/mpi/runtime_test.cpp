// The library initialises MPI itself when the host did not, and finalises it when done.
// A plain program (MPI can be initialised only once per process). Run with 2 ranks.
#include <mpi.h>

#include <cstdio>

#include "dist/communicator.hpp"
#include "dist/mpi_runtime.hpp"
#include "dist/world.hpp"

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what);
    ++failures;
  }
}
}  // namespace

int main(int argc, char** argv) {
  check(!l3::dist::mpi_is_initialized(), "MPI is not initialised before the runtime");
  bool threw = false;
  try {
    const l3::dist::World early(MPI_COMM_SELF);
  } catch (const std::exception&) {
    threw = true;
  }
  check(threw, "World refuses to run before MPI is initialised");
  {
    const l3::dist::MpiRuntime runtime(&argc, &argv);
    check(runtime.initialized_here(), "the runtime initialised MPI");
    check(l3::dist::mpi_is_initialized(), "MPI is initialised");
    check(runtime.provided_thread_level() >= MPI_THREAD_SINGLE, "a thread level was recorded");
    std::printf("granted %s\n",
                l3::dist::thread_level_name(runtime.provided_thread_level()).data());
    {
      const l3::dist::World world(MPI_COMM_WORLD);
      check(world.size() >= 1, "World works under the library's own MPI");
      int sum = 0;
      const int one = 1;
      MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, world.comm());
      check(sum == world.size(), "allreduce over the World");
    }  // the World's communicators are freed before MPI is finalised
  }
  check(l3::dist::mpi_is_finalized(), "the runtime finalised the MPI it initialised");
  if (failures == 0) std::printf("runtime_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
