#include "dist/world.hpp"

#include <array>

#include "core/error.hpp"
#include "dist/communicator.hpp"

namespace l3::dist {

World::World(MPI_Comm comm) {
  if (!mpi_is_initialized() || mpi_is_finalized()) {
    throw core::internal_error(
        "dist::World needs an initialised MPI (create a dist::MpiRuntime "
        "first, or initialise MPI in the host application)");
  }
  if (comm == MPI_COMM_NULL) throw core::internal_error("dist::World given MPI_COMM_NULL");

  comm_ = duplicate(comm);
  check_mpi(MPI_Comm_rank(comm_.get(), &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_.get(), &size_), "MPI_Comm_size");
  check_mpi(MPI_Query_thread(&thread_level_), "MPI_Query_thread");

  std::array<char, MPI_MAX_PROCESSOR_NAME> name{};
  int name_length = 0;
  check_mpi(MPI_Get_processor_name(name.data(), &name_length), "MPI_Get_processor_name");
  host_name_.assign(name.data(), static_cast<std::size_t>(name_length));

  MPI_Comm local = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm_.get(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  local_comm_ = UniqueComm(local);
  check_mpi(MPI_Comm_set_errhandler(local, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank(local)");
  check_mpi(MPI_Comm_size(local, &local_size_), "MPI_Comm_size(local)");

  // Node numbering: the lowest rank of each node is its leader; leaders ranked by world rank.
  MPI_Comm leaders = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_.get(), local_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders),
            "MPI_Comm_split(node leaders)");
  const UniqueComm leaders_owned(leaders);
  int leader_rank = 0;
  int leader_count = 0;
  if (local_rank_ == 0) {
    check_mpi(MPI_Comm_rank(leaders, &leader_rank), "MPI_Comm_rank(leaders)");
    check_mpi(MPI_Comm_size(leaders, &leader_count), "MPI_Comm_size(leaders)");
  }
  std::array<int, 2> node{leader_rank, leader_count};  // the leader's view, sent to its node
  check_mpi(MPI_Bcast(node.data(), 2, MPI_INT, 0, local), "MPI_Bcast(node id)");
  node_id_ = node[0];
  node_count_ = node[1];
}

UniqueComm World::duplicate_comm() const { return duplicate(comm_.get()); }

std::optional<World> World::split(int color, int key) const {
  MPI_Comm part = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_.get(), color, key, &part), "MPI_Comm_split");
  if (part == MPI_COMM_NULL) return std::nullopt;
  const UniqueComm owned(part);  // World keeps its own duplicate
  return World(part);
}

void World::barrier() const { check_mpi(MPI_Barrier(comm_.get()), "MPI_Barrier"); }

}  // namespace l3::dist
