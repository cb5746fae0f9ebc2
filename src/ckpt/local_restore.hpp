// Resuming from the node-local checkpoint level (docs/HPC.md): the ranks list what their
// node's storage holds, check it (checksums; a damaged file counts as missing), and agree on
// the newest step whose every rank's state can be had: from its own file, from a copy on
// another node, or rebuilt from the XOR parity of its set. A state that is not on its rank's
// node now (a replacement node, an empty directory) is sent there over MPI and written as that
// rank's file before it is read, so that the level is whole again.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/local_files.hpp"

namespace l3::core {
class Logger;
}
namespace l3::dist {
class World;
}

namespace l3::ckpt {

// How one rank gets its state back.
enum class RestoreMode {
  direct,       // its own file, in its own directory: read in place
  moved,        // its own file, read in another rank's directory and sent to it
  copy,         // the partner copy another rank holds, sent to it
  xor_rebuild,  // rebuilt from the parity and states of the other members of its XOR set
};

// One member of a lost state's XOR set: what it contributes to the rebuild.
struct XorContributor {
  int position = 0;          // its place in the set
  int reader = 0;            // the rank that reads its files and sends their blocks
  std::string state;         // its state file
  std::string parity;        // its parity file
  std::int64_t payload = 0;  // where the parity file's parity bytes begin
};

struct RankRestore {
  RestoreMode mode = RestoreMode::direct;
  // direct, moved, copy: the file holding the state, and (moved, copy) the rank that reads it.
  std::string path;
  int reader = -1;
  // xor_rebuild: the lost state's place in its set of `members`, its length in bytes, the
  // parity chunk's, and the members that send their blocks.
  int position = 0;
  int members = 0;
  std::int64_t length = 0;
  std::int64_t chunk = 0;
  std::vector<XorContributor> contributors;
};

// The step every rank restores and how each gets its state: one RankRestore per rank.
struct RestorePlan {
  std::int64_t step = 0;
  std::vector<RankRestore> ranks;
};

struct LocalResume {
  std::int64_t step = 0;
  LocalState state;         // this rank's: the manifest it carries and its ranges
  std::string description;  // where each state came from, for the log
  bool rebuilt = false;     // some rank's state came from another node
};

// Collective. The newest step of the level at `directory` (this rank's) not older than
// `not_before` (-1: any) that every rank can be restored from, or nothing (logged: why not).
// `checksums`: check every byte of every file first (else headers and sizes; the states read
// are checked whole in any case). Only files of the run `run_key` (train/run_identity.hpp) are
// used; those of another run are left unused, with a warning: a node's storage outlives jobs.
[[nodiscard]] std::optional<LocalResume> resume_from_local_level(
    const dist::World& world, const core::Logger& log, const std::string& directory,
    std::int64_t not_before, bool checksums, const std::string& run_key);

// The files of one rank's directory of the level, checked, for the inventory: those with index
// i where i % shares == share (the ranks sharing a directory split the checking). Each entry:
// {"step", "kind" (state, copy, xor), "owner" (the rank whose state it is), "path", "reader"
// (`reader`: who can read it), "ok", "problem", and from its header "world_size" and, for
// parity, "set", "position", "lengths", "chunk", "payload"}.
[[nodiscard]] nlohmann::json local_inventory(const std::string& directory, int reader, int share,
                                             int shares, bool checksums);
// How every rank of `world_size` can get its state from `entries` (the good files of one step;
// `directories[reader]` says where each reader is: a state read in its own rank's directory is
// read in place): one entry per rank, or `missing` set to why not (the entries are then
// incomplete).
[[nodiscard]] std::vector<RankRestore> plan_local_step(const std::vector<nlohmann::json>& entries,
                                                       const std::vector<std::string>& directories,
                                                       int world_size, std::string& missing);

// Collective: whether any rank's directory of the level holds a step.
[[nodiscard]] bool local_level_has_steps(const dist::World& world, const std::string& directory);

// Collective: removes the level's steps newer than `step` (all of them for -1): what a crashed
// run wrote after the step a run resumes from, or an earlier run's before a fresh start.
void discard_local_steps_after(const dist::World& world, const std::string& directory,
                               std::int64_t step);

}  // namespace l3::ckpt
