// How a rank waits for its peers in MPI. MPICH, Open MPI and UCX wait by polling: a rank inside
// MPI_Allreduce spins a core until its peers arrive. When ranks share cores (more ranks on a
// node than it has cores: a laptop, a busy node, tests), the spinning rank takes the core from
// the very peer it waits for, and each collective costs scheduler time slices instead of
// microseconds (measured: 4 ranks on 2 cores, tests/mpi/trainer 70 s against 3.4 s for 2 ranks).
//
// The passive policy waits without spinning: a collective runs as its nonblocking twin
// (MPI_Iallreduce for MPI_Allreduce, ...) whose request is polled with MPI_Test and short sleeps
// in between; blocking sends, receives and request waits, likewise; HDF5's collective opens and
// closes, which make many MPI calls inside, are preceded by a quiet barrier arrival. The
// reductions must give the blocking calls' bits (a run resumed under the other policy continues
// bit for bit): tests/mpi/collectives_test.cpp checks that on every MPI the tests run with. The
// active policy (MPI's own waiting) costs nothing extra and is the default when each rank has a
// core of its own.
//
// Every rank of a communicator must use the same policy (a nonblocking collective never matches
// a blocking one, and the quiet arrival is a collective of its own): the
// policy is agreed over the world when the thread budget is applied (dist/thread_budget.hpp)
// and holds for the whole process.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string_view>

#include "dist/communicator.hpp"

namespace l3::dist {

enum class WaitPolicy : std::uint8_t { active, passive };

[[nodiscard]] WaitPolicy wait_policy() noexcept;
// Sets the process's policy. Only between collectives, the same on every rank.
void set_wait_policy(WaitPolicy policy) noexcept;
[[nodiscard]] std::string_view to_string(WaitPolicy policy) noexcept;

// Passive policy: returns once every rank of `comm` has called it, sleeping between polls;
// active policy: returns at once. Collective over `comm` in the passive policy.
void arrive_quietly(MPI_Comm comm, std::string_view what = {});

// Completes `request` (MPI_Wait; under the passive policy MPI_Test with sleeps between polls).
void complete_request(MPI_Request& request, std::string_view what = {});

// One collective under the process's policy: `blocking()` (the MPI call, returning its code)
// under the active policy; under the passive one `nonblocking(&request)`, its MPI_I* twin with
// the same arguments, completed by quiet polling. `call` and `what` name it in errors.
template <typename Blocking, typename Nonblocking>
void run_collective(std::string_view call, std::string_view what, Blocking&& blocking,
                    Nonblocking&& nonblocking) {
  if (wait_policy() == WaitPolicy::passive) {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(nonblocking(&request), call, what);
    complete_request(request, what);
  } else {
    check_mpi(blocking(), call, what);
  }
}

}  // namespace l3::dist
