// A generating rank of asynchronous GRPO (--generation-ranks; generation_link.hpp): it holds a
// whole copy of the policy (no sharding; with LoRA the frozen base once, then the adapters),
// takes the training ranks' weights after each optimizer step (received while it generates with
// the version before: version_receiver.hpp), and makes the generation
// batches they ask for with RolloutSource's own generation and scoring, so that a batch is what
// the synchronous program makes with the same weights, bit for bit. Its group (the generating
// ranks) shares a prompt set's steps as the synchronous ranks do; the first of them sends the
// batches to training rank 0.
#pragma once

#include <memory>
#include <vector>

#include "core/log.hpp"
#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "train/grpo/generation_link.hpp"
#include "train/grpo/rollout_source.hpp"
#include "train/grpo/version_receiver.hpp"
#include "train/model_assembly.hpp"
#include "train/train_config.hpp"

namespace l3::train::grpo {

class GenerationWorker {
 public:
  // Collective over `group` and with the training ranks' setup (RolloutSource::send_setup).
  // `world`: the whole job (the device this rank computes on).
  GenerationWorker(const dist::World& world, const GenerationLink& link, const dist::World& group,
                   const core::Logger& log, const TrainConfig& config);
  ~GenerationWorker();
  GenerationWorker(const GenerationWorker&) = delete;
  GenerationWorker& operator=(const GenerationWorker&) = delete;
  GenerationWorker(GenerationWorker&&) = delete;
  GenerationWorker& operator=(GenerationWorker&&) = delete;

  // Makes batches until the training ranks let it go; true when they stopped early (a signal, the
  // deadline), false when the run is done. A failure here is sent to training rank 0 first.
  bool run();

 private:
  const GenerationLink& link_;
  const dist::World& group_;
  const core::Logger& log_;
  std::unique_ptr<kernels::Ops> ops_;
  AssembledModel model_;
  std::unique_ptr<RolloutSource> source_;
  std::unique_ptr<VersionReceiver> receiver_;  // last: its thread stops first
};

// Training rank 0 when the run cannot start: the generating ranks, waiting for their setup, end
// with `message` (exit_code: core's). Not collective.
void send_setup_failure(const GenerationLink& link, int exit_code, const std::string& message);

}  // namespace l3::train::grpo
