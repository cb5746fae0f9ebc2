// Direct preference optimisation: a language model on preference pairs whose masks mark the
// responses. Each sequence's log-probability (its counted tokens', summed; IPO: their mean) under
// the policy is compared with the reference's: a table computed once from the initial model
// (full fine-tuning, train/dpo_reference.hpp), or the frozen model without its adapters (LoRA),
// computed in each pass. Sigmoid (with label smoothing), IPO and hinge losses; a step's loss is
// the mean over the global batch's pairs, with the implicit rewards of both sides.
#pragma once

#include <span>
#include <vector>

#include "model/dpo_settings.hpp"
#include "train/dpo_reference.hpp"
#include "train/objectives/objective.hpp"

namespace l3::train {

class DpoLoss final : public PreferenceObjective {
 public:
  // `reference`: the reference's log-probabilities of the pairs (not owned), or null with LoRA:
  // then the model without its adapters is the reference (a forward pass more). (Null without
  // LoRA serves forward_backward() only.)
  DpoLoss(model::LlamaModel& model, const model::DpoSettings& settings,
          const ReferenceTable* reference);

  [[nodiscard]] Phase phase() const noexcept override { return Phase::dpo; }
  void describe_step(const LossSums& global, std::int64_t units, StepMetrics& m) const override;
  [[nodiscard]] EvalMetrics eval_metrics(const EvalTotals& global) const override;

  // One batch read back at once (tests, benchmarks): its sums.
  LossSums forward_backward(const model::Batch& batch, float grad_scale,
                            std::span<const double> reference);

 protected:
  void pass(const model::Batch& batch, float grad_scale, bool backward,
            model::SumSlot slot) override;

 private:
  // A context-parallel share's pass (run's, over the group's gathered rows).
  void run_share(const model::Batch& batch, float grad_scale, bool backward, model::SumSlot slot,
                 std::span<const double> reference, bool from_base);
  // `from_base`: the reference is the model without its adapters (else `reference`, 2P values).
  void run(const model::Batch& batch, float grad_scale, bool backward, model::SumSlot slot,
           std::span<const double> reference, bool from_base);

  model::DpoSettings settings_;
  const ReferenceTable* reference_;
};

// The log-probabilities of a preference batch's 2P sequences' counted tokens (chosen, then
// rejected), summed in fp64 (`mean`: divided by their counts, IPO's), by a forward pass of the
// model as it is, or of its frozen base (`adapters` false, LoRA): DPO's reference. A batch of
// no rows gives none (and makes the calls a real pass makes).
[[nodiscard]] std::vector<double> sequence_log_probs(model::LlamaModel& model,
                                                     const model::Batch& batch, bool mean,
                                                     bool adapters = true);

}  // namespace l3::train
