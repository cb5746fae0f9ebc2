#include "train/resume_point.hpp"

#include <fmt/format.h>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/resume.hpp"
#include "core/error.hpp"

namespace l3::train {

namespace {

// The node-local level's share of the choice (see choose_resume_point); `global`: the step of
// --ckpt-dir's checkpoint (-1: none) at `checkpoint_dir`. Collective.
std::optional<ckpt::LocalResume> resume_local_level(const dist::World& world,
                                                    const core::Logger& log, const TrainConfig& c,
                                                    const LocalLevel& level,
                                                    const std::string& checkpoint_dir,
                                                    std::int64_t global) {
  switch (c.resume.mode) {
    case ckpt::ResumeMode::automatic: {
      std::optional<ckpt::LocalResume> r = ckpt::resume_from_local_level(
          world, log, level.directory, global, c.verify_resume, level.run_key);
      ckpt::discard_local_steps_after(world, level.directory, r ? r->step : global);
      if (r) {
        log.info("resuming from the node-local level at step {}{}: {}", r->step,
                 global >= 0 ? fmt::format(" (--ckpt-dir's newest is step {})", global) : "",
                 r->description);
      } else if (!checkpoint_dir.empty()) {
        log.info("resuming from {}", checkpoint_dir);
      }
      return r;
    }
    case ckpt::ResumeMode::none:
      if (ckpt::local_level_has_steps(world, level.directory)) {
        throw core::usage_error(fmt::format(
            "--resume none: the node-local level (--ckpt-local {}) holds checkpoints of an "
            "earlier run into {}; a new run would mix its checkpoints with them: choose another "
            "--ckpt-dir, remove them, or resume (--resume auto)",
            c.ckpt_local, c.ckpt_dir));
      }
      return std::nullopt;
    case ckpt::ResumeMode::path:
      ckpt::discard_local_steps_after(world, level.directory, -1);
      log.info("resuming from {}", checkpoint_dir);
      return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

void ResumePoint::fall_back_to_checkpoint() {
  if (checkpoint_dir.empty()) {
    throw core::usage_error(
        fmt::format("the node-local level's states ({}) were written with another partition of the "
                    "optimizer state (other sharding or --bucket-mb), and --ckpt-dir holds no "
                    "checkpoint: resume with the options of the run that wrote them",
                    local_origin));
  }
  local.reset();
  local_origin.clear();
  level = Level::checkpoint;
}

ResumePoint choose_resume_point(const dist::World& world, const core::Logger& log,
                                const TrainConfig& c, const std::optional<LocalLevel>& level) {
  ResumePoint r;
  r.checkpoint_dir = ckpt::choose_resume(world, log,
                                         {.ckpt_dir = c.ckpt_dir,
                                          .choice = c.resume,
                                          .verify_checksums = c.verify_resume,
                                          .announce = !level});
  if (!r.checkpoint_dir.empty()) {
    r.checkpoint_manifest = ckpt::read_manifest(r.checkpoint_dir);
    r.level = ResumePoint::Level::checkpoint;
  }
  if (level) {
    r.local = resume_local_level(world, log, c, *level, r.checkpoint_dir, r.checkpoint_step());
  }
  if (r.local) {
    r.level = ResumePoint::Level::node_local;
    r.local_origin =
        fmt::format("{}/{} (node-local)", level->directory, ckpt::step_dir_name(r.local->step));
  }
  return r;
}

}  // namespace l3::train
