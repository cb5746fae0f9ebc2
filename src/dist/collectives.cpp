#include "dist/collectives.hpp"

#include <algorithm>
#include <limits>
#include <thread>

#include "core/error.hpp"
#include "dist/communicator.hpp"
#include "dist/wait_policy.hpp"

namespace l3::dist {

void agree_on_failure(const World& world, const std::exception_ptr& local) {
  const int mine = local ? core::summarize(local).exit_code : 0;
  int worst = 0;
  run_collective(
      "MPI_Allreduce", "failure",
      [&] { return MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, world.comm()); },
      [&](MPI_Request* request) {
        return MPI_Iallreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, world.comm(), request);
      });
  if (worst == 0) return;
  if (local) std::rethrow_exception(local);
  throw core::PeerFailure(worst);
}

std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& mine, int root) {
  int rank = 0;
  int size = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  if (mine.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw core::internal_error("gather_strings: text longer than 2 GiB");
  }

  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(rank == root ? static_cast<std::size_t>(size) : 0U);
  run_collective(
      "MPI_Gather", "string lengths",
      [&] { return MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm); },
      [&](MPI_Request* request) {
        return MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm, request);
      });

  std::vector<int> displacements(lengths.size());
  long long total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    if (total > std::numeric_limits<int>::max()) {
      throw core::internal_error("gather_strings: gathered text longer than 2 GiB");
    }
    displacements[r] = static_cast<int>(total);
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  run_collective(
      "MPI_Gatherv", "strings",
      [&] {
        return MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                           displacements.data(), MPI_CHAR, root, comm);
      },
      [&](MPI_Request* request) {
        return MPI_Igatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(),
                            displacements.data(), MPI_CHAR, root, comm, request);
      });

  std::vector<std::string> out;
  out.reserve(lengths.size());
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    out.push_back(all.substr(static_cast<std::size_t>(displacements[r]),
                             static_cast<std::size_t>(lengths[r])));
  }
  return out;
}

void broadcast_bytes(MPI_Comm comm, void* data, std::size_t bytes, int root) {
  constexpr std::size_t kPiece = 1ULL << 30U;
  auto* p = static_cast<char*>(data);
  for (std::size_t done = 0; done < bytes; done += kPiece) {
    const auto n = static_cast<int>(std::min(kPiece, bytes - done));
    run_collective(
        "MPI_Bcast", "bytes", [&] { return MPI_Bcast(p + done, n, MPI_BYTE, root, comm); },
        [&](MPI_Request* request) {
          return MPI_Ibcast(p + done, n, MPI_BYTE, root, comm, request);
        });
  }
}

std::string broadcast_string(MPI_Comm comm, const std::string& text, int root) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  if (text.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw core::internal_error("broadcast_string: text longer than 2 GiB");
  }
  int length = rank == root ? static_cast<int>(text.size()) : 0;
  run_collective(
      "MPI_Bcast", "string length", [&] { return MPI_Bcast(&length, 1, MPI_INT, root, comm); },
      [&](MPI_Request* request) { return MPI_Ibcast(&length, 1, MPI_INT, root, comm, request); });
  std::string out = rank == root ? text : std::string(static_cast<std::size_t>(length), '\0');
  run_collective(
      "MPI_Bcast", "string", [&] { return MPI_Bcast(out.data(), length, MPI_CHAR, root, comm); },
      [&](MPI_Request* request) {
        return MPI_Ibcast(out.data(), length, MPI_CHAR, root, comm, request);
      });
  return out;
}

void quiet_barrier(MPI_Comm comm, std::chrono::microseconds poll) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm, &request), "MPI_Ibarrier");
  int done = 0;
  for (;;) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done != 0) return;
    std::this_thread::sleep_for(poll);
  }
}

}  // namespace l3::dist
