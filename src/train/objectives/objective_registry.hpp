// The registry of objectives: which class trains or evaluates a phase. A new objective is a
// Phase value (include/l3/l3.hpp, with its option parsing in train_config.cpp), its class in
// this folder, and a line in objective_registry.cpp.
#pragma once

#include <memory>
#include <optional>

#include "io/data/dataset_index.hpp"
#include "model/dpo_settings.hpp"
#include "model/llama_model.hpp"
#include "train/dpo_reference.hpp"
#include "train/grpo_settings.hpp"
#include "train/objectives/objective.hpp"

namespace l3::train {

// What an objective may need beyond the model (each reads its own).
struct ObjectiveSettings {
  double center_rewards = 0.0;                // reward: the centring coefficient of training
  std::optional<model::DpoSettings> dpo{};    // DPO: the loss
  const ReferenceTable* reference = nullptr;  // DPO: the reference's table; null with LoRA
  const GrpoSettings* grpo = nullptr;         // GRPO: the loss
};

// The objective of `phase` for `model` (internal Error when the model's head does not suit it).
[[nodiscard]] std::unique_ptr<Objective> make_objective(Phase phase, model::LlamaModel& model,
                                                        const ObjectiveSettings& settings);

// The phase an evaluation of `kind` data runs: SFT data as a language model, preference data
// by DPO's loss when settings are given, else by the reward model's.
[[nodiscard]] Phase evaluation_phase(data::SampleKind kind, bool dpo) noexcept;

}  // namespace l3::train
