// GRPO's objective: the clipped surrogate loss of the policy on its own completions (made by
// grpo::RolloutSource), with TRL's loss types and, with beta > 0, the k3 estimate of the KL to
// the reference (LoRA: the model without its adapters; full fine-tuning: a frozen copy of the
// initial model), whose log-probabilities the batch carries (grpo::RolloutSource computes them
// once per generation batch). A micro-batch's loss positions are the
// completions' tokens; each carries its completion's advantage, the log-probability the
// generator drew it with and its weight in the loss type's normalisation (data::Batch).
//
// The step's loss is sum_t w_t L_t / units, units by loss type: dapo, the step's completion
// tokens; grpo, its completions; dr_grpo, completions x max_completion_length; bnpo, its
// micro-batches (over every rank). The op (kernels::PolicyLossArgs) also sums the KL, the
// clipped tokens, the entropy, and the largest difference between the trainer's and the
// generator's log-probabilities (logp_mismatch). With importance sampling (TRL's
// vllm_importance_sampling_correction) each token's surrogate loss is weighted by the ratio of
// the trainer's to the generator's probability, per token or per completion: a completion is
// the counted positions of one segment (packed: each completion and its prompt are a segment;
// padded: a row), as grpo::RolloutSource lays them out.
#pragma once

#include <vector>

#include "kernels/ops.hpp"
#include "train/grpo_settings.hpp"
#include "train/objectives/objective.hpp"

namespace l3::train {

class PolicyGradientLoss final : public Objective {
 public:
  PolicyGradientLoss(model::LlamaModel& model, const GrpoSettings& settings);

  [[nodiscard]] Phase phase() const noexcept override { return Phase::grpo; }
  [[nodiscard]] std::int64_t units(const model::Batch& batch) const override;
  [[nodiscard]] bool has_work(const model::Batch& batch) const override {
    return batch.completions > 0;
  }
  void describe_step(const LossSums& global, std::int64_t units, StepMetrics& m) const override;
  [[nodiscard]] EvalMetrics eval_metrics(const EvalTotals& global) const override;

  // One batch read back at once (tests): its sums.
  LossSums forward_backward(const model::Batch& batch, float grad_scale);

 protected:
  void pass(const model::Batch& batch, float grad_scale, bool backward,
            model::SumSlot slot) override;

 private:
  // The counted positions' values of a per-position array, into a backend buffer.
  kernels::ConstTensorView upload(const std::vector<float>& per_position, const model::Batch& batch,
                                  std::size_t which);

  GrpoSettings settings_;
  // Per counted row (C): advantages, weights, the generator's log-probabilities, the old
  // policy's (when the batch has them), the reference's row losses (beta > 0); host copies
  // kept until the next pass (a backend with a queue may still be reading them).
  std::array<kernels::Buffer, 5> rows_{};
  std::array<std::vector<float>, 5> host_{};
  std::vector<float> negated_;  // -log ref per position
  // Sequence-level importance sampling: each completion's first counted row (S + 1), then
  // the completions with none (masked), empty, as TRL counts them.
  kernels::Buffer starts_{};
  std::vector<std::int32_t> host_starts_;
  std::int64_t capacity_ = 0;
};

}  // namespace l3::train
