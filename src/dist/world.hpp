// The set of ranks a job runs on: the communicator the library was given (the CLI passes
// MPI_COMM_WORLD; an embedding application passes whatever it wants), never MPI_COMM_WORLD
// itself. World works on a private duplicate so that its traffic cannot match the host's.
#pragma once

#include <mpi.h>

#include <optional>
#include <string>

#include "dist/communicator.hpp"

namespace l3::dist {

class World {
 public:
  // Collective over `comm`. MPI must be initialised (see MpiRuntime).
  explicit World(MPI_Comm comm);

  [[nodiscard]] MPI_Comm comm() const noexcept { return comm_.get(); }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] bool is_root() const noexcept { return rank_ == 0; }

  // Ranks sharing this rank's node (MPI_Comm_split_type SHARED): device selection and
  // node-local work use these.
  [[nodiscard]] MPI_Comm local_comm() const noexcept { return local_comm_.get(); }
  [[nodiscard]] int local_rank() const noexcept { return local_rank_; }
  [[nodiscard]] int local_size() const noexcept { return local_size_; }
  // Nodes are numbered 0..node_count-1 in the order of their lowest rank.
  [[nodiscard]] int node_id() const noexcept { return node_id_; }
  [[nodiscard]] int node_count() const noexcept { return node_count_; }

  [[nodiscard]] const std::string& host_name() const noexcept { return host_name_; }
  // The thread support MPI granted this process (MPI_Query_thread).
  [[nodiscard]] int thread_level() const noexcept { return thread_level_; }

  // A new private communicator over the same ranks (for a protocol that must not interleave
  // with others, e.g. background I/O threads or the end-of-run error agreement). Collective.
  [[nodiscard]] UniqueComm duplicate_comm() const;

  // MPI_Comm_split of this world: ranks passing the same color form a new World, ordered by
  // key (ties by rank). A rank passing MPI_UNDEFINED gets std::nullopt. Collective.
  [[nodiscard]] std::optional<World> split(int color, int key) const;

  void barrier() const;

 private:
  UniqueComm comm_;
  UniqueComm local_comm_;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int node_id_ = 0;
  int node_count_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::string host_name_;
};

}  // namespace l3::dist
