// Nonblocking MPI operations as owned handles: a Request is started by start_send,
// start_receive or start_barrier (MPI_Isend, MPI_Irecv, MPI_Ibarrier) and completed by wait,
// test, cancel or wait_all.
//
// One still active when it is destroyed (an exception left its scope) is never waited for,
// since its peer may never come: a receive is cancelled and completed, so that MPI cannot
// write into its buffer later; a send is handed to MPI (MPI_Request_free: it completes on its
// own; its buffer must outlive the Request anyway); a barrier, which MPI allows neither to
// cancel nor to free, is left to MPI (the job is ending or aborting).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

#include "dist/communicator.hpp"
#include "dist/mpi_type.hpp"

namespace l3::dist {

class Request {
 public:
  enum class Kind : std::uint8_t { send, receive, collective };

  Request() noexcept = default;
  Request(MPI_Request request, Kind kind) noexcept : request_(request), kind_(kind) {}
  ~Request() { release(); }

  Request(Request&& other) noexcept
      : request_(std::exchange(other.request_, MPI_REQUEST_NULL)), kind_(other.kind_) {}
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      release();
      request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
      kind_ = other.kind_;
    }
    return *this;
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Not yet completed (MPI_REQUEST_NULL once waited for, tested complete or cancelled).
  [[nodiscard]] bool active() const noexcept { return request_ != MPI_REQUEST_NULL; }

  // MPI_Test: whether the operation is complete (then the Request is inactive). True for an
  // inactive Request, as in MPI.
  [[nodiscard]] bool test(std::string_view what = {});
  // MPI_Wait: returns once the operation is complete. At once for an inactive Request.
  void wait(std::string_view what = {});
  // MPI_Cancel then MPI_Wait (a cancelled request must still be completed): for a receive
  // nobody will match. Not for barriers (MPI forbids it).
  void cancel(std::string_view what = {});

  // MPI_Waitall over `requests` (inactive ones included, as in MPI).
  static void wait_all(std::span<Request> requests, std::string_view what = {});

 private:
  void release() noexcept;

  MPI_Request request_ = MPI_REQUEST_NULL;
  Kind kind_ = Kind::send;
};

// MPI_Isend of `data` (T may be const) to `destination` with `tag`. `data` must stay alive and
// unchanged until the Request completes.
template <typename T>
requires MpiValue<T>
[[nodiscard]] Request start_send(MPI_Comm comm, std::span<T> data, int destination, int tag,
                                 std::string_view what = {}) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(data.data(), mpi_count(data.size(), "MPI_Isend", what), mpi_type<T>(),
                      destination, tag, comm, &request),
            "MPI_Isend", what);
  return {request, Request::Kind::send};
}

// MPI_Irecv into `data` from `source` (a rank or MPI_ANY_SOURCE) with `tag`. `data` must stay
// alive until the Request completes (or is destroyed: that cancels it).
template <MpiValue T>
[[nodiscard]] Request start_receive(MPI_Comm comm, std::span<T> data, int source, int tag,
                                    std::string_view what = {}) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(data.data(), mpi_count(data.size(), "MPI_Irecv", what), mpi_type<T>(), source,
                      tag, comm, &request),
            "MPI_Irecv", what);
  return {request, Request::Kind::receive};
}

// MPI_Ibarrier: complete once every rank of comm has started it. Collective.
[[nodiscard]] Request start_barrier(MPI_Comm comm, std::string_view what = {});

}  // namespace l3::dist
