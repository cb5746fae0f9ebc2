// Where a training run starts: the checkpoint it resumes from (--resume), chosen once by rank 0
// and agreed by every rank, and the check that a resumed run does the same math as the run that
// wrote the checkpoint.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ckpt/manifest.hpp"

namespace l3::core {
class Logger;
}
namespace l3::dist {
class World;
}

namespace l3::ckpt {

// --resume: the newest good checkpoint under --ckpt-dir (automatic), none (a fresh run), or
// the checkpoint at `path` (a step directory, or a root whose `latest` names one).
enum class ResumeMode : std::uint8_t { automatic, none, path };
struct ResumeChoice {
  ResumeMode mode = ResumeMode::automatic;
  std::string path;  // with ResumeMode::path
};

struct ResumeRequest {
  std::string ckpt_dir;  // empty: no checkpoints, nothing to resume
  ResumeChoice choice;
  bool verify_checksums = true;  // every checksum (else the structure only)
  bool announce = true;          // log "resuming from ..." (the caller may have a newer level)
};

// The step directory to resume from, the same on every rank; empty: start fresh. Collective.
// Rank 0 decides: automatic takes the newest good checkpoint under ckpt_dir, damaged ones
// renamed aside (logged as warnings); a path must be good. Never silently starts over where an
// earlier run left checkpoints: none into a directory with checkpoints, and automatic where
// every checkpoint is damaged, are Errors (usage, bad_input: exit 2) that say what to do.
[[nodiscard]] std::string choose_resume(const dist::World& world, const core::Logger& log,
                                        const ResumeRequest& request);

// The options whose change makes a resumed run do other math (the data, the batch, the
// optimizer and its schedule, the seed, the reward loss): the manifest's config keys.
struct ResumedRun {
  Phase phase = Phase::sft;
  nlohmann::json config;  // the run's options as TrainConfig::to_json writes them
  bool allow_config_change = false;
};
// usage Error naming the options that changed (as --option now (was before)) and the way
// out, or the phase mismatch; `step_dir` names the checkpoint in the message.
void check_resume_compatible(const Manifest& manifest, const ResumedRun& run,
                             const std::string& step_dir);

}  // namespace l3::ckpt
