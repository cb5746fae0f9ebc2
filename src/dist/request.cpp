#include "dist/request.hpp"

#include <vector>

#include "dist/wait_policy.hpp"

namespace l3::dist {

bool Request::test(std::string_view what) {
  int done = 0;
  check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
  return done != 0;
}

void Request::wait(std::string_view what) { complete_request(request_, what); }

void Request::cancel(std::string_view what) {
  check_mpi(MPI_Cancel(&request_), "MPI_Cancel", what);
  wait(what);
}

void Request::wait_all(std::span<Request> requests, std::string_view what) {
  if (wait_policy() == WaitPolicy::passive) {  // one after the other, each polled quietly
    for (Request& r : requests) r.wait(what);
    return;
  }
  // MPI wants the handles side by side; they go back (as MPI_REQUEST_NULL once complete).
  std::vector<MPI_Request> handles;
  handles.reserve(requests.size());
  for (const Request& r : requests) handles.push_back(r.request_);
  const int rc = MPI_Waitall(mpi_count(handles.size(), "MPI_Waitall", what), handles.data(),
                             MPI_STATUSES_IGNORE);
  for (std::size_t i = 0; i < requests.size(); ++i) requests[i].request_ = handles[i];
  check_mpi(rc, "MPI_Waitall", what);
}

void Request::release() noexcept {
  if (request_ == MPI_REQUEST_NULL || mpi_is_finalized()) return;
  switch (kind_) {
    case Kind::receive:
      if (MPI_Cancel(&request_) == MPI_SUCCESS) MPI_Wait(&request_, MPI_STATUS_IGNORE);
      break;
    case Kind::send:
      MPI_Request_free(&request_);
      break;
    case Kind::collective:
      break;
  }
  request_ = MPI_REQUEST_NULL;
}

Request start_barrier(MPI_Comm comm, std::string_view what) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm, &request), "MPI_Ibarrier", what);
  return {request, Request::Kind::collective};
}

}  // namespace l3::dist
