// Resuming from the node-local checkpoint level (docs/HPC.md): the ranks list what their
// node's storage holds, check it (checksums; a damaged file counts as missing), and agree on
// the newest step whose every rank's state can be had: from its own file, from a copy on
// another node, or rebuilt from the XOR parity of its set. A state that is not on its rank's
// node now (a replacement node, an empty directory) is sent there over MPI and written as that
// rank's file before it is read, so that the level is whole again.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/local_files.hpp"

namespace l3::core {
class Logger;
}
namespace l3::dist {
class World;
}

namespace l3::ckpt {

struct LocalResume {
  std::int64_t step = 0;
  LocalState state;         // this rank's: the manifest it carries and its ranges
  std::string description;  // where each state came from, for the log
  bool rebuilt = false;     // some rank's state came from another node
};

// Collective. The newest step of the level at `directory` (this rank's) not older than
// `not_before` (-1: any) that every rank can be restored from, or nothing (logged: why not).
// `checksums`: check every byte of every file first (else headers and sizes; the states read
// are checked whole in any case).
[[nodiscard]] std::optional<LocalResume> resume_from_local_level(const dist::World& world,
                                                                 const core::Logger& log,
                                                                 const std::string& directory,
                                                                 std::int64_t not_before,
                                                                 bool checksums);

// Collective: whether any rank's directory of the level holds a step.
[[nodiscard]] bool local_level_has_steps(const dist::World& world, const std::string& directory);

// Collective: removes the level's steps newer than `step` (all of them for -1): what a crashed
// run wrote after the step a run resumes from, or an earlier run's before a fresh start.
void discard_local_steps_after(const dist::World& world, const std::string& directory,
                               std::int64_t step);

}  // namespace l3::ckpt
