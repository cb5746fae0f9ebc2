#include "train/objectives/language_model_loss.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/trace_range.hpp"

namespace l3::train {

using kernels::TensorView;

LanguageModelLoss::LanguageModelLoss(model::LlamaModel& model) : Objective(model) {
  if (model.layout().head() != model::HeadKind::language_model) {
    throw core::internal_error("a language-model loss for a model without a language-model head");
  }
}

void LanguageModelLoss::pass(const model::Batch& batch, float grad_scale, bool backward,
                             model::SumSlot slot) {
  model_.load_batch(batch);
  model_.forward({.training = backward});
  const model::HeadInputs in = model_.head();
  {
    const core::TraceRange range("lm_head + cross-entropy");
    const model::HeldGroup held =
        model_.hold_head(backward ? model::Pass::backward : model::Pass::forward);
    model_.pass_ops().lm_head_cross_entropy({.loss_sum = model_.sums(slot).slice(0, 1),
                                             .dh = backward ? in.d_hidden : TensorView{},
                                             .dw = backward ? model_.lm_head_grad() : TensorView{},
                                             .h = in.hidden,
                                             .w = model_.lm_head_weight(),
                                             .rows = in.loss_rows,
                                             .targets = in.loss_targets,
                                             .grad_scale = grad_scale,
                                             .vocab = model_.vocab_share()});
  }
  if (backward) model_.backward();
}

void LanguageModelLoss::describe_step(const LossSums& global, std::int64_t units,
                                      StepMetrics& m) const {
  m.loss = units > 0 ? global.loss / static_cast<double>(units) : std::nan("");
  m.loss_tokens = units;
}

EvalMetrics LanguageModelLoss::eval_metrics(const EvalTotals& global) const {
  EvalTotals totals = global;
  EvalMetrics m;
  m.phase = Phase::sft;
  m.tokens = static_cast<std::int64_t>(totals.units());
  m.loss = m.tokens > 0 ? totals.loss() / totals.units() : std::nan("");
  m.perplexity = std::exp(m.loss);
  return m;
}

kernels::LossSum LanguageModelLoss::forward_backward(const model::Batch& batch, float grad_scale) {
  model_.zero_sums(model::SumSlot::call);
  pass(batch, grad_scale, true, model::SumSlot::call);
  return {read(model::SumSlot::call).loss, batch.counted_tokens()};
}

kernels::LossSum LanguageModelLoss::forward(const model::Batch& batch) {
  model_.zero_sums(model::SumSlot::call);
  pass(batch, 1.0F, false, model::SumSlot::call);
  return {read(model::SumSlot::call).loss, batch.counted_tokens()};
}

}  // namespace l3::train
