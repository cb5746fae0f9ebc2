// What a training run says as it goes: each step and evaluation to metrics.jsonl (rank 0 with
// --metrics), to the log (the first and last steps, every --log-every, and every skipped step as
// a warning), to the progress bar, and to the host's callbacks (every rank).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/log.hpp"
#include "train/metrics.hpp"
#include "train/progress_bar.hpp"

namespace l3::train {

class RunReport {
 public:
  // `metrics`: null where this rank writes none; not owned.
  RunReport(const core::Logger& log, ProgressBar& progress, MetricsFile* metrics,
            std::int64_t log_every, std::int64_t total_steps)
      : log_(log),
        progress_(progress),
        metrics_(metrics),
        log_every_(log_every),
        total_steps_(total_steps) {}

  // `bad_in_a_row` of at most `max_bad`: what a skipped step's warning says.
  void step(const StepMetrics& m, int bad_in_a_row, int max_bad);
  void eval(const EvalMetrics& m);

  void on_step(std::function<void(const StepMetrics&)> callback) {
    step_callbacks_.push_back(std::move(callback));
  }
  void on_eval(std::function<void(const EvalMetrics&)> callback) {
    eval_callbacks_.push_back(std::move(callback));
  }

 private:
  const core::Logger& log_;
  ProgressBar& progress_;
  MetricsFile* metrics_;
  std::int64_t log_every_;
  std::int64_t total_steps_;
  std::vector<std::function<void(const StepMetrics&)>> step_callbacks_;
  std::vector<std::function<void(const EvalMetrics&)>> eval_callbacks_;
};

}  // namespace l3::train
