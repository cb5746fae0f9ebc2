#include "train/run_report.hpp"

#include <fmt/format.h>

#include "core/build_info.hpp"
#include "core/deadline.hpp"
#include "core/path_safety.hpp"

namespace l3::train {

void RunReport::record(const nlohmann::json& record) {
  for (MetricsSink* sink : sinks_) sink->write(record);
}

void RunReport::run_started(nlohmann::json record) {
  if (sinks_.empty()) return;
  record["kind"] = "run";
  record["time"] = core::unix_now();
  record["host"] = core::host_name();
  record["version"] = core::build_info().version;
  this->record(record);
}

void RunReport::checkpoint_committed(const CheckpointInfo& checkpoint, const std::string& level) {
  record({{"kind", "checkpoint"},
          {"step", checkpoint.step},
          {"level", level},
          {"directory", checkpoint.directory},
          {"bytes", checkpoint.bytes},
          {"seconds", checkpoint.seconds},
          {"time", core::unix_now()}});
}

void RunReport::sync() {
  for (MetricsSink* sink : sinks_) sink->sync();
}

void RunReport::step(const StepMetrics& m, int bad_in_a_row, int max_bad) {
  record(to_json(m));
  const bool log_now = m.skipped || m.step == 1 || m.step == total_steps_ ||
                       (log_every_ > 0 && m.step % log_every_ == 0);
  if (log_now) {
    progress_.clear();
    if (m.skipped) {
      log_.warn("{} ({} in a row, at most {})", format_step_line(m), bad_in_a_row, max_bad);
    } else {
      log_.info("{}", format_step_line(m));
    }
  }
  progress_.update(m.step, total_steps_,
                   fmt::format("loss {:.4f} | eta {}", m.loss, format_duration(m.eta_seconds)));
  for (const auto& callback : step_callbacks_) callback(m);
}

void RunReport::eval(const EvalMetrics& m) {
  record(to_json(m));
  progress_.clear();
  log_.info("{}", format_eval_line(m));
  for (const auto& callback : eval_callbacks_) callback(m);
}

}  // namespace l3::train
