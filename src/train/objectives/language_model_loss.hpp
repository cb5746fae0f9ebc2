// Supervised fine-tuning: the language model's cross-entropy on the counted (response) tokens,
// by the fused lm_head + masked cross-entropy. A step's loss is the mean over the global
// batch's counted tokens; an evaluation's is token-weighted over the whole dataset.
#pragma once

#include "kernels/ops.hpp"
#include "train/objectives/objective.hpp"

namespace l3::train {

class LanguageModelLoss final : public Objective {
 public:
  explicit LanguageModelLoss(model::LlamaModel& model);

  [[nodiscard]] Phase phase() const noexcept override { return Phase::sft; }
  [[nodiscard]] std::int64_t units(const model::Batch& batch) const override {
    return batch.counted_tokens();
  }
  // A context-parallel share has work when its whole has (the group's ranks run together).
  [[nodiscard]] bool has_work(const model::Batch& batch) const override {
    return (batch.context_rows.empty() ? batch.document_tokens : batch.context_document_tokens) > 0;
  }
  void describe_step(const LossSums& global, std::int64_t units, StepMetrics& m) const override;
  [[nodiscard]] EvalMetrics eval_metrics(const EvalTotals& global) const override;

  // One micro-batch read back at once (tests, benchmarks, inference): the summed
  // cross-entropy of its counted tokens, and with a backward the gradients of
  // grad_scale * loss added into the model's.
  kernels::LossSum forward_backward(const model::Batch& batch, float grad_scale);
  [[nodiscard]] kernels::LossSum forward(const model::Batch& batch);

 protected:
  void pass(const model::Batch& batch, float grad_scale, bool backward,
            model::SumSlot slot) override;
};

}  // namespace l3::train
