// When a training run stops before its last step, and when it checkpoints off its cadence: the
// requests (a signal, the host application, a stop check the host polls), the deadline (the
// Slurm end time or --deadline), and the guard against steps that teach nothing (non-finite
// losses or gradients, or no target at all). Requests on one rank are enough: the ranks agree at
// every step boundary, so they stop at the same step.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string_view>

#include "train/metrics.hpp"

namespace l3::core {
class Logger;
}
namespace l3::dist {
class World;
}

namespace l3::train {

struct StopRules {
  double deadline_unix = 0;    // checkpoint and stop before this time (0: none)
  double deadline_margin = 0;  // seconds kept in reserve before the deadline
  int max_bad_steps = 5;       // non-finite or empty steps in a row that end the run
  std::int64_t seq_len = 0;    // for the message when no step has a target
};

// The run's timing so far, for the deadline: how long a step and a checkpoint take.
struct BoundaryTiming {
  std::int64_t steps_this_run = 0;  // steps run since this process started training
  double run_seconds = 0;           // their total time
  double checkpoint_seconds = 0;    // the longest checkpoint write so far
  bool can_checkpoint = false;      // a --ckpt-dir to write to (the deadline needs one)
};

struct BoundaryDecision {
  bool stop = false;        // checkpoint (where possible) and stop now
  bool checkpoint = false;  // checkpoint now and go on
};

class StopPolicy {
 public:
  StopPolicy(const dist::World& world, const core::Logger& log, StopRules rules);

  // Async-signal-safe: a signal handler may call them.
  void request_stop() noexcept { stop_requested_.store(true); }
  void request_checkpoint() noexcept { checkpoint_requested_.store(true); }
  // Polled on every rank at every boundary: true asks to stop.
  void set_stop_check(std::function<bool()> check) { stop_check_ = std::move(check); }
  // A host's flag (set by its signal handler, maybe before the run was built), read at every
  // boundary like a request; nullptr: none.
  void set_external_stop(const std::atomic<bool>* flag) noexcept { external_stop_ = flag; }

  // What every rank does at this step boundary: stop when any rank was asked to or the
  // deadline is closer than two steps, a checkpoint and the margin; checkpoint when any rank
  // was asked for one. Collective.
  [[nodiscard]] BoundaryDecision agree(const BoundaryTiming& timing);

  // Counts a step's outcome (skipped or not), then, once it has been reported, check() ends
  // the run when max_bad_steps steps in a row were skipped: bad_input (exit 2) when the last
  // had no target (the data and --seq-len must change), internal (exit 1, training diverged)
  // otherwise.
  void count(const StepMetrics& step) noexcept {
    bad_in_a_row_ = step.skipped ? bad_in_a_row_ + 1 : 0;
  }
  void check(const StepMetrics& step) const;
  [[nodiscard]] int bad_in_a_row() const noexcept { return bad_in_a_row_; }
  [[nodiscard]] int max_bad_steps() const noexcept { return rules_.max_bad_steps; }

 private:
  const dist::World& world_;
  const core::Logger& log_;
  StopRules rules_;
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> checkpoint_requested_{false};
  std::function<bool()> stop_check_;
  const std::atomic<bool>* external_stop_ = nullptr;
  bool deadline_hit_ = false;
  int bad_in_a_row_ = 0;
};

// Before the first step (building the run: loading the model, resuming, DPO's reference): the
// ranks agree whether `flag` was set on any of them, and if so all throw core's "stopped" Error
// (exit 75, nothing to save), saying `where`. Collective; nothing when `flag` is nullptr.
void stop_if_requested(const dist::World& world, const std::atomic<bool>* flag,
                       std::string_view where);

}  // namespace l3::train
