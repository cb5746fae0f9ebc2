#include "train/objectives/objective_registry.hpp"

#include "core/error.hpp"
#include "train/objectives/bradley_terry_loss.hpp"
#include "train/objectives/dpo_loss.hpp"
#include "train/objectives/language_model_loss.hpp"
#include "train/objectives/policy_gradient_loss.hpp"

namespace l3::train {

std::unique_ptr<Objective> make_objective(Phase phase, model::LlamaModel& model,
                                          const ObjectiveSettings& settings) {
  switch (phase) {
    case Phase::sft:
      return std::make_unique<LanguageModelLoss>(model);
    case Phase::reward:
      return std::make_unique<BradleyTerryLoss>(model, settings.center_rewards);
    case Phase::dpo:
      if (!settings.dpo) throw core::internal_error("a DPO objective without its settings");
      return std::make_unique<DpoLoss>(model, *settings.dpo, settings.reference);
    case Phase::grpo:
      if (settings.grpo == nullptr)
        throw core::internal_error("a GRPO objective without its settings");
      return std::make_unique<PolicyGradientLoss>(model, *settings.grpo);
  }
  throw core::internal_error("an objective for an unknown phase");
}

Phase evaluation_phase(data::SampleKind kind, bool dpo) noexcept {
  if (kind == data::SampleKind::sft) return Phase::sft;
  return dpo ? Phase::dpo : Phase::reward;
}

}  // namespace l3::train
