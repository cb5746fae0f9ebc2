#include "dist/wait_policy.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "dist/communicator.hpp"

namespace l3::dist {
namespace {

std::atomic<WaitPolicy> g_policy{WaitPolicy::active};

// MPI_Test until the request completes: a few yields first (a peer already on its way gets the
// core at once), then sleeps growing from 10 us to 200 us (a core given back for good while a
// peer computes; at most 200 us of latency added to a wait that long already).
void poll_quietly(MPI_Request& request, std::string_view call, std::string_view what) {
  using std::chrono::microseconds;
  microseconds pause{10};
  for (int polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call, what);
    if (done != 0) return;
    if (polls < 4) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, microseconds{200});
  }
}

}  // namespace

WaitPolicy wait_policy() noexcept { return g_policy.load(std::memory_order_relaxed); }

void set_wait_policy(WaitPolicy policy) noexcept {
  g_policy.store(policy, std::memory_order_relaxed);
}

std::string_view to_string(WaitPolicy policy) noexcept {
  return policy == WaitPolicy::passive ? "passive" : "active";
}

void arrive_quietly(MPI_Comm comm, std::string_view what) {
  if (wait_policy() != WaitPolicy::passive) return;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm, &request), "MPI_Ibarrier", what);
  poll_quietly(request, "MPI_Test", what);
}

void complete_request(MPI_Request& request, std::string_view what) {
  if (wait_policy() == WaitPolicy::passive) {
    poll_quietly(request, "MPI_Test", what);
  } else {
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait", what);
  }
}

}  // namespace l3::dist
