// Collectives: MPI's own, typed (the datatype comes from the element type, dist/mpi_type.hpp;
// each is one MPI call, so the numerics are MPI's: the blocking call under the active wait
// policy, its nonblocking twin completed by quiet polling under the passive one, the same
// bits, dist/wait_policy.hpp), and those the library builds from them:
// agreeing on a failure, moving text and byte arrays between ranks, and a barrier that sleeps
// instead of spinning. `what` says what is being moved, for the error when MPI fails.
#pragma once

#include <mpi.h>

#include <chrono>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/mpi_type.hpp"
#include "dist/wait_policy.hpp"
#include "dist/world.hpp"

namespace l3::dist {

// MPI_Allreduce in place: every rank's `values` becomes the element-wise reduction over ranks.
template <MpiValue T>
void all_reduce(MPI_Comm comm, std::span<T> values, ReduceOp op, std::string_view what = {}) {
  const int count = mpi_count(values.size(), "MPI_Allreduce", what);
  run_collective(
      "MPI_Allreduce", what,
      [&] {
        return MPI_Allreduce(MPI_IN_PLACE, values.data(), count, mpi_type<T>(), mpi_op(op), comm);
      },
      [&](MPI_Request* request) {
        return MPI_Iallreduce(MPI_IN_PLACE, values.data(), count, mpi_type<T>(), mpi_op(op), comm,
                              request);
      });
}
// The same for one value: returns the reduction of every rank's `value`.
template <MpiValue T>
[[nodiscard]] T all_reduce(MPI_Comm comm, T value, ReduceOp op, std::string_view what = {}) {
  all_reduce(comm, std::span<T>(&value, 1), op, what);
  return value;
}

// MPI_Allgather: `all` (size() * mine.size() elements) receives every rank's `mine`, in rank
// order.
template <MpiValue T>
void all_gather(MPI_Comm comm, std::span<const std::type_identity_t<T>> mine, std::span<T> all,
                std::string_view what = {}) {
  const int count = mpi_count(mine.size(), "MPI_Allgather", what);
  run_collective(
      "MPI_Allgather", what,
      [&] {
        return MPI_Allgather(mine.data(), count, mpi_type<T>(), all.data(), count, mpi_type<T>(),
                             comm);
      },
      [&](MPI_Request* request) {
        return MPI_Iallgather(mine.data(), count, mpi_type<T>(), all.data(), count, mpi_type<T>(),
                              comm, request);
      });
}
// The same for one value per rank: element r of the result is rank r's.
template <MpiValue T>
[[nodiscard]] std::vector<T> all_gather(MPI_Comm comm, const T& mine, std::string_view what = {}) {
  std::vector<T> all(static_cast<std::size_t>(comm_size(comm)));
  all_gather(comm, std::span<const T>(&mine, 1), std::span<T>(all), what);
  return all;
}

// MPI_Allgatherv in place: rank r's `counts[r]` elements at `displacements[r]` of `buffer`
// (already there on rank r) reach every rank's buffer at the same place.
template <MpiValue T>
void all_gatherv(MPI_Comm comm, std::span<T> buffer, std::span<const int> counts,
                 std::span<const int> displacements, std::string_view what = {}) {
  run_collective(
      "MPI_Allgatherv", what,
      [&] {
        return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data(), counts.data(),
                              displacements.data(), mpi_type<T>(), comm);
      },
      [&](MPI_Request* request) {
        return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer.data(), counts.data(),
                               displacements.data(), mpi_type<T>(), comm, request);
      });
}

// MPI_Reduce_scatter: `send` holds every rank's block, counts[r] elements each in rank order;
// this rank's `receive` (counts[rank] elements) becomes the reduction of its block over ranks.
template <MpiValue T>
void reduce_scatter(MPI_Comm comm, std::span<const std::type_identity_t<T>> send,
                    std::span<T> receive, std::span<const int> counts, ReduceOp op,
                    std::string_view what = {}) {
  run_collective(
      "MPI_Reduce_scatter", what,
      [&] {
        return MPI_Reduce_scatter(send.data(), receive.data(), counts.data(), mpi_type<T>(),
                                  mpi_op(op), comm);
      },
      [&](MPI_Request* request) {
        return MPI_Ireduce_scatter(send.data(), receive.data(), counts.data(), mpi_type<T>(),
                                   mpi_op(op), comm, request);
      });
}

// MPI_Reduce_scatter_block: `send` holds size() blocks of receive.size() elements; this rank's
// `receive` becomes the reduction of its block over ranks.
template <MpiValue T>
void reduce_scatter_block(MPI_Comm comm, std::span<const std::type_identity_t<T>> send,
                          std::span<T> receive, ReduceOp op, std::string_view what = {}) {
  const int count = mpi_count(receive.size(), "MPI_Reduce_scatter_block", what);
  run_collective(
      "MPI_Reduce_scatter_block", what,
      [&] {
        return MPI_Reduce_scatter_block(send.data(), receive.data(), count, mpi_type<T>(),
                                        mpi_op(op), comm);
      },
      [&](MPI_Request* request) {
        return MPI_Ireduce_scatter_block(send.data(), receive.data(), count, mpi_type<T>(),
                                         mpi_op(op), comm, request);
      });
}

// MPI_Bcast of one value: every rank returns root's `value`.
template <MpiValue T>
[[nodiscard]] T broadcast_value(MPI_Comm comm, T value, int root, std::string_view what = {}) {
  run_collective(
      "MPI_Bcast", what, [&] { return MPI_Bcast(&value, 1, mpi_type<T>(), root, comm); },
      [&](MPI_Request* request) {
        return MPI_Ibcast(&value, 1, mpi_type<T>(), root, comm, request);
      });
  return value;
}

// MPI_Gather of a trivially copyable value as its bytes (a struct of results): on `root`,
// element r is rank r's `mine`; elsewhere the result is empty.
template <typename T>
requires std::is_trivially_copyable_v<T>
[[nodiscard]] std::vector<T> gather_bytes(MPI_Comm comm, const T& mine, int root,
                                          std::string_view what = {}) {
  std::vector<T> all(comm_rank(comm) == root ? static_cast<std::size_t>(comm_size(comm)) : 0U);
  constexpr int kBytes = static_cast<int>(sizeof(T));
  run_collective(
      "MPI_Gather", what,
      [&] { return MPI_Gather(&mine, kBytes, MPI_BYTE, all.data(), kBytes, MPI_BYTE, root, comm); },
      [&](MPI_Request* request) {
        return MPI_Igather(&mine, kBytes, MPI_BYTE, all.data(), kBytes, MPI_BYTE, root, comm,
                           request);
      });
  return all;
}

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
