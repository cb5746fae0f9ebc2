// Creating the NCCL communicator so that one rank's failure cannot strand the others, and calling
// it afterwards (CUDA builds).
//
// A rank whose ncclCommInitRank fails early (no memory left on its GPU, a broken network
// setting, a fault injected at `nccl.init`) never joins NCCL's bootstrap, and a blocking init on
// the other ranks waits for it until the job's time limit. So the communicator is created
// nonblocking (config.blocking = 0): every rank polls its init and, meanwhile, a notice from a
// failed peer, sent over MPI on a private duplicate of the run's communicator. A rank whose init
// fails sends that notice to every other rank; they abort their init. Then all ranks agree
// (dist::agree_on_failure): the failed rank reports its own error, the others "another rank
// failed".
//
// A nonblocking communicator's later calls may return ncclInProgress (the enqueue goes on in the
// background, e.g. while a collective's first use sets up its connections): settle() waits for
// the call to finish before anything else is done with the communicator.
#pragma once

#include <nccl.h>

#include <string_view>

#include "dist/world.hpp"

namespace l3::parallel {

// Throws core::internal_error "NCCL <what>: <the result's text>: <NCCL's last error>" unless
// status is ncclSuccess (`comm`: the communicator the call was made on, if any).
void check_nccl(ncclResult_t status, std::string_view what, ncclComm_t comm = nullptr);

// Collective over `world`; the calling thread's current CUDA device is this rank's GPU
// (`device`, for messages). Returns a nonblocking communicator the caller owns: it ends with
// ncclCommFinalize + ncclCommDestroy, or ncclCommAbort after a failure.
[[nodiscard]] ncclComm_t create_nccl_communicator(const dist::World& world, int device);

// The result of an NCCL call on `comm` that returned `status`, once it is no longer in
// progress: polls ncclCommGetAsyncError (short sleeps) while it says ncclInProgress.
[[nodiscard]] ncclResult_t settle(ncclComm_t comm, ncclResult_t status);

}  // namespace l3::parallel
