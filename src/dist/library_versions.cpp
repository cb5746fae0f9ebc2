#include "dist/library_versions.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <array>
#include <string_view>

#include "core/error.hpp"

namespace l3::dist {

core::LibraryVersion mpi_library_version() {
  std::array<char, MPI_MAX_LIBRARY_VERSION_STRING> mpi{};
  int mpi_length = 0;
  MPI_Get_library_version(mpi.data(), &mpi_length);  // allowed before MPI_Init
  int mpi_major = 0;
  int mpi_minor = 0;
  MPI_Get_version(&mpi_major, &mpi_minor);
  // First line only, up to the first comma: "MPICH Version: 4.0.2", "Open MPI v4.1.4".
  std::string_view mpi_text(mpi.data(), static_cast<std::size_t>(mpi_length));
  mpi_text = mpi_text.substr(0, mpi_text.find('\n'));
  mpi_text = mpi_text.substr(0, mpi_text.find(','));
  return {"MPI", fmt::format("{} (MPI {}.{})", core::one_line(mpi_text), mpi_major, mpi_minor)};
}

std::vector<core::LibraryVersion> library_versions() {
  std::vector<core::LibraryVersion> versions{mpi_library_version()};
  for (core::LibraryVersion& library : core::library_versions())
    versions.push_back(std::move(library));
  return versions;
}

}  // namespace l3::dist
