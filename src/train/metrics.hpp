// What a training run reports: per-step metrics (global over the ranks, the same on every
// rank), evaluation results, their JSONL form (metrics.jsonl) and their one-line human form.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/output_file.hpp"
#include "train/metrics_sink.hpp"
#include "train/train_config.hpp"

namespace l3::train {

// The public structs (include/l3/l3.hpp): embedding hosts get exactly what the trainer reports.
using StepMetrics = l3::StepMetrics;
using EvalMetrics = l3::EvalMetrics;

[[nodiscard]] nlohmann::json to_json(const StepMetrics& m);
[[nodiscard]] nlohmann::json to_json(const EvalMetrics& m);
// The `eval` command's object (no "kind", no step).
[[nodiscard]] nlohmann::json eval_result_json(const EvalMetrics& m);

[[nodiscard]] std::string format_step_line(const StepMetrics& m);
[[nodiscard]] std::string format_eval_line(const EvalMetrics& m);
[[nodiscard]] std::string format_duration(double seconds);  // "1h02m", "3m05s", "42s"

// metrics.jsonl, appended to (a resumed run continues the same file), one object per line,
// flushed line by line so that a crash loses nothing already reported.
class MetricsFile final : public MetricsSink {
 public:
  // `resumed_at`: the step a resumed run continues from. The records of later steps (written
  // by the interrupted run after its last checkpoint, and about to be written again) are
  // dropped first, so that the file reads like one uninterrupted run's. Only records of ours
  // are dropped (objects of kind "train" or "eval"), and a last line the crash cut short:
  // other lines, a user's notes, are kept as they are. The checkpoints recorded after that
  // step are dropped too (the run continues from an earlier one), the "run" records kept: they
  // say where the run was restarted.
  explicit MetricsFile(const std::string& path, std::optional<std::int64_t> resumed_at = {});
  void write(const nlohmann::json& record) override;
  void sync() override;

 private:
  void drop_records_after(std::int64_t step);

  std::string path_;
  std::unique_ptr<core::AppendedFile> out_;
};

}  // namespace l3::train
