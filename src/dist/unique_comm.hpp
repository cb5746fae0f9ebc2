// Owning handle for an MPI communicator: freed on destruction (unless MPI is already finalized,
// when freeing is no longer allowed and the OS reclaims everything anyway).
#pragma once

#include <mpi.h>

#include <utility>

namespace l3::dist {

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

}  // namespace l3::dist
