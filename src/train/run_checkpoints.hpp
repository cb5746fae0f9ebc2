// A training run's checkpoints: the writer (in the background unless --checkpoint-sync) fed
// with host snapshots of this rank's share of the master weights and AdamW moments, what was
// committed last (for the summary, the host's callbacks and the stop logic), and the restore
// of that share from a checkpoint written by any number of ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint_writer.hpp"
#include "ckpt/local_checkpoint_writer.hpp"
#include "ckpt/local_files.hpp"
#include "ckpt/manifest.hpp"
#include "io/data/data_loader.hpp"
#include "l3/l3.hpp"

namespace l3::core {
class Logger;
}

namespace l3::parallel {
class DataParallel;
class TensorStateMap;
}  // namespace l3::parallel

namespace l3::train {

class ProgressBar;
using CheckpointReport = l3::CheckpointInfo;

struct TrainConfig;

// The node-local level of a run (--ckpt-local): this rank's directory of it, its node, and how
// the level survives a lost node.
struct LocalLevel {
  std::string directory;
  std::string node;
  ckpt::RedundancyPlan plan;
  std::int64_t every = 0;        // steps between node-local checkpoints
  std::int64_t flush_every = 0;  // every this many of them also to --ckpt-dir (0: never)
  std::string run_key;           // the run's (train/run_identity.hpp), in every file it writes
};
// Collective. Nothing without --ckpt-local. Creates this rank's directory; a rank that cannot
// write it fails every rank (bad_input naming --ckpt-local and the directory). Logs the plan,
// and warns when the redundancy asked for cannot be had (a single node).
[[nodiscard]] std::optional<LocalLevel> plan_local_level(const dist::World& world,
                                                         const core::Logger& log,
                                                         const TrainConfig& config,
                                                         const std::string& run_key);

class RunCheckpoints {
 public:
  // Without a directory (`ckpt_dir` empty) nothing is written: enabled() is false. Collective.
  // The snapshot buffer (this rank's share of the weights and both moments: 12 bytes per
  // parameter / ranks) is allocated and touched now instead of in the first checkpoint's
  // pause, and reused by every checkpoint.
  // With `local`, node-local checkpoints too (start_local), with their own snapshot buffer.
  RunCheckpoints(const dist::World& world, const core::Logger& log, ProgressBar& progress,
                 const std::string& ckpt_dir, ckpt::WriterPolicy policy,
                 const parallel::DataParallel& parallel,
                 std::optional<LocalLevel> local = std::nullopt,
                 const parallel::TensorStateMap* tensor = nullptr);
  ~RunCheckpoints();
  RunCheckpoints(const RunCheckpoints&) = delete;
  RunCheckpoints& operator=(const RunCheckpoints&) = delete;
  RunCheckpoints(RunCheckpoints&&) = delete;
  RunCheckpoints& operator=(RunCheckpoints&&) = delete;

  [[nodiscard]] bool enabled() const noexcept { return writer_ != nullptr; }

  // Starts a checkpoint of the state now, described by `run` (the previous one is finished
  // first). usage Error when not enabled.
  void start(const ckpt::RunFacts& run, parallel::DataParallel& parallel,
             const model::ParameterLayout& layout);
  // Starts a node-local checkpoint of the state now (every rank its own state ranges), flushed
  // to --ckpt-dir as well when it is the flush_every-th; the previous checkpoint is finished
  // first. Without a local level: nothing.
  void start_local(const ckpt::RunFacts& run, parallel::DataParallel& parallel,
                   const model::ParameterLayout& layout, bool allow_flush = true);
  [[nodiscard]] std::int64_t local_every() const noexcept { return local_ ? local_->every : 0; }
  // Waits for the checkpoints in flight, if any, and reports them (log, callbacks).
  void finish();
  // finish() when the checkpoint in flight is done, without waiting.
  void finish_if_ready();
  // Whether a checkpoint of `step` is committed or being written in --ckpt-dir.
  [[nodiscard]] bool has(std::int64_t step) const noexcept {
    return last_step_ == step || pending_step_ == step;
  }

