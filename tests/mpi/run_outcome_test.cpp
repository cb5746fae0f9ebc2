// conclude_run(): every rank arrives with its outcome; rank 0 prints, all return one code.
#include "cli/run_outcome.hpp"

#include <mpi.h>

#include <string>
#include <vector>

#include "catch.hpp"
#include "dist/world.hpp"

namespace {
struct Capture {
  std::vector<std::string> lines;
  l3::core::LogSink sink() {
    return [this](std::string_view line) { lines.emplace_back(line); };
  }
};
}  // namespace

TEST_CASE("success everywhere: code 0, nothing printed", "[outcome]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  Capture out;
  CHECK(l3::cli::conclude_run(world.comm(), MPI_COMM_WORLD, {0, ""}, 5.0, out.sink()) == 0);
  CHECK(out.lines.empty());
}

TEST_CASE("the same error on every rank is printed once by rank 0", "[outcome]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  Capture out;
  const int code = l3::cli::conclude_run(world.comm(), MPI_COMM_WORLD,
                                         {2, "run.ini: unknown option 'x'"}, 5.0, out.sink());
  CHECK(code == 2);
  if (world.is_root()) {
    CHECK(out.lines == std::vector<std::string>{"error: run.ini: unknown option 'x'\n"});
  } else {
    CHECK(out.lines.empty());
  }
}

TEST_CASE("one failing rank: every rank exits with its code, rank 0 names it", "[outcome]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  Capture out;
  const int failing = world.size() - 1;
  const l3::cli::RankOutcome mine = world.rank() == failing
                                        ? l3::cli::RankOutcome{2, "shard-3.h5: truncated"}
                                        : l3::cli::RankOutcome{0, ""};
  CHECK(l3::cli::conclude_run(world.comm(), MPI_COMM_WORLD, mine, 5.0, out.sink()) == 2);
  if (world.is_root()) {
    REQUIRE(out.lines.size() == 1);
    CHECK(out.lines[0] == "error: [rank " + std::to_string(failing) + "] shard-3.h5: truncated\n");
  }
}

TEST_CASE("different errors are grouped by message", "[outcome]") {
  const l3::dist::World world(MPI_COMM_WORLD);
  Capture out;
  const bool even = world.rank() % 2 == 0;
  const l3::cli::RankOutcome mine =
      even ? l3::cli::RankOutcome{1, "even trouble"} : l3::cli::RankOutcome{75, ""};
  // 1 (internal) outranks 75 (checkpointed).
  CHECK(l3::cli::conclude_run(world.comm(), MPI_COMM_WORLD, mine, 5.0, out.sink()) == 1);
  if (world.is_root()) {
    const std::string ranks = world.size() == 2 ? "rank 0" : "ranks 0,2";
    CHECK(out.lines == std::vector<std::string>{"error: [" + ranks + "] even trouble\n"});
  }
}
