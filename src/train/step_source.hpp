// Where a training step's micro-batches come from: the HDF5 shards through the prefetching
// DataLoader (the CLI, and hosts with datasets on disk), or a host application's memory
// (l3::DataSource, adapted in api/host_data). The trainer sees only this interface.
#pragma once

#include <cstdint>
#include <optional>

#include "io/data/data_loader.hpp"
#include "l3/l3.hpp"
#include "train/train_config.hpp"

namespace l3::train {

// What a source needs to know to cut a step into micro-batches.
struct StepShape {
  Phase phase = Phase::sft;
  std::int64_t seq_len = 0;
  std::int64_t per_rank = 0;     // rows (SFT) or pairs (reward) of this rank per step
  std::int64_t micro_batch = 0;  // rows or pairs per micro-batch
  std::int32_t pad_id = 0;
  std::int64_t vocab_size = 0;     // token ids must be below this
  bool margins_from_data = false;  // reward: use the samples' margins (else 0)
  int rank = 0;
  int ranks = 1;
  // The step a resumed run continues from (its checkpoint's); nullopt for a fresh run.
  std::optional<std::int64_t> resumed_at;
};

class StepSource {
 public:
  virtual ~StepSource() = default;
  // Called once, before the first next(), with the position to start from (a resumed run's).
  virtual void start(const StepShape& shape, data::Position from) = 0;
  // The next step of this rank; valid until the following call.
  virtual const data::StepData& next() = 0;
  // Milliseconds the last next() waited for its data.
  [[nodiscard]] virtual double last_wait_ms() const = 0;
  // Optimizer steps in `epoch` (after start()), for runs counted in epochs; nullopt when the
  // source cannot know (then --steps is required, and TrainConfig::validate says so).
  [[nodiscard]] virtual std::optional<std::int64_t> steps_in_epoch(std::int64_t epoch) const = 0;
  // A source that evaluates the model itself (online RL: by generating on the validation
  // prompts and scoring) returns its results; nullopt: the trainer's evaluator runs on
  // --val-data. Collective.
  [[nodiscard]] virtual std::optional<EvalMetrics> evaluate() { return std::nullopt; }
  // The run's last step and evaluation are done (not called when it stops early): a source
  // ends its helpers and checks what they said last (online RL: its verifier). Collective.
  virtual void finish() {}
  // The run's step count, once it is known (after start()).
  virtual void set_total_steps(std::int64_t /*total*/) {}
  // A checkpoint of the state after `steps` optimizer steps is about to be written: what it
  // needs from the source must be on disk first (asynchronous GRPO: the batches already
  // generated for the steps after it). Collective.
  virtual void before_checkpoint(std::int64_t /*steps*/) {}
  // The run ends here (done, or stopped with `stopped`): a source with helper ranks lets them
  // go. Collective; called once, after the last step and checkpoint.
  virtual void end_run(bool /*stopped*/) {}

  StepSource() = default;
  StepSource(const StepSource&) = delete;
  StepSource& operator=(const StepSource&) = delete;
  StepSource(StepSource&&) = delete;
  StepSource& operator=(StepSource&&) = delete;
};

}  // namespace l3::train
