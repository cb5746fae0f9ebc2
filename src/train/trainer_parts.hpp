// The parts of a training run and the one function that assembles them from a TrainConfig:
// the backend, the model (fresh, from --init, or resumed), the data, the data-parallel
// optimizer, the checkpoints, the schedule and the outputs. The Trainer (trainer.cpp) is the
// step loop over these parts.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "core/log.hpp"
#include "dist/world.hpp"
#include "io/data/dataset_index.hpp"
#include "kernels/ops.hpp"
#include "model/llama_model.hpp"
#include "model/placement.hpp"
#include "parallel/context_group.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/sharded_weights.hpp"
#include "parallel/tensor_group.hpp"
#include "parallel/tensor_state.hpp"
#include "train/dpo_reference.hpp"
#include "train/evaluator.hpp"
#include "train/grpo/generation_link.hpp"
#include "train/lr_schedule.hpp"
#include "train/metrics.hpp"
#include "train/model_assembly.hpp"
#include "train/model_source.hpp"
#include "train/objectives/objective.hpp"
#include "train/progress_bar.hpp"
#include "train/run_checkpoints.hpp"
#include "train/step_source.hpp"
#include "train/tensorboard/tensorboard_writer.hpp"
#include "train/train_config.hpp"

namespace l3::train {

// Declared in the order they depend on each other (and are destroyed in reverse): the data
// source reads `index`, the model and the optimizer compute on `ops`, the checkpoints report
// through `progress`.
struct TrainerParts {
  TrainConfig config;
  std::unique_ptr<kernels::Ops> ops;
  model::Placement placement;  // where the weights, gradients and optimizer state live
  // --context-parallel C > 1: this rank's group, whose exchanges the model's attention calls.
  std::unique_ptr<parallel::ContextGroup> context;
  // --tensor-parallel T > 1: this rank's tensor group (the model's exchanges), the ranks of its
  // tensor rank (what data parallelism, the context groups, the data and the step's sums run
  // over: data_world()), and where its state lies in the whole model (what checkpoints and
  // initial weights are read and written as).
  std::unique_ptr<parallel::TensorGroup> tensor;
  std::optional<dist::World> tensor_rank_world;
  std::unique_ptr<parallel::TensorStateMap> tensor_map;
  [[nodiscard]] const dist::World& data_world(const dist::World& world) const noexcept {
    return tensor_rank_world ? *tensor_rank_world : world;
  }
  ModelSource source;
  data::DatasetIndex index;      // the training shards (empty when the host gives the data)
  data::DatasetIndex val_index;  // empty without --val-data
  // LoRA with --shard-parameters: this rank's share of the frozen model, read through its window
  // by the model (declared first: the model holds the window).
  std::unique_ptr<parallel::ShardedWeights> frozen;
  std::unique_ptr<model::LlamaModel> model;
  // GRPO with --beta > 0 and full fine-tuning: the frozen initial model, the reference of the KL
  // (declared before the data source, which reads it); empty otherwise.
  AssembledModel grpo_reference;
  std::unique_ptr<Objective> objective;  // what the model is trained for (train/objectives/)
  std::unique_ptr<StepSource> data;
  std::unique_ptr<parallel::DataParallel> parallel;
  std::unique_ptr<ProgressBar> progress;
  std::unique_ptr<RunCheckpoints> checkpoints;
  std::unique_ptr<MetricsFile> metrics;                         // rank 0 with --metrics only
  std::unique_ptr<tensorboard::TensorBoardWriter> tensorboard;  // rank 0 with --tensorboard only
  LrSchedule schedule;
  double peak_tflops = 0;  // per rank, for MFU; 0: unknown
  std::int64_t total_steps = 0;
  std::optional<ResumedState> resumed;  // where a resumed run continues
  std::string resumed_from;             // the checkpoint directory or node-local level it left
  // Resumed from the node-local level with states from other nodes: write the level again now.
  bool reprotect_local = false;
  // LoRA: the frozen model the adapters train on (the --init it was read from) and its digest
  // (base_digest), recorded in every checkpoint and checked on resume.
  std::string lora_base;
  std::string lora_base_xxh64;
  // DPO with full fine-tuning: the reference model's log-probabilities of the training and the
  // validation pairs (empty with LoRA: the base model is the reference); what checkpoints record
  // of the reference (both kinds).
  ReferenceTable reference;
  ReferenceTable val_reference;
  nlohmann::json reference_record = nlohmann::json::object();
  std::string run_key;                         // train/run_identity.hpp
  std::string run_id;                          // new_run_id(), or the resumed checkpoint's
  const std::atomic<bool>* stop = nullptr;     // the host's stop flag (assemble_trainer)
  const grpo::GenerationLink* link = nullptr;  // asynchronous GRPO's generating ranks
};

// How a run evaluates its --val-data: the batches the DPO reference's validation table is
// computed over are those the evaluations read (its table itself is the caller's to add).
[[nodiscard]] EvalConfig validation_config(const TrainConfig& config);

// Collective over `world`: checks the options and the outputs, chooses the checkpoint to
// resume from, resolves the model, opens the data, refuses a run that cannot fit in memory,
// builds the model and the optimizer, initialises or restores the weights, starts the data
// source at its position, and counts the steps. `data`: the training data when it does not
// come from config.data's shards (config.data_from_host must then be set). Errors are
// core::Error (usage, bad_input) with context. `stop`: a host's stop flag (a signal handler's),
// agreed between the phases of the assembly and during DPO's reference precompute: once set on
// any rank, every rank stops with core's "stopped" Error (exit 75); nullptr: none.
[[nodiscard]] std::unique_ptr<TrainerParts> assemble_trainer(
    const dist::World& world, const core::Logger& log, TrainConfig config,
    std::unique_ptr<StepSource> data, const std::atomic<bool>* stop = nullptr,
    const grpo::GenerationLink* link = nullptr);

}  // namespace l3::train
