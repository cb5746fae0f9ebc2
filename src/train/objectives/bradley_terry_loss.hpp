// Reward models: a score read at each sequence's last token by the score head, and the
// Bradley-Terry loss -log sigmoid(r_chosen - r_rejected - margin) over preference pairs, with
// an optional centring term (center * (r_chosen + r_rejected)^2). A step's loss is the mean
// over the global batch's pairs; an evaluation adds the scores' mean and spread.
#pragma once

#include <vector>

#include "kernels/cpu/bradley_terry.hpp"
#include "train/objectives/objective.hpp"

namespace l3::train {

// One reward batch read back at once.
struct RewardOutput {
  kernels::cpu::PreferenceStats stats;
  std::vector<float> chosen;  // score of each pair's chosen sequence
  std::vector<float> rejected{};
};

class BradleyTerryLoss final : public PreferenceObjective {
 public:
  // `center`: the centring coefficient of training steps (evaluations use none).
  explicit BradleyTerryLoss(model::LlamaModel& model, double center = 0.0);

  [[nodiscard]] Phase phase() const noexcept override { return Phase::reward; }
  void describe_step(const LossSums& global, std::int64_t units, StepMetrics& m) const override;
  [[nodiscard]] EvalTotals eval_totals() const override { return host_; }
  [[nodiscard]] EvalMetrics eval_metrics(const EvalTotals& global) const override;

  // One batch read back at once (evaluation, scoring, tests): its pairs' scores and loss
  // statistics, and with a backward the gradients of grad_scale * loss added into the model's.
  RewardOutput forward_backward(const model::Batch& batch, float grad_scale, double center);
  [[nodiscard]] RewardOutput forward(const model::Batch& batch, double center);

 protected:
  void pass(const model::Batch& batch, float grad_scale, bool backward,
            model::SumSlot slot) override;
  // Scores read back per batch: the host adds up their mean and spread.
  void eval_pass(const model::Batch& batch) override;

 private:
  // The pass; a context-parallel share's returns the batch's scores (2P, on the host), a whole
  // batch's leaves them in head().row_f32[0] and returns nothing.
  std::vector<float> run(const model::Batch& batch, float grad_scale, double center, bool backward,
                         model::SumSlot slot);
  std::vector<float> run_share(const model::Batch& batch, float grad_scale, double center,
                               bool backward, model::SumSlot slot);
  RewardOutput call(const model::Batch& batch, float grad_scale, double center, bool backward);

  double center_;
};

}  // namespace l3::train
