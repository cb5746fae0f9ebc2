// The one place a model is put together, for every purpose: training (trainer_parts.cpp),
// evaluation (`eval`), scoring (`score`) and generation (`generate`). The recipe says what the
// model is for and where its weights live (model/placement.hpp); the assembly builds the
// LlamaModel with the buffers that placement gives it and, for a frozen model, loads the
// weights: whole (rank 0 reads, every rank of the world holds them) or sharded over the ranks
// (parallel::ShardedWeights: each rank reads its share, and the model reads them through its
// parameter window), with a PEFT adapter folded in. Trained weights are the optimizer's to load
// (parallel::DataParallel); attach_parallel gives the model its windows onto it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/peft_adapter.hpp"
#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "model/llama_model.hpp"
#include "model/placement.hpp"
#include "parallel/sharded_weights.hpp"
#include "train/model_source.hpp"

namespace l3::parallel {
class DataParallel;
}  // namespace l3::parallel

namespace l3::train {

enum class ModelPurpose { train, evaluate, score, generate };

struct ModelRecipe {
  ModelPurpose purpose = ModelPurpose::evaluate;
  model::HeadKind head = model::HeadKind::language_model;
  // train: parallel::choose_placement's; the others: model::Placement::frozen (whole or sharded).
  model::Placement placement = model::Placement::frozen(false, 1);
  bool recompute = false;
  model::LoraConfig lora{};  // train: the adapters the model trains over its frozen weights
  std::string adapter;       // evaluate, score, generate: a PEFT adapter folded into the weights
  std::uint64_t seed = 0;    // the random weights a source without weights starts from
  // train with --tensor-parallel: this rank's slice of the model (its weights come from the
  // caller, through parallel::TensorStateMap).
  model::TensorSlice tensor{};
};

struct AssembledModel {
  // The frozen weights sharded over the ranks (declared first: the model reads them); null when
  // the model holds its weights, or the optimizer holds them (ZeRO-3).
  std::unique_ptr<parallel::ShardedWeights> frozen;
  std::unique_ptr<model::LlamaModel> model;
};

// The model of `config` for `recipe` on `ops`, without weights yet (nothing collective).
// internal Error for a recipe whose placement does not fit its purpose.
[[nodiscard]] AssembledModel build_model(kernels::Ops& ops, const model::ModelConfig& config,
                                         const ModelRecipe& recipe);

// The frozen weights of `source` into `assembled` (a forward-only model, or a LoRA model's
// frozen base): sharded over `world` when the placement shards them, else whole on every rank
// of `world` (rank 0 reads, initialize_model), or with `world` null on this process alone.
// Returns the whole fp32 weights loaded (empty when sharded), before any adapter is folded in.
// Collective over `world`.
std::vector<float> load_frozen_weights(const dist::World* world, kernels::Ops& ops,
                                       const ModelSource& source, const ModelRecipe& recipe,
                                       AssembledModel& assembled);

// build_model then load_frozen_weights: a forward-only model ready to run. Collective.
[[nodiscard]] AssembledModel assemble_model(const dist::World* world, kernels::Ops& ops,
                                            const ModelSource& source, const ModelRecipe& recipe);

// Training: the model reads its weights (ZeRO-3) and writes its gradients (ZeRO-2) through the
// windows of `parallel` where the placement shards them.
void attach_parallel(model::LlamaModel& model, parallel::DataParallel& parallel);

// The PEFT adapter `directory` for a model of `layout`, read and checked on every rank of
// `world` (collective: a bad adapter is the same error everywhere); nothing when `directory` is
// empty. What each rank folds into its share of sharded weights.
[[nodiscard]] std::optional<ckpt::PeftAdapter> load_adapter_on_every_rank(
    const dist::World& world, const std::string& directory, const model::ParameterLayout& layout);

}  // namespace l3::train
