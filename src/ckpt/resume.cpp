#include "ckpt/resume.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <vector>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checkpoint_reader.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dist/collectives.hpp"
#include "dist/world.hpp"

namespace l3::ckpt {

namespace {

struct Decision {
  std::string chosen;
  std::vector<std::string> rejected;  // damaged, set aside
};

// Rank 0's decision; Errors for what must stop the run.
Decision decide(const ResumeRequest& request) {
  Decision d;
  const std::string& root = request.ckpt_dir;
  const std::vector<std::string> earlier = step_directories(root);
  switch (request.choice.mode) {
    case ResumeMode::none:
      if (!earlier.empty()) {
        throw core::usage_error(fmt::format(
            "--resume none: {} holds checkpoints of an earlier run (newest {}); a new run "
            "would mix its checkpoints with them: choose another --ckpt-dir, remove them, "
            "or resume (--resume auto)",
            root, earlier.front()));
      }
      return d;
    case ResumeMode::automatic: {
      const std::vector<std::string> damaged = damaged_directories(root);
      if (earlier.empty() && !damaged.empty()) {
        throw core::bad_input(
            fmt::format("no good checkpoint to resume from, only damaged ones set aside "
                        "(newest {}; see why-damaged.txt in it). Resume from one of your "
                        "choice with --resume PATH, or start over with --resume none",
                        damaged.front()),
            {.file = root});
      }
      if (earlier.empty()) return d;
      const ResumePick pick = pick_resume_checkpoint(root, request.verify_checksums);
      d.chosen = pick.step_dir;
      d.rejected = pick.rejected;
      if (d.chosen.empty()) {
        std::string why;
        for (const std::string& r : pick.rejected) why += "; " + r;
        throw core::bad_input(fmt::format("no good checkpoint to resume from: every one is "
                                          "damaged and now set aside as "
                                          "step-N.damaged{}. Resume from one of your choice "
                                          "with --resume PATH, or start "
                                          "over with --resume none",
                                          why),
                              {.file = root});
      }
      return d;
    }
    case ResumeMode::path: {
      d.chosen = resolve_checkpoint(request.choice.path);
      const Verification v = verify_checkpoint(d.chosen, request.verify_checksums);
      if (!v.ok) {
        throw core::bad_input(fmt::format("cannot resume from it: {}", v.problem),
                              {.file = d.chosen});
      }
      return d;
    }
  }
  return d;
}

}  // namespace

std::string choose_resume(const dist::World& world, const core::Logger& log,
                          const ResumeRequest& request) {
  if (request.ckpt_dir.empty()) return {};
  Decision d;
  std::string failure;
  if (world.is_root()) {
    try {
      d = decide(request);
    } catch (...) {
      failure = core::summarize(std::current_exception()).text;
    }
  }
  failure = dist::broadcast_string(world.comm(), failure);
  if (!failure.empty()) throw core::bad_input(failure);
  const std::string chosen = dist::broadcast_string(world.comm(), d.chosen);
  for (const std::string& r : d.rejected) log.warn("checkpoint {} is damaged, set aside", r);
  if (!chosen.empty() && request.announce) log.info("resuming from {}", chosen);
  return chosen;
}

void check_resume_compatible(const Manifest& manifest, const ResumedRun& run,
                             const std::string& step_dir) {
  if (manifest.phase != run.phase) {
    throw core::usage_error(fmt::format("{} is a {} checkpoint; this is a {} run", step_dir,
                                        core::phase_name(manifest.phase),
                                        core::phase_name(run.phase)));
  }
  if (run.allow_config_change) return;
  std::string changed;
  for (const char* key : {"data",
                          "seq_len",
                          "global_batch",
                          "drop_long",
                          "lr",
                          "min_lr",
                          "warmup",
                          "beta1",
                          "beta2",
                          "eps",
                          "weight_decay",
                          "grad_clip",
                          "seed",
                          "margin_from_data",
                          "center_rewards",
                          "epochs",
                          "lora_alpha",
                          "lora_rslora",
                          "lora_dropout",
                          "beta",
                          "label_smoothing",
                          "loss"}) {
    if (manifest.config.contains(key) && manifest.config[key] != run.config[key]) {
      // The config keys are the option names with '_' for '-'.
      std::string option = std::string(key) == "eps" ? "adam-eps" : key;
      std::ranges::replace(option, '_', '-');
      changed += fmt::format("{}--{} {} (was {})", changed.empty() ? "" : ", ", option,
                             run.config[key].dump(), manifest.config[key].dump());
    }
  }
  if (!changed.empty()) {
    throw core::usage_error(
        fmt::format("resuming {} with options that change the training: {}; restore them, or pass "
                    "--allow-config-change, or start over in a new --ckpt-dir",
                    step_dir, changed));
  }
}

}  // namespace l3::ckpt
