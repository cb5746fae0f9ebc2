// A scratch directory for MPI tests: created (empty) by rank 0 under the system's temporary
// directory, its path known to every rank. Named after the test and the process id so that
// concurrent ctest runs do not collide.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "dist/collectives.hpp"
#include "dist/world.hpp"

namespace l3::test {

inline std::string shared_directory(const dist::World& world, const char* suite, const char* name) {
  std::string path;
  if (world.is_root()) {
    path = (std::filesystem::temp_directory_path() /
            fmt::format("l3-{}-{}-{}", suite, name, ::getpid()))
               .string();
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  return dist::broadcast_string(world.comm(), path);
}

}  // namespace l3::test
