// MPI communicators as owned handles, and MPI return codes turned into exceptions that say
// which call failed and why.
#pragma once

#include <mpi.h>

#include <string_view>
#include <utility>

namespace l3::dist {

// Turning MPI return codes into exceptions that say which call failed and why.
// Throws an internal Error "MPI_Xxx failed: <MPI's error string>" when rc != MPI_SUCCESS.
// Only meaningful on communicators whose error handler is MPI_ERRORS_RETURN (World sets it).
void check_mpi(int rc, std::string_view call);
// The same for the typed wrappers: the message names "call(what)" ("call" when `what` is empty),
// formatted only on failure.
void check_mpi(int rc, std::string_view call, std::string_view what);

[[nodiscard]] bool mpi_is_initialized() noexcept;
[[nodiscard]] bool mpi_is_finalized() noexcept;

// Owning handle for an MPI communicator: freed on destruction (unless MPI is already finalized,
// when freeing is no longer allowed and the OS reclaims everything anyway).
class UniqueComm {
 public:
  UniqueComm() noexcept = default;
  explicit UniqueComm(MPI_Comm comm) noexcept : comm_(comm) {}
  ~UniqueComm() { reset(); }

  UniqueComm(UniqueComm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  UniqueComm& operator=(UniqueComm&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    }
    return *this;
  }
  UniqueComm(const UniqueComm&) = delete;
  UniqueComm& operator=(const UniqueComm&) = delete;

  [[nodiscard]] MPI_Comm get() const noexcept { return comm_; }
  [[nodiscard]] explicit operator bool() const noexcept { return comm_ != MPI_COMM_NULL; }
  void reset() noexcept;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// MPI_Comm_dup with MPI_ERRORS_RETURN installed, so failures become exceptions (check_mpi).
[[nodiscard]] UniqueComm duplicate(MPI_Comm comm);

// MPI_Comm_split: ranks passing the same `color` form a communicator, ordered by `key` (ties by
// rank); MPI_UNDEFINED gives an empty handle. Collective over comm. The new communicator
// inherits comm's error handler (MPI_ERRORS_RETURN on the library's communicators).
[[nodiscard]] UniqueComm split(MPI_Comm comm, int color, int key, std::string_view what = {});

// This rank's number in comm, and how many ranks comm has (local queries, no communication).
[[nodiscard]] int comm_rank(MPI_Comm comm);
[[nodiscard]] int comm_size(MPI_Comm comm);

}  // namespace l3::dist
