// Turning MPI return codes into exceptions that say which call failed and why.
#pragma once

#include <mpi.h>

#include <string_view>

namespace l3::dist {

// Throws an internal Error "MPI_Xxx failed: <MPI's error string>" when rc != MPI_SUCCESS.
// Only meaningful on communicators whose error handler is MPI_ERRORS_RETURN (World sets it).
void check_mpi(int rc, std::string_view call);

[[nodiscard]] bool mpi_is_initialized() noexcept;
[[nodiscard]] bool mpi_is_finalized() noexcept;

}  // namespace l3::dist
