// The SFT and reward training loops, for the CLI and for embedding applications alike: data
// parallel over the ranks of the World it is given, a ZeRO-1 sharded AdamW, periodic
// evaluation and checkpoints, metrics, and the guard rails (non-finite steps are skipped and
// counted; too many in a row stop the run).
//
// A step: every rank takes its micro-batches of the global batch from the data loader; the
// global count of loss tokens (SFT) or pairs (reward) is agreed first, so that each rank's
// gradients are already scaled by 1 / global count and their sum over the ranks is the
// gradient of the global mean loss, whatever the number of ranks; the last micro-batch's
// backward pass overlaps the reduce-scatter of the gradients; then the global gradient norm,
// clipping, AdamW on each rank's shard, and the all-gather of the parameters.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/log.hpp"
#include "dist/world.hpp"
#include "train/metrics.hpp"
#include "train/step_source.hpp"
#include "train/train_config.hpp"

namespace l3::model {
class LlamaModel;
}

namespace l3::train {
namespace grpo {
struct GenerationLink;
}

// The public structs (include/l3/l3.hpp): what the trainer reports is what a host gets.
using CheckpointReport = l3::CheckpointInfo;
using TrainSummary = l3::RunSummary;

class Trainer {
 public:
  // Collective over `world`: resolves the model, opens the data, builds the model and the
  // optimizer. Errors are core::Error (usage, bad_input) with context.
  // `data`: the training data, when it does not come from config.data's shards
  // (config.data_from_host must then be set).
  // `stop`: a host's stop flag (set by a signal handler, maybe before the trainer exists):
  // while the trainer is built, setting it stops every rank with core's "stopped" Error (exit
  // 75); afterwards it asks to stop at the next boundary, as request_stop(). nullptr: none.
  // `link`: asynchronous GRPO's link to the generating ranks (`world` is then the training
  // ranks' group; train/grpo/generation_link.hpp); null: none.
  Trainer(const dist::World& world, const core::Logger& log, TrainConfig config,
          std::unique_ptr<StepSource> data = nullptr, const std::atomic<bool>* stop = nullptr,
          const grpo::GenerationLink* link = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  Trainer(Trainer&&) = delete;
  Trainer& operator=(Trainer&&) = delete;

  // Runs the remaining steps with periodic evaluation and checkpoints, then the final
  // evaluation (with validation data) and checkpoint (with a checkpoint directory).
  TrainSummary run();
  // One optimizer step; returns false (and does nothing) once all steps are done.
  bool step();
  // Evaluates on the validation data (nullopt without). Collective.
  std::optional<EvalMetrics> evaluate();
  // Writes a checkpoint of the current state and waits for it to be committed. Collective.
  CheckpointReport checkpoint();

  // Asks the run to checkpoint and stop at the next step boundary (all ranks agree, so one
  // rank asking is enough). Async-signal-safe: a signal handler may call it.
  void request_stop() noexcept;
  // Asks for a checkpoint at the next step boundary (the ranks agree, so one rank asking is
  // enough); without --ckpt-dir a warning says there is nowhere to write it. Async-signal-safe.
  void request_checkpoint() noexcept;
  // Polled on every rank at every step boundary: true asks to stop, as request_stop().
  void set_stop_check(std::function<bool()> check);

  // Called on every rank with the global metrics.
  void on_step(std::function<void(const StepMetrics&)> callback);
  void on_eval(std::function<void(const EvalMetrics&)> callback);
  // Called on every rank when a checkpoint has been committed (on the training thread, at the
  // step boundary where the commit is seen, or when the run waits for it).
  void on_checkpoint(std::function<void(const CheckpointReport&)> callback);

  [[nodiscard]] std::int64_t steps_done() const noexcept;
  [[nodiscard]] std::int64_t total_steps() const noexcept;
  [[nodiscard]] const TrainConfig& config() const noexcept;
  [[nodiscard]] model::LlamaModel& model() noexcept;
  // What the compute backend has allocated for this run (kernels::Ops::allocated_bytes: the
  // model, its workspace, the optimizer's state): the memory plan's measure.
  [[nodiscard]] std::int64_t backend_allocated_bytes() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace l3::train
