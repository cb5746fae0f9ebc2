// Gathering variable-length text (per-rank reports, error messages) to one rank.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace l3::dist {

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

}  // namespace l3::dist
