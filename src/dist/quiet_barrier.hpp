// A barrier that waits without spinning a core: MPI_Ibarrier polled with short sleeps. For
// background threads (the asynchronous checkpoint writer) whose collectives would otherwise
// busy-poll while a peer is still busy, taking CPU time from the training on the same cores.
#pragma once

#include <mpi.h>

#include <chrono>

namespace l3::dist {

// Collective over `comm`. Returns once every rank has arrived; sleeps `poll` between checks.
void quiet_barrier(MPI_Comm comm, std::chrono::microseconds poll = std::chrono::microseconds(500));

}  // namespace l3::dist
