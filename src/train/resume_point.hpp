// Where a training run continues from, chosen once before anything is built: a value the
// assembler reads (trainer_parts.cpp) instead of decisions spread through it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/local_restore.hpp"
#include "ckpt/manifest.hpp"
#include "core/log.hpp"
#include "dist/world.hpp"
#include "train/run_checkpoints.hpp"
#include "train/train_config.hpp"

namespace l3::train {

struct ResumePoint {
  enum class Level { fresh, checkpoint, node_local };
  Level level = Level::fresh;
  // --ckpt-dir's checkpoint chosen (empty: none) and its manifest, read once; the fallback when
  // the node-local level's states do not fit this run's partition of the optimizer state.
  std::string checkpoint_dir;
  std::optional<ckpt::Manifest> checkpoint_manifest;
  // The node-local level's step every rank can be restored from (level node_local).
  std::optional<ckpt::LocalResume> local;
  std::string local_origin;  // "DIR/step_N (node-local)", for logs and messages

  [[nodiscard]] bool resuming() const noexcept { return level != Level::fresh; }
  // The step --ckpt-dir's checkpoint holds; -1: none.
  [[nodiscard]] std::int64_t checkpoint_step() const noexcept {
    return checkpoint_manifest ? checkpoint_manifest->step : -1;
  }
  // The node-local states turned out unusable (another partition): --ckpt-dir's checkpoint
  // instead (usage Error when there is none).
  void fall_back_to_checkpoint();
};

// Collective over `world`. --resume auto takes the newest of --ckpt-dir's newest good
// checkpoint and the node-local level's newest step every rank can be restored from (`level`,
// when the run has one); steps of the level after the one resumed are discarded (a crashed
// run's), as are all of them when resuming from a path. --resume none refuses to start over
// where an earlier run left checkpoints, of either level. Logs where the run resumes from.
[[nodiscard]] ResumePoint choose_resume_point(const dist::World& world, const core::Logger& log,
                                              const TrainConfig& config,
                                              const std::optional<LocalLevel>& level);

}  // namespace l3::train