  // The run resumed from `step_dir` at `step`: it counts as the last checkpoint.
  void resumed_from(const std::string& step_dir, std::int64_t step);
  // The run resumed from the node-local level at `step`.
  void resumed_from_local(std::int64_t step);
  [[nodiscard]] const std::string& last_directory() const noexcept { return last_directory_; }
  [[nodiscard]] std::int64_t last_step() const noexcept { return last_step_; }
  // The last report given to the callbacks (empty before the first commit).
  [[nodiscard]] const CheckpointReport& last_report() const noexcept { return last_report_; }
  // The longest write so far, from snapshot to commit (for the deadline).
  [[nodiscard]] double longest_seconds() const noexcept { return longest_seconds_; }

  void on_commit(std::function<void(const CheckpointReport&)> callback) {
    callbacks_.push_back(std::move(callback));
  }
  // A node-local checkpoint complete on every node (`directory`: this rank's of the level).
  void on_local_commit(std::function<void(const CheckpointReport&)> callback) {
    local_callbacks_.push_back(std::move(callback));
  }

 private:
  void finish_global();
  void finish_local();
  void committed(const ckpt::WriteReport& report, std::int64_t step, double paused);

  const core::Logger& log_;
  ProgressBar& progress_;
  std::unique_ptr<ckpt::CheckpointWriter> writer_;
  // Tensor parallelism: what a rank's state is in the whole layout (checkpoints store that).
  const parallel::TensorStateMap* tensor_ = nullptr;
  std::optional<LocalLevel> local_;
  std::unique_ptr<ckpt::LocalCheckpointWriter> local_writer_;
  std::int64_t pending_local_step_ = -1;
  double local_snapshot_seconds_ = 0;
  std::int64_t pending_step_ = -1;
  double snapshot_seconds_ = 0;
  double longest_seconds_ = 0;
  std::string last_directory_;
  std::int64_t last_step_ = -1;
  CheckpointReport last_report_;
  std::vector<std::function<void(const CheckpointReport&)>> callbacks_;
  std::vector<std::function<void(const CheckpointReport&)>> local_callbacks_;
};

// What a resumed run continues from.
struct ResumedState {
  std::int64_t step = 0;
  data::Position position{0, 0};
  std::int64_t skipped_steps = 0;
  std::int64_t trained_tokens = 0;
  double trained_seconds = 0;
  // The state was evaluated before it was saved (its last evaluation is of its step): a run
  // resumed from it with no step left to do does not evaluate, and report, the same again.
  bool evaluated = false;
  std::string run_id;  // the run's identity (ckpt::Manifest::run_id); "" from earlier versions
};

// Loads this rank's share of the optimizer state of `step_dir` into `parallel` (the pieces it
// owns now, whatever the ranks that wrote it), the AdamW count, and the weights the model
// computes with. Collective: a rank failing to read fails every rank.
[[nodiscard]] ResumedState restore_checkpoint(const dist::World& world, const core::Logger& log,
                                              const std::string& step_dir,
                                              const ckpt::Manifest& manifest,
                                              parallel::DataParallel& parallel,
                                              const model::ParameterLayout& layout,
                                              const parallel::TensorStateMap* tensor = nullptr);
// The same from this rank's state of the node-local level (read by ckpt::resume_from_local_level):
// its ranges must be this rank's state ranges now; false on every rank when they are not on
// some rank (another partition of the optimizer state: --bucket-mb changed), nothing loaded.
[[nodiscard]] std::optional<ResumedState> restore_local_state(const dist::World& world,
                                                              const core::Logger& log,
                                                              const ckpt::LocalState& local,
                                                              const std::string& origin,
                                                              parallel::DataParallel& parallel);

}  // namespace l3::train
