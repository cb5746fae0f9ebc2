// Messages between two ranks, typed: blocking send, receive and the paired exchange
// (MPI_Send, MPI_Recv, MPI_Sendrecv) with the datatype taken from the element type
// (dist/mpi_type.hpp). Nonblocking ones are in dist/request.hpp. Under the passive wait policy
// (dist/wait_policy.hpp) the blocking ones are nonblocking ones completed by quiet polling. `what`
// says what is being moved, for the error when MPI fails.
#pragma once

#include <mpi.h>

#include <span>
#include <string_view>
#include <type_traits>

#include "dist/communicator.hpp"
#include "dist/mpi_type.hpp"
#include "dist/wait_policy.hpp"

namespace l3::dist {

// MPI_Send of `data` (T may be const) to `destination` with `tag`.
template <typename T>
requires MpiValue<T>
void send(MPI_Comm comm, std::span<T> data, int destination, int tag, std::string_view what = {}) {
  const int count = mpi_count(data.size(), "MPI_Send", what);
  if (wait_policy() == WaitPolicy::passive) {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Isend(data.data(), count, mpi_type<T>(), destination, tag, comm, &request),
              "MPI_Isend", what);
    complete_request(request, what);
    return;
  }
  check_mpi(MPI_Send(data.data(), count, mpi_type<T>(), destination, tag, comm), "MPI_Send", what);
}

// MPI_Recv into `data` from `source` (a rank or MPI_ANY_SOURCE) with `tag`: the message must
// hold at most data.size() elements.
template <MpiValue T>
void receive(MPI_Comm comm, std::span<T> data, int source, int tag, std::string_view what = {}) {
  const int count = mpi_count(data.size(), "MPI_Recv", what);
  if (wait_policy() == WaitPolicy::passive) {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Irecv(data.data(), count, mpi_type<T>(), source, tag, comm, &request),
              "MPI_Irecv", what);
    complete_request(request, what);
    return;
  }
  check_mpi(MPI_Recv(data.data(), count, mpi_type<T>(), source, tag, comm, MPI_STATUS_IGNORE),
            "MPI_Recv", what);
}

// One value each way.
template <MpiValue T>
void send_value(MPI_Comm comm, const T& value, int destination, int tag,
                std::string_view what = {}) {
  send(comm, std::span<const T>(&value, 1), destination, tag, what);
}
template <MpiValue T>
[[nodiscard]] T receive_value(MPI_Comm comm, int source, int tag, std::string_view what = {}) {
  T value{};
  receive(comm, std::span<T>(&value, 1), source, tag, what);
  return value;
}

// MPI_Sendrecv: `out` to `destination` while `in` is received from `source`, both with `tag`
// (a ring exchange that cannot deadlock). `in` must hold the whole incoming message.
template <MpiValue T>
void send_receive(MPI_Comm comm, std::span<const std::type_identity_t<T>> out, int destination,
                  std::span<T> in, int source, int tag, std::string_view what = {}) {
  if (wait_policy() == WaitPolicy::passive) {
    MPI_Request receiving = MPI_REQUEST_NULL;
    MPI_Request sending = MPI_REQUEST_NULL;
    check_mpi(MPI_Irecv(in.data(), mpi_count(in.size(), "MPI_Irecv", what), mpi_type<T>(), source,
                        tag, comm, &receiving),
              "MPI_Irecv", what);
    check_mpi(MPI_Isend(out.data(), mpi_count(out.size(), "MPI_Isend", what), mpi_type<T>(),
                        destination, tag, comm, &sending),
              "MPI_Isend", what);
    complete_request(receiving, what);
    complete_request(sending, what);
    return;
  }
  check_mpi(MPI_Sendrecv(out.data(), mpi_count(out.size(), "MPI_Sendrecv", what), mpi_type<T>(),
                         destination, tag, in.data(), mpi_count(in.size(), "MPI_Sendrecv", what),
                         mpi_type<T>(), source, tag, comm, MPI_STATUS_IGNORE),
            "MPI_Sendrecv", what);
}
// The same for one value each way: returns what `source` sent.
template <MpiValue T>
[[nodiscard]] T send_receive_value(MPI_Comm comm, const T& out, int destination, int source,
                                   int tag, std::string_view what = {}) {
  T in{};
  send_receive(comm, std::span<const T>(&out, 1), destination, std::span<T>(&in, 1), source, tag,
               what);
  return in;
}

}  // namespace l3::dist
