#include "train/stop_policy.hpp"

#include <fmt/format.h>

#include <chrono>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/words.hpp"
#include "dist/collectives.hpp"
#include "dist/world.hpp"

namespace l3::train {

namespace {
constexpr int kStopNow = 1;
constexpr int kCheckpointNow = 2;
}  // namespace

StopPolicy::StopPolicy(const dist::World& world, const core::Logger& log, StopRules rules)
    : world_(world), log_(log), rules_(rules) {}

BoundaryDecision StopPolicy::agree(const BoundaryTiming& timing) {
  int local = stop_requested_.load() ? kStopNow : 0;
  if (checkpoint_requested_.exchange(false)) local |= kCheckpointNow;
  if (stop_check_ && stop_check_()) local |= kStopNow;
  if (external_stop_ != nullptr && external_stop_->load()) local |= kStopNow;
  if (rules_.deadline_unix > 0 && timing.can_checkpoint && timing.steps_this_run > 0) {
    const double step_seconds = timing.run_seconds / static_cast<double>(timing.steps_this_run);
    const double needed =
        2.0 * step_seconds + 1.5 * timing.checkpoint_seconds + rules_.deadline_margin;
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (now + needed >= rules_.deadline_unix) {
      if (!deadline_hit_) {
        log_.warn(
            "the deadline is {:.0f} s away, less than the {:.0f} s a step, a checkpoint and "
            "the margin need: checkpointing and stopping",
            rules_.deadline_unix - now, needed);
      }
      deadline_hit_ = true;
      local |= kStopNow;
    }
  }
  local =
      dist::all_reduce(world_.comm(), local, dist::ReduceOp::bitwise_or, "step boundary agreement");
  return {.stop = (local & kStopNow) != 0, .checkpoint = (local & kCheckpointNow) != 0};
}

void stop_if_requested(const dist::World& world, const std::atomic<bool>* flag,
                       std::string_view where) {
  if (flag == nullptr) return;
  const int stop = dist::all_reduce(world.comm(), flag->load() ? 1 : 0, dist::ReduceOp::max,
                                    "stop before the first step");
  if (stop != 0) {
    throw core::stopped_before_start(
        fmt::format("stopped on request {}, before the first step: nothing to save", where));
  }
}

void StopPolicy::check(const StepMetrics& step) const {
  if (bad_in_a_row_ < rules_.max_bad_steps) return;
  // Language modelling counts target tokens, preference objectives pairs: a step with neither
  // had nothing to learn from.
  if (step.loss_tokens == 0 && step.pairs == 0) {
    // Not a divergence: nothing to learn from (every answer cut off by --seq-len, or no pair
    // fits), which no --lr fixes. The data and options are what must change: exit 2.
    throw core::bad_input(fmt::format(
        "{} in a row had no {} (last: step {}): the samples are cut to --seq-len {} before "
        "their {}; raise --seq-len, or leave long samples out with --drop-long",
        core::count_of(bad_in_a_row_, "step"), "target tokens or preference pairs", step.step,
        rules_.seq_len, "answers or ends"));
  }
  throw core::internal_error(
      fmt::format("training diverged: {} in a row had a non-finite loss or gradient norm (last: "
                  "step {}, loss {}, grad norm {}); lower --lr, raise --warmup or check the data",
                  core::count_of(bad_in_a_row_, "step"), step.step, step.loss, step.grad_norm));
}

}  // namespace l3::train
