// The node-local checkpoint level (docs/HPC.md, "Node-local checkpoints"): every rank writes
// only its own state (its ranges of the master weights and AdamW moments, with the manifest
// that says where training continues) to storage on its node, then protects it against the
// loss of the node with a copy on another node or XOR parity (ckpt/local_redundancy.hpp),
// exchanged over MPI. Every M-th one is also flushed to --ckpt-dir as an ordinary checkpoint,
// from the same snapshot, after the local level is complete.
//
//   <ckpt-local>/llama3-hpc.<run key>/step-00001200/rank-00003.state, .copy, .xor
//
// Asynchronous like CheckpointWriter: write() hands over a host snapshot and returns; a
// background thread on its own communicator does the rest. A step of the level is complete
// when every rank has written its files (the ranks agree). A node holds at most two steps: the
// newest complete one and the one being written, whose files take over (are written over)
// those of the complete step before it; other steps are removed. A failure of the level (a full
// local disk) is reported, not thrown: the run goes on, protected by --ckpt-dir; a failed flush
// throws like a failed checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_writer.hpp"
#include "ckpt/local_redundancy.hpp"
#include "ckpt/manifest.hpp"
#include "ckpt/rank_state.hpp"
#include "dist/world.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

struct LocalLevelConfig {
  std::string directory;  // this rank's directory of the level (node name expanded, run key)
  std::string node;       // this rank's node, recorded in its files
  RedundancyPlan plan;
  std::string run_key;  // recorded in parity files (state files have it in their manifest)
  bool async = true;
};

struct LocalWriteReport {
  std::int64_t step = 0;
  double seconds = 0;                  // from the snapshot to the agreement
  double state_seconds = 0;            // this rank: checksumming and writing its own file
  double redundancy_seconds = 0;       // this rank: the copy or parity exchange and its file
  std::int64_t bytes = 0;              // written by all ranks: states and their copies or parity
  std::string failure;                 // the level was not completed: why (the same on every rank)
  std::optional<WriteReport> flushed;  // the flush to --ckpt-dir, when there was one
};

class LocalCheckpointWriter {
 public:
  // Collective (duplicates the communicator, splits it into the XOR sets).
  LocalCheckpointWriter(const dist::World& world, LocalLevelConfig config);
  ~LocalCheckpointWriter();  // waits for a write in flight
  LocalCheckpointWriter(const LocalCheckpointWriter&) = delete;
  LocalCheckpointWriter& operator=(const LocalCheckpointWriter&) = delete;
  LocalCheckpointWriter(LocalCheckpointWriter&&) = delete;
  LocalCheckpointWriter& operator=(LocalCheckpointWriter&&) = delete;

  // Collective. Waits for the previous write, then writes `state` (this rank's state ranges)
  // as step manifest.step of the level. With `flush` (a writer with nothing in flight, left
  // alone until wait()), the same snapshot is then written to its root, each rank writing
  // `flush_ranges` of it (ZeRO-1 owners; none for a hybrid shard group's replicas).
  void write(const model::ParameterLayout& layout, Manifest manifest, RankState state,
             CheckpointWriter* flush, std::vector<model::FlatRange> flush_ranges);
  // Waits for the write in flight; throws only when its flush failed.
  std::optional<LocalWriteReport> wait();
  [[nodiscard]] RankState take_spare();
  void provide_spare(RankState spare);
  [[nodiscard]] bool busy() const noexcept;
  [[nodiscard]] bool ready() const noexcept;
  // A run resumed at `step` (from any level): it counts as complete for pruning.
  void resumed_at(std::int64_t step);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The directory of the level for one rank: `pattern` (--ckpt-local, "%h" the node name)
// expanded for `node`, then "llama3-hpc.<key>", the key the xxHash64 of --ckpt-dir's absolute
// path, so that runs writing different --ckpt-dir never share files.
[[nodiscard]] std::string local_level_directory(const std::string& pattern, const std::string& node,
                                                const std::string& ckpt_dir);

// The step directories of a level directory, newest first ("step-N").
[[nodiscard]] std::vector<std::int64_t> local_steps(const std::string& directory);

// Removes the level's step directories under `directory` for which `remove` is true.
void remove_local_steps(const std::string& directory,
                        const std::function<bool(std::int64_t)>& remove);

// Which ranks remove old steps in a directory of the level: of the ranks that share one
// directory string, the lowest. Collective over comm.
[[nodiscard]] bool prunes_directory(MPI_Comm comm, const std::string& directory);

}  // namespace l3::ckpt
