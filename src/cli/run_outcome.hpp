// How a run ends on every rank: one exit code for the whole job and, when something failed,
// one `error: ...` line per distinct message, printed once by rank 0.
//
// Every rank calls conclude_run() with its own outcome. When all ranks get there (the usual
// case: bad options or bad data are seen by every rank, and success ends everywhere), rank 0
// prints the messages and every rank returns the same code, so `mpiexec`/`srun` exit with it.
// A failing rank whose peers do not arrive within the grace period (they are blocked in a
// collective or computing) prints its own message with its rank and calls MPI_Abort with its
// code: no job is left hanging on a dead rank.
#pragma once

#include <mpi.h>

#include <span>
#include <string>
#include <vector>

#include "core/log.hpp"

namespace l3::cli {

struct RankOutcome {
  int exit_code = 0;
  std::string message;  // empty when the rank has nothing to report
};

// The job's exit code from every rank's: 2 (bad input) over 1 (internal) over 75
// (checkpointed) over 0; any other code is kept as the largest seen.
[[nodiscard]] int combine_exit_codes(std::span<const int> codes) noexcept;

// Rank 0's lines: "error: MSG" when every rank reports the same message, otherwise one
// "error: [ranks 1,3-5] MSG" line per distinct message (at most max_lines, then a count).
[[nodiscard]] std::vector<std::string> error_lines(std::span<const RankOutcome> outcomes,
                                                   std::size_t max_lines = 8);

// "0-3,5,7-8"
[[nodiscard]] std::string format_rank_list(std::span<const int> sorted_ranks);

// Collective over `comm` (a private duplicate, so nothing else can match it). Returns the
// job's exit code, or does not return (MPI_Abort on `abort_comm`) as described above. `out`
// receives rank 0's error lines, or a failing rank's own line before an abort.
// abort_comm: the CLI passes MPI_COMM_WORLD, because MPICH aborts promptly only on that one
// (MPI_Abort on a duplicate waits for the other ranks to exit by themselves).
int conclude_run(MPI_Comm comm, MPI_Comm abort_comm, const RankOutcome& mine, double grace_seconds,
                 const core::LogSink& out);

// The grace period: $L3_ERROR_GRACE_SECONDS, default 10 s.
[[nodiscard]] double error_grace_seconds();

}  // namespace l3::cli
