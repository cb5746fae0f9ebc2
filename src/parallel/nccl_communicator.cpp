#include "parallel/nccl_communicator.hpp"

#include <fmt/format.h>

#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"
#include "dist/point_to_point.hpp"
#include "dist/request.hpp"

namespace l3::parallel {

namespace {

constexpr int kNoticeTag = 1;
// Init takes hundreds of milliseconds; a millisecond between polls costs nothing there. A call
// in progress later is waited for at a finer grain.
constexpr std::chrono::milliseconds kInitPoll{1};
constexpr std::chrono::microseconds kCallPoll{20};

// Polls this rank's nonblocking init until it ends (throws when it failed) or a failed peer's
// notice arrives (the init is then still in progress, and the caller aborts it).
void wait_for_init(ncclComm_t comm, ncclResult_t state, dist::Request& notice,
                   std::string_view what) {
  while (state == ncclInProgress) {
    if (notice.test("NCCL init notice")) return;
    std::this_thread::sleep_for(kInitPoll);
    check_nccl(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError (init)", comm);
  }
  check_nccl(state, what, comm);
}

// Receives every notice sent to this rank (one per failed peer other than itself; the first one
// may have arrived already) or cancels the receive nobody will match, then completes the sends.
void drain_notices(MPI_Comm notices, dist::Request& notice, int expected,
                   std::vector<dist::Request>& sends) {
  if (expected == 0) {
    if (notice.active()) notice.cancel("NCCL init notice");
  } else {
    notice.wait("NCCL init notice");
    for (int i = 1; i < expected; ++i)
      (void)dist::receive_value<int>(notices, MPI_ANY_SOURCE, kNoticeTag, "NCCL init notice");
  }
  dist::Request::wait_all(sends, "NCCL init notices");
}

}  // namespace

void check_nccl(ncclResult_t status, std::string_view what, ncclComm_t comm) {
  if (status == ncclSuccess) return;
  // The result code's text is generic ("unhandled system error"); NCCL's last error says what
  // failed (a socket, a CUDA call, a peer).
  const char* last = ncclGetLastError(comm);
  const std::string_view detail = last != nullptr ? std::string_view(last) : std::string_view();
  throw core::internal_error(
      detail.empty() ? fmt::format("NCCL {}: {} (NCCL_DEBUG=WARN prints NCCL's own account)", what,
                                   ncclGetErrorString(status))
                     : fmt::format("NCCL {}: {}: {}", what, ncclGetErrorString(status), detail));
}

ncclComm_t create_nccl_communicator(const dist::World& world, int device) {
  ncclUniqueId id{};
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  dist::broadcast_bytes(world.comm(), &id, sizeof(id), 0);

  // Notices travel on a communicator of their own: nothing else can match them.
  const dist::UniqueComm notices = world.duplicate_comm();
  int failed_peer = -1;
  dist::Request notice = dist::start_receive(notices.get(), std::span(&failed_peer, 1),
                                             MPI_ANY_SOURCE, kNoticeTag, "NCCL init notice");
  ncclComm_t comm = nullptr;
  try {
    core::fault_point("nccl.init", world.rank());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t started =
        ncclCommInitRankConfig(&comm, world.size(), id, world.rank(), &config);
    wait_for_init(comm, started, notice,
                  fmt::format("ncclCommInitRank (rank {} of {}, device {})", world.rank(),
                              world.size(), device));
  } catch (...) {
    failure = std::current_exception();
  }

  // The notices' content: alive until the sends are complete (drain_notices).
  const int me = world.rank();
  std::vector<dist::Request> sends;
  if (failure) {
    sends.reserve(static_cast<std::size_t>(world.size()));
    for (int r = 0; r < world.size(); ++r) {
      if (r == me) continue;
      sends.push_back(
          dist::start_send(notices.get(), std::span(&me, 1), r, kNoticeTag, "NCCL init notice"));
    }
  }
  // Every rank gets here: at once when its init succeeded, after its notices when it failed,
  // after a notice when a peer failed. (A rank told of a failure has not failed itself.)
  const int failures =
      dist::all_reduce(notices.get(), failure ? 1 : 0, dist::ReduceOp::sum, "NCCL init failures");
  drain_notices(notices.get(), notice, failures - (failure ? 1 : 0), sends);
  if (failures > 0 && comm != nullptr) {
    (void)ncclCommAbort(comm);  // in progress, or complete while a peer failed: never destroyed
    comm = nullptr;
  }
  dist::agree_on_failure(world, failure);
  return comm;
}

ncclResult_t settle(ncclComm_t comm, ncclResult_t status) {
  while (status == ncclInProgress) {
    std::this_thread::sleep_for(kCallPoll);
    ncclResult_t state = ncclInProgress;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) return r;
    status = state;
  }
  return status;
}

}  // namespace l3::parallel
