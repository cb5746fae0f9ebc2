// Collectives the library builds from MPI's: agreeing on a failure, moving text and byte
// arrays between ranks, and a barrier that sleeps instead of spinning.
#pragma once

#include <mpi.h>

#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "dist/world.hpp"

namespace l3::dist {

// Collective failure checks: after a phase where each rank works alone (reading its part of
// the input, writing its shards), all ranks learn whether any failed before they enter the next
// collective, so a failure on one rank never leaves the others waiting in a collective.
// Collective. `local` is this rank's failure (null when it succeeded). When any rank failed:
// the failing ranks rethrow their own exception, the others throw core::PeerFailure with the
// largest exit code seen. Otherwise returns.
void agree_on_failure(const World& world, const std::exception_ptr& local);

// Gathering variable-length text (per-rank reports, error messages) to one rank.
// Collective over comm. On `root`, element r is rank r's text; elsewhere the result is empty.
[[nodiscard]] std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine,
                                                      int root = 0);

// Collective over comm: every rank returns root's `text`.
[[nodiscard]] std::string broadcast_string(MPI_Comm comm, const std::string& text, int root = 0);

// Collective over comm: every rank's `values` becomes root's (any trivially copyable T), sent
// in pieces of at most 1 GiB.
void broadcast_bytes(MPI_Comm comm, void* data, std::size_t bytes, int root);
template <typename T>
void broadcast_vector(MPI_Comm comm, std::vector<T>& values, int root = 0) {
  unsigned long long count = values.size();
  broadcast_bytes(comm, &count, sizeof(count), root);
  values.resize(static_cast<std::size_t>(count));
  broadcast_bytes(comm, values.data(), values.size() * sizeof(T), root);
}

// A barrier that waits without spinning a core: MPI_Ibarrier polled with short sleeps. For
// background threads (the asynchronous checkpoint writer) whose collectives would otherwise
// busy-poll while a peer is still busy, taking CPU time from the training on the same cores.
// Collective over `comm`. Returns once every rank has arrived; sleeps `poll` between checks.
void quiet_barrier(MPI_Comm comm, std::chrono::microseconds poll = std::chrono::microseconds(500));

}  // namespace l3::dist
