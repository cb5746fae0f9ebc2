// MPI's lifetime for a process: initialises MPI unless the host application already did, and
// finalises it only if it was the one that initialised it. An embedding application that owns
// MPI keeps owning it.
#pragma once

#include <mpi.h>

#include <string_view>

namespace l3::dist {

// The MPI thread support levels (MPI_THREAD_SINGLE ... MPI_THREAD_MULTIPLE), by name.
[[nodiscard]] std::string_view thread_level_name(int level) noexcept;

// MPI_Abort on `comm` with `code`: ends every process of the job (for a rank that cannot wait
// for the others any longer). Never returns: should MPI_Abort return, the process exits with
// `code` itself.
[[noreturn]] void abort_job(MPI_Comm comm, int code) noexcept;

class MpiRuntime {
 public:
  // Requests MPI_THREAD_MULTIPLE: the prefetch and asynchronous-checkpoint threads make MPI
  // calls on their own communicators. The level granted is recorded, not enforced here; the
  // features that need it check provided_thread_level().
  MpiRuntime(int* argc, char*** argv);
  MpiRuntime() : MpiRuntime(nullptr, nullptr) {}
  ~MpiRuntime();

  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  MpiRuntime(MpiRuntime&&) = delete;
  MpiRuntime& operator=(MpiRuntime&&) = delete;

  [[nodiscard]] bool initialized_here() const noexcept { return initialized_here_; }
  [[nodiscard]] int provided_thread_level() const noexcept { return provided_; }

 private:
  bool initialized_here_ = false;
  int provided_ = 0;
};

}  // namespace l3::dist
