#include "train/nccl_communicator.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/fault_injection.hpp"
#include "dist/collectives.hpp"
#include "dist/communicator.hpp"

namespace l3::train {

namespace {

constexpr int kNoticeTag = 1;
// Init takes hundreds of milliseconds; a millisecond between polls costs nothing there. A call
// in progress later is waited for at a finer grain.
constexpr std::chrono::milliseconds kInitPoll{1};
constexpr std::chrono::microseconds kCallPoll{20};

// Polls this rank's nonblocking init until it ends (throws when it failed) or a failed peer's
// notice arrives (the init is then still in progress, and the caller aborts it).
void wait_for_init(ncclComm_t comm, ncclResult_t state, MPI_Request& notice,
                   std::string_view what) {
  while (state == ncclInProgress) {
    int arrived = 0;
    dist::check_mpi(MPI_Test(&notice, &arrived, MPI_STATUS_IGNORE), "MPI_Test (NCCL init notice)");
    if (arrived != 0) return;
    std::this_thread::sleep_for(kInitPoll);
    check_nccl(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError (init)", comm);
  }
  check_nccl(state, what, comm);
}

// Receives every notice sent to this rank (one per failed peer other than itself; the first one
// may have arrived already) or cancels the receive nobody will match, then completes the sends.
void drain_notices(MPI_Comm notices, MPI_Request& notice, int expected,
                   std::vector<MPI_Request>& sends) {
  if (expected == 0) {
    if (notice != MPI_REQUEST_NULL) {
      dist::check_mpi(MPI_Cancel(&notice), "MPI_Cancel (NCCL init notice)");
      dist::check_mpi(MPI_Wait(&notice, MPI_STATUS_IGNORE), "MPI_Wait (NCCL init notice)");
    }
  } else {
    dist::check_mpi(MPI_Wait(&notice, MPI_STATUS_IGNORE), "MPI_Wait (NCCL init notice)");
    for (int i = 1; i < expected; ++i) {
      int peer = -1;
      dist::check_mpi(
          MPI_Recv(&peer, 1, MPI_INT, MPI_ANY_SOURCE, kNoticeTag, notices, MPI_STATUS_IGNORE),
          "MPI_Recv (NCCL init notice)");
    }
  }
  dist::check_mpi(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE),
                  "MPI_Waitall (NCCL init notices)");
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
  MPI_Request notice = MPI_REQUEST_NULL;
  dist::check_mpi(
      MPI_Irecv(&failed_peer, 1, MPI_INT, MPI_ANY_SOURCE, kNoticeTag, notices.get(), &notice),
      "MPI_Irecv (NCCL init notice)");
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

  std::vector<MPI_Request> sends;
  if (failure) {
    const int me = world.rank();
    sends.reserve(static_cast<std::size_t>(world.size()));
    for (int r = 0; r < world.size(); ++r) {
      if (r == me) continue;
      MPI_Request& send = sends.emplace_back(MPI_REQUEST_NULL);
      dist::check_mpi(MPI_Isend(&me, 1, MPI_INT, r, kNoticeTag, notices.get(), &send),
                      "MPI_Isend (NCCL init notice)");
    }
  }
  // Every rank gets here: at once when its init succeeded, after its notices when it failed,
  // after a notice when a peer failed. (A rank told of a failure has not failed itself.)
  int failures = failure ? 1 : 0;
  dist::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, notices.get()),
                  "MPI_Allreduce (NCCL init failures)");
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

}  // namespace l3::train
