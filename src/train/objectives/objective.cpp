#include "train/objectives/objective.hpp"

#include <algorithm>
#include <cmath>

#include "core/trace_range.hpp"

namespace l3::train {

void Objective::train(const model::Batch& batch, float grad_scale) {
  if (has_work(batch)) {
    pass(batch, grad_scale, true, model::SumSlot::step);
  } else {
    pass(model::Batch::none(batch.seq_len), grad_scale, true, model::SumSlot::step);
  }
}

void Objective::begin_eval() {
  model_.zero_sums(model::SumSlot::eval);
  host_ = {};
}

void Objective::evaluate(const model::Batch& batch) {
  if (has_work(batch)) {
    eval_pass(batch);
  } else {
    eval_pass(model::Batch::none(batch.seq_len));
  }
}

void Objective::eval_pass(const model::Batch& batch) {
  pass(batch, 1.0F, false, model::SumSlot::eval);
  host_.units() += static_cast<double>(units(batch));
}

EvalTotals Objective::eval_totals() const {
  EvalTotals totals = host_;
  const LossSums s = read(model::SumSlot::eval);
  totals.loss() = s.loss;
  totals.correct() = s.correct;
  totals.margin() = s.margin;
  totals.chosen_reward() = s.chosen;
  totals.rejected_reward() = s.chosen - s.margin;
  return totals;
}

LossSums Objective::read(model::SumSlot slot) const {
  const std::array<double, model::LlamaModel::kSumValues> v = model_.read_sums(slot);
  return LossSums::of(v);
}

void weighted_lm_head_backward(model::LlamaModel& model, const model::HeadInputs& in,
                               kernels::ConstTensorView d_rows, const char* what,
                               float logit_scale) {
  {
    const core::TraceRange range("lm_head backward ({})", what);
    const model::HeldGroup held = model.hold_head(model::Pass::backward);
    model.pass_ops().lm_head_cross_entropy({.dh = in.d_hidden,
                                            .dw = model.lm_head_grad(),
                                            .h = in.hidden,
                                            .w = model.lm_head_weight(),
                                            .rows = in.loss_rows,
                                            .targets = in.loss_targets,
                                            .row_scale = d_rows,
                                            .grad_scale = 1.0F,
                                            .logit_scale = logit_scale,
                                            .vocab = model.vocab_share()});
  }
  model.backward();
}

void describe_pair_step(const LossSums& global, std::int64_t pairs, StepMetrics& m) {
  const auto denominator = static_cast<double>(pairs);
  m.loss = pairs > 0 ? global.loss / denominator : std::nan("");
  m.pairs = pairs;
  m.accuracy = pairs > 0 ? global.correct / denominator : 0.0;
  m.margin = pairs > 0 ? global.margin / denominator : 0.0;
}

EvalMetrics pair_eval_metrics(EvalTotals global) {
  EvalMetrics m;
  m.pairs = static_cast<std::int64_t>(global.units());
  const double pairs = std::max(1.0, global.units());
  m.loss = global.loss() / pairs;
  m.accuracy = global.correct() / pairs;
  m.margin = global.margin() / pairs;
  m.chosen_reward = global.chosen_reward() / pairs;
  m.rejected_reward = global.rejected_reward() / pairs;
  const double scores = 2.0 * pairs;
  m.reward_mean = global.reward_sum() / scores;
  m.reward_std =
      std::sqrt(std::max(0.0, global.reward_squares() / scores - m.reward_mean * m.reward_mean));
  return m;
}

}  // namespace l3::train
