// Writing checkpoints (layout and protocol in docs/FORMAT.md):
//
//   1. rank 0 creates <root>/step-N.partial/ with model.h5 and optim.h5, every dataset allocated
//      (tensor_file.hpp), and broadcasts where each dataset's data lies;
//   2. every rank writes its slices of the master weights and AdamW moments there, fsyncs, and
//      checksums each slice (xxHash64);
//   3. the ranks AND their success; rank 0 writes manifest.json (with the tensor table of
//      checksums) through a temporary name + fsync, fsyncs the directory, renames it to step-N,
//      fsyncs the root, and replaces `latest` (temporary + fsync + rename);
//   4. rank 0 prunes: complete checkpoints beyond the newest `keep_last`, and stale .partial
//      directories.
// A crash anywhere leaves the previous checkpoints and `latest` intact.
//
// Asynchronous by default: write() takes a host snapshot and returns; a background thread
// (on its own communicator) does the rest while training continues. The next write() and
// wait() wait for it first. Its outcome is agreed by all ranks: every rank either sees the
// checkpoint committed or gets the same error.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/manifest.hpp"
#include "ckpt/rank_state.hpp"
#include "dist/world.hpp"
#include "model/parameter_layout.hpp"

namespace l3::ckpt {

struct WriterPolicy {
  int keep_last = 3;  // complete checkpoints kept (never fewer than 2)
  bool async = true;  // write on a background thread
};

struct WriteReport {
  std::string directory;   // the committed step directory
  double seconds = 0;      // from the snapshot to the commit
  std::int64_t bytes = 0;  // written by all ranks
};

class CheckpointWriter {
 public:
  // Collective (duplicates the communicator).
  CheckpointWriter(const dist::World& world, std::string root, WriterPolicy policy);
  ~CheckpointWriter();  // waits for a write in flight (errors are dropped: call wait())
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  CheckpointWriter(CheckpointWriter&&) = delete;
  CheckpointWriter& operator=(CheckpointWriter&&) = delete;

  // Collective. Waits for the previous write (rethrowing its failure), then writes `state`
  // (this rank's ranges) as checkpoint manifest.step; rank 0's `manifest` is the one written
  // (the tensor table is filled in here). Returns once the write is under way (async) or done.
  void write(const model::ParameterLayout& layout, Manifest manifest, RankState state);
  // The same protocol on the calling thread, for a writer with nothing in flight (the node-local
  // level's flush, from its own background thread). Collective over the writer's communicator.
  WriteReport write_here(const model::ParameterLayout& layout, Manifest manifest,
                         const RankState& state);
  // Waits for the write in flight, if any, and returns its report; a failed write throws
  // (the same error on every rank). Collective only in the sense that every rank must call it.
  std::optional<WriteReport> wait();
  // The snapshot of the last finished write, for the next one to reuse (its pages are already
  // mapped: on large models, allocating a fresh snapshot costs more than filling it). Empty
  // when there is none or a write is in flight.
  [[nodiscard]] RankState take_spare();
  // Hands the writer a snapshot buffer to give back through take_spare() (allocated when the
  // run starts, so that the first checkpoint does not pay for it).
  void provide_spare(RankState spare);
  [[nodiscard]] bool busy() const noexcept;
  // A write is in flight and has finished on this rank (wait() will not block).
  [[nodiscard]] bool ready() const noexcept;
  [[nodiscard]] const std::string& root() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

enum class PartialDirectories { remove, keep };

// Rank 0's part of pruning (also used by `ckpt prune`): removes complete checkpoints beyond the
// newest `keep_last` (never the one `latest` names) and, with `remove`, .partial and .replaced
// directories and the temporary files of `latest` (stale ones: the writer calls this with no
// write of its own in flight). Only real directories are removed: a link under a step's name is
// left alone. Returns what it removed and what it could not remove, with the reason.
struct PruneReport {
  std::vector<std::string> removed;
  std::vector<std::string> failed;  // "step-00000004: cannot remove: Permission denied"
  // Step directories not counted as checkpoints and left alone, with the reason ("step-00000009:
  // the directory is named for step 9, its manifest is of step 2 ... (left as it is)").
  std::vector<std::string> ignored;
};
// `check` (`ckpt prune`: verify_checkpoint): a checkpoint it finds damaged (returns a reason)
// never counts toward the newest `keep_last`, and is left alone, reported in `ignored`: a
// damaged newest step must not push a good one out. The checks run newest first, and stop once
// `keep_last` good ones are found.
using CheckpointCheck = std::function<std::string(const std::string& step_dir)>;
PruneReport prune_checkpoints(const std::string& root, int keep_last, PartialDirectories partial,
                              const CheckpointCheck& check = {});

}  // namespace l3::ckpt
