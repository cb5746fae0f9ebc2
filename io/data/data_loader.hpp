// The training data of this rank, step after step: the epoch plan says which samples, the shard
// reader reads them, and a background thread assembles the micro-batches of the next steps into
// a ring of `depth` step buffers while the current step computes. data_wait (the time next()
// blocked) is what the training loop logs: the goal is zero.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/world.hpp"
#include "io/data/batch.hpp"
#include "io/data/dataset_index.hpp"
#include "io/data/epoch_plan.hpp"
#include "io/data/shard_reader.hpp"

namespace l3::data {

struct Position {
  std::int64_t epoch = 0;
  std::int64_t step = 0;  // within the epoch
  bool operator==(const Position&) const = default;
};

struct LoaderConfig {
  PlanConfig plan;
  int depth = 2;  // step buffers in the ring (1: no overlap)
  ReaderOptions reader;
  std::int32_t pad_id = 0;         // token of padding (<|finetune_right_pad_id|>)
  std::int64_t model_vocab = 0;    // token ids must be below this
  bool margins_from_data = false;  // reward: use the shards' margins (else 0)
  // Context parallelism: groups of this many consecutive ranks read the same samples (the plan's
  // rank is the group's) and each keeps its share of every micro-batch (data::context_share).
  int context_ranks = 1;
};

// One step of this rank: its micro-batches, in order.
struct StepData {
  Position position;  // of this step
  Position next;      // of the step after it
  std::vector<Batch> micro;
  std::int64_t samples = 0;     // samples (documents or pairs) this rank got
  double assemble_seconds = 0;  // read + pack time in the producer
  // What the source reports about the step, by name, the same on every rank (online RL: the
  // rewards, the completions' lengths; "time/NAME_ms": milliseconds of the step spent on NAME).
  std::vector<std::pair<std::string, double>> metrics;
};

class DataLoader {
 public:
  // Collective over `world` (opens the shards). Starts producing from `start`.
  DataLoader(const dist::World& world, const DatasetIndex& index, LoaderConfig config,
             Position start);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;
  DataLoader(DataLoader&&) = delete;
  DataLoader& operator=(DataLoader&&) = delete;

  // The next step; valid until the following call. Reader failures surface here.
  const StepData& next();
  // Milliseconds the last next() waited for data.
  [[nodiscard]] double last_wait_ms() const noexcept;
  // Steps of an epoch (packing makes it vary slightly from epoch to epoch for SFT).
  [[nodiscard]] std::int64_t steps_in_epoch(std::int64_t epoch) const;
  // Samples an epoch leaves out because they do not fit in a row (see EpochPlan).
  [[nodiscard]] std::int64_t skipped_in_epoch(std::int64_t epoch) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace l3::data
