// What a training run says as it goes: each step and evaluation to the metrics sinks (rank 0:
// metrics.jsonl with --metrics, TensorBoard's files with --tensorboard), to the log (the first
// and last steps, every --log-every, and every skipped step as a warning), to the progress bar,
// and to the host's callbacks (every rank). The sinks also get a "run" record when the run
// starts (or restarts) and a "checkpoint" record for each checkpoint committed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "train/metrics.hpp"
#include "train/progress_bar.hpp"

namespace l3::train {

class RunReport {
 public:
  // `sinks`: none where this rank writes none; not owned.
  RunReport(const core::Logger& log, ProgressBar& progress, std::vector<MetricsSink*> sinks,
            std::int64_t log_every, std::int64_t total_steps)
      : log_(log),
        progress_(progress),
        sinks_(std::move(sinks)),
        log_every_(log_every),
        total_steps_(total_steps) {}

  // `bad_in_a_row` of at most `max_bad`: what a skipped step's warning says.
  void step(const StepMetrics& m, int bad_in_a_row, int max_bad);
  void eval(const EvalMetrics& m);
  // The "run" record (kind, time and host are added here).
  void run_started(nlohmann::json record);
  // A checkpoint committed: `level` "global" (--ckpt-dir) or "node-local".
  void checkpoint_committed(const CheckpointInfo& checkpoint, const std::string& level);
  // Every record so far on stable storage: before a checkpoint is written.
  void sync();

  void on_step(std::function<void(const StepMetrics&)> callback) {
    step_callbacks_.push_back(std::move(callback));
  }
  void on_eval(std::function<void(const EvalMetrics&)> callback) {
    eval_callbacks_.push_back(std::move(callback));
  }

 private:
  const core::Logger& log_;
  ProgressBar& progress_;
  void record(const nlohmann::json& record);

  std::vector<MetricsSink*> sinks_;
  std::int64_t log_every_;
  std::int64_t total_steps_;
  std::vector<std::function<void(const StepMetrics&)>> step_callbacks_;
  std::vector<std::function<void(const EvalMetrics&)>> eval_callbacks_;
};

}  // namespace l3::train
