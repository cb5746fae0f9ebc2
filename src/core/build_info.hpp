// What this program is and what it was built and linked against: printed by --version and
// `info`, recorded in checkpoint manifests so that a result can be traced to its build.
#pragma once

#include <string>
#include <vector>

namespace l3::core {

struct BuildInfo {
  std::string version;     // project version, e.g. "0.1.0"
  std::string git_commit;  // `git describe --always --dirty` at build time, or "unknown"
  std::string build_type;  // Release, Debug, ...
  std::string compiler;    // e.g. "GNU 12.2.0"
  std::string sanitizers;  // empty unless built with L3_SANITIZE
  bool cuda_backend = false;
  std::string cuda_archs;  // as configured, e.g. "80,90"
};

[[nodiscard]] BuildInfo build_info();

struct LibraryVersion {
  std::string name;
  std::string version;
};

// The versions of the host-side libraries as reported at run time by the libraries themselves
// (HDF5, OpenBLAS, PCRE2) or fixed at compile time (Boost, fmt, nlohmann-json). Not MPI's: only
// src/dist calls MPI, a layer above this one; dist::library_versions() is this list with MPI's
// first, and what the program prints and records.
[[nodiscard]] std::vector<LibraryVersion> library_versions();

}  // namespace l3::core
