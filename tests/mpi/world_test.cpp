// dist::World on communicators handed to it by a host application that initialised MPI itself
// (see mpi_catch_main.cpp). Run with 2 and 4 ranks.
#include "dist/world.hpp"

#include <mpi.h>

#include <string>
#include <vector>

#include "catch.hpp"
#include "dist/collectives.hpp"
#include "dist/mpi_runtime.hpp"

namespace {
int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}
}  // namespace

TEST_CASE("World over the whole job", "[world]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  CHECK(world.rank() == world_rank());
  CHECK(world.size() == world_size());
  CHECK(world.is_root() == (world_rank() == 0));
  // The test launcher runs every rank on this machine: one node.
  CHECK(world.node_count() == 1);
  CHECK(world.node_id() == 0);
  CHECK(world.local_size() == world.size());
  CHECK(world.local_rank() == world.rank());
  CHECK_FALSE(world.host_name().empty());
  CHECK(world.thread_level() >= MPI_THREAD_SINGLE);
  // World works on its own duplicate, never on the communicator it was given.
  int compare = MPI_UNEQUAL;
  MPI_Comm_compare(world.comm(), MPI_COMM_WORLD, &compare);
  CHECK(compare == MPI_CONGRUENT);
}

TEST_CASE("World on a split communicator sees only its half", "[world]") {
  REQUIRE(world_size() % 2 == 0);
  const int half = world_size() / 2;
  // The host splits the job into two halves and reverses the order inside each, so that a
  // World that secretly used MPI_COMM_WORLD would get rank and size wrong.
  const int color = world_rank() < half ? 0 : 1;
  MPI_Comm part = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, -world_rank(), &part);
  {
    const l3::dist::World world(part);
    CHECK(world.size() == half);
    const int expected_rank =
        color == 0 ? half - 1 - world_rank() : world_size() - 1 - world_rank();
    CHECK(world.rank() == expected_rank);
    CHECK(world.local_size() == half);
    CHECK(world.node_count() == 1);

    // A collective over the World involves exactly its half.
    int sum = 0;
    const int one = 1;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, world.comm());
    CHECK(sum == half);

    // Texts gathered to its rank 0 come from its own members, in its rank order.
    const std::vector<std::string> names =
        l3::dist::gather_strings(world.comm(), std::to_string(world_rank()), 0);
    if (world.is_root()) {
      REQUIRE(names.size() == static_cast<std::size_t>(half));
      for (int r = 0; r < half; ++r) {
        const int expected_world_rank = color == 0 ? half - 1 - r : world_size() - 1 - r;
        CHECK(names[static_cast<std::size_t>(r)] == std::to_string(expected_world_rank));
      }
    } else {
      CHECK(names.empty());
    }

    // World::split: each half splits again by parity of its rank.
    const auto quarter = world.split(world.rank() % 2, world.rank());
    REQUIRE(quarter.has_value());
    CHECK(quarter->size() == (half + 1 - world.rank() % 2) / 2);
    const auto none = world.split(MPI_UNDEFINED, 0);
    CHECK_FALSE(none.has_value());
  }
  MPI_Comm_free(&part);
}

TEST_CASE("World's traffic cannot match the host's", "[world]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  if (world.size() < 2) return;
  // The host sends on its communicator; the library's duplicate must not see the message.
  const int peer = (world_rank() + 1) % world_size();
  const int from = (world_rank() + world_size() - 1) % world_size();
  int payload = world_rank();
  MPI_Request send = MPI_REQUEST_NULL;
  MPI_Isend(&payload, 1, MPI_INT, peer, 17, MPI_COMM_WORLD, &send);
  MPI_Barrier(MPI_COMM_WORLD);  // the message is posted everywhere before we probe
  int on_library_comm = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, world.comm(), &on_library_comm, MPI_STATUS_IGNORE);
  CHECK(on_library_comm == 0);
  int received = -1;
  MPI_Recv(&received, 1, MPI_INT, from, 17, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Wait(&send, MPI_STATUS_IGNORE);
  CHECK(received == from);
}

TEST_CASE("MpiRuntime leaves a host-initialised MPI alone", "[world]") {
  {
    const l3::dist::MpiRuntime runtime;
    CHECK_FALSE(runtime.initialized_here());
    int provided = 0;
    MPI_Query_thread(&provided);
    CHECK(runtime.provided_thread_level() == provided);
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(finalized == 0);
  CHECK(MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS);  // the host can still use MPI
}
