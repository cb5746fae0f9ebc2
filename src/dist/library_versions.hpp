// The versions of the libraries this program runs with, MPI's included: printed by --version
// and `info`, recorded in checkpoint manifests. core::library_versions() lists those core can
// ask; MPI is asked here because only src/dist calls MPI and core is the layer below dist
// (docs/DEVELOPING.md), so the callers, all above dist, take the whole list from here.
#pragma once

#include <vector>

#include "core/build_info.hpp"

namespace l3::dist {

// "MPI": the library's own first line up to its first comma and the standard it implements,
// e.g. "MPICH Version: 4.0.2 (MPI 4.0)". Safe to call before MPI is initialised.
[[nodiscard]] core::LibraryVersion mpi_library_version();

// MPI first, then core::library_versions(). Safe to call before MPI is initialised.
[[nodiscard]] std::vector<core::LibraryVersion> library_versions();

}  // namespace l3::dist
