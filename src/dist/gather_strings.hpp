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

}  // namespace l3::dist
