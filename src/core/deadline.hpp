// When a job must be done by: `--deadline` (seconds from now, or an ISO-8601 time) or Slurm's
// SLURM_JOB_END_TIME (Unix seconds, set in the job's environment since Slurm 21.08).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace l3::core {

// "3600" or "3600.5": now + seconds. "2026-11-30T12:00:00Z", "2026-11-30T12:00Z",
// "2026-11-30T14:00:00+02:00", "2026-11-30 12:00:00" (no zone: UTC). Returns Unix seconds;
// usage Error for anything else.
[[nodiscard]] double parse_deadline(std::string_view text, double now_unix);

// SLURM_JOB_END_TIME: the time when set and valid (a positive integer); when set to anything
// else, no time and a warning to log (the job still runs, without the deadline; it may be
// killed at the time limit instead of checkpointing before it). `value` is the variable's text
// (the caller reads the environment).
struct SlurmEndTime {
  std::optional<double> time;
  std::string problem;  // "" when unset or valid
};
[[nodiscard]] SlurmEndTime slurm_end_time(const char* value);

[[nodiscard]] double unix_now();

}  // namespace l3::core
