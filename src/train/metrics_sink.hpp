// Where a run's records go (rank 0): metrics.jsonl (`MetricsFile`, --metrics) and TensorBoard's
// event files (`tensorboard::TensorBoardWriter`, --tensorboard). Every phase reports through
// the same records (metrics.hpp's to_json), so a sink added here serves every objective.
#pragma once

#include <nlohmann/json.hpp>

namespace l3::train {

class MetricsSink {
 public:
  MetricsSink() = default;
  virtual ~MetricsSink() = default;
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;
  MetricsSink(MetricsSink&&) = delete;
  MetricsSink& operator=(MetricsSink&&) = delete;

  // One record, as metrics.jsonl holds it: an object whose "kind" is "train", "eval", "run" (a
  // run starts or restarts) or "checkpoint" (one committed). Handed to the operating system at
  // once, so that a killed run leaves every record written before it.
  virtual void write(const nlohmann::json& record) = 0;
  // Everything written so far on stable storage. Called before a checkpoint is written, so
  // that every step up to the one a later run resumes from survives a lost node as well.
  virtual void sync() = 0;
};

}  // namespace l3::train
