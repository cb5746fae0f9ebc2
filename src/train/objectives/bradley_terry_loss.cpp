#include "train/objectives/bradley_terry_loss.hpp"

#include "core/error.hpp"

namespace l3::train {

using kernels::TensorView;

BradleyTerryLoss::BradleyTerryLoss(model::LlamaModel& model, double center)
    : PreferenceObjective(model), center_(center) {
  if (model.layout().head() != model::HeadKind::reward) {
    throw core::internal_error("a Bradley-Terry loss for a model without a score head");
  }
}

void BradleyTerryLoss::pass(const model::Batch& batch, float grad_scale, bool backward,
                            model::SumSlot slot) {
  run(batch, grad_scale, center_, backward, slot);
}

void BradleyTerryLoss::run(const model::Batch& batch, float grad_scale, double center,
                           bool backward, model::SumSlot slot) {
  model_.load_batch(batch);
  model_.forward({.training = backward});
  const model::HeadInputs in = model_.head();
  kernels::Ops& ops = model_.pass_ops();
  const std::int64_t count = in.sequences;  // 2P
  const TensorView scores = in.row_f32[0].first_rows(count);
  const TensorView d_scores = in.row_f32[1].first_rows(count);
  {
    const model::HeldGroup held =
        model_.hold_head(backward ? model::Pass::backward : model::Pass::forward);
    ops.gather_dot(
        {.scores = scores, .h = in.hidden, .w = model_.score_weight(), .rows = in.score_rows});
    ops.bradley_terry({.sums = model_.sums(slot).slice(0, 3),
                       .d_scores = backward ? d_scores : TensorView{},
                       .scores = scores,
                       .margins = batch.margins.empty() ? kernels::ConstTensorView{} : in.margins,
                       .center = center,
                       .grad_scale = grad_scale});
    if (!backward) return;
    ops.zero(in.d_hidden);
    ops.gather_dot_backward({.dh = in.d_hidden,
                             .dw = model_.score_grad(),
                             .dscores = d_scores,
                             .h = in.hidden,
                             .w = model_.score_weight(),
                             .rows = in.score_rows});
  }
  model_.backward();
}

RewardOutput BradleyTerryLoss::call(const model::Batch& batch, float grad_scale, double center,
                                    bool backward) {
  model_.zero_sums(model::SumSlot::call);
  run(batch, grad_scale, center, backward, model::SumSlot::call);
  const std::int64_t pairs = batch.pairs();
  std::vector<float> scores(static_cast<std::size_t>(2 * pairs));
  model_.pass_ops().copy(TensorView(std::span<float>(scores)),
                         model_.head().row_f32[0].first_rows(2 * pairs));
  const LossSums sums = read(model::SumSlot::call);
  RewardOutput out;
  out.chosen.assign(scores.begin(), scores.begin() + pairs);
  out.rejected.assign(scores.begin() + pairs, scores.end());
  out.stats.loss = sums.loss;
  out.stats.pairs = pairs;
  out.stats.correct = static_cast<std::int64_t>(sums.correct);
  out.stats.margin = sums.margin;
  return out;
}

RewardOutput BradleyTerryLoss::forward_backward(const model::Batch& batch, float grad_scale,
                                                double center) {
  return call(batch, grad_scale, center, true);
}

RewardOutput BradleyTerryLoss::forward(const model::Batch& batch, double center) {
  return call(batch, 1.0F, center, false);
}

void BradleyTerryLoss::eval_pass(const model::Batch& batch) {
  const RewardOutput out = call(batch, 1.0F, 0.0, false);
  host_.loss() += out.stats.loss;
  host_.units() += static_cast<double>(out.stats.pairs);
  host_.correct() += static_cast<double>(out.stats.correct);
  host_.margin() += out.stats.margin;
  for (const auto* scores : {&out.chosen, &out.rejected}) {
    for (const float r : *scores) {
      host_.reward_sum() += r;
      host_.reward_squares() += static_cast<double>(r) * r;
    }
  }
}

void BradleyTerryLoss::describe_step(const LossSums& global, std::int64_t units,
                                     StepMetrics& m) const {
  describe_pair_step(global, units, m);
}

EvalMetrics BradleyTerryLoss::eval_metrics(const EvalTotals& global) const {
  EvalMetrics m = pair_eval_metrics(global);
  m.phase = Phase::reward;
  return m;
}

}  // namespace l3::train
