#include "train/objectives/dpo_loss.hpp"

#include <fmt/format.h>

#include <array>
#include <vector>

#include "core/error.hpp"
#include "core/trace_range.hpp"

namespace l3::train {

using kernels::ConstTensorView;
using kernels::TensorView;

namespace {

// The loaded batch's counted rows' cross-entropies into in.row_f32[0] (a pass of the lm_head
// over the forward's hidden states) and, unless `logps` is empty, its sequences'
// log-probabilities into `logps` (2P).
void sequence_log_probs_into(model::LlamaModel& model, const model::HeadInputs& in, bool mean,
                             TensorView logps) {
  kernels::Ops& ops = model.pass_ops();
  const core::TraceRange range("lm_head + sequence log-probabilities");
  const model::HeldGroup held = model.hold_head(model::Pass::forward);
  const TensorView row_loss = in.row_f32[0].first_rows(in.counted);
  ops.lm_head_cross_entropy({.row_loss = row_loss,
                             .h = in.hidden,
                             .w = model.lm_head_weight(),
                             .rows = in.loss_rows,
                             .targets = in.loss_targets,
                             .vocab = model.vocab_share()});
  if (logps.empty()) return;
  ops.sequence_log_probs({.logps = logps, .row_loss = row_loss, .ranges = in.ranges, .mean = mean});
}

// Context parallelism: the loaded share's counted rows' cross-entropies (into in.row_f32[0])
// and the group's, over the whole batch (LlamaModel::gather_counted_rows).
model::LlamaModel::WholeRows whole_row_losses(model::LlamaModel& model,
                                              const model::HeadInputs& in) {
  sequence_log_probs_into(model, in, false, TensorView{});
  return model.gather_counted_rows(in.row_f32[0].first_rows(in.counted));
}

// Host views of the whole rows for the ops: context parallelism runs on the CPU backend, whose
// memory is the host's.
ConstTensorView values_of(const model::LlamaModel::WholeRows& rows) {
  return ConstTensorView(std::span<const float>(rows.values));
}
ConstTensorView ranges_of(const model::LlamaModel::WholeRows& rows) {
  const auto sequences = static_cast<std::int64_t>(rows.ranges.size() / 2);
  return ConstTensorView(std::span<const std::int32_t>(rows.ranges)).reshape({sequences, 2});
}

void require_language_model(const model::LlamaModel& model, const char* what) {
  if (model.layout().head() != model::HeadKind::language_model) {
    throw core::internal_error(fmt::format("{} of a model without a language-model head", what));
  }
}

}  // namespace

DpoLoss::DpoLoss(model::LlamaModel& model, const model::DpoSettings& settings,
                 const ReferenceTable* reference)
    : PreferenceObjective(model), settings_(settings), reference_(reference) {
  require_language_model(model, "DPO");
}

void DpoLoss::pass(const model::Batch& batch, float grad_scale, bool backward,
                   model::SumSlot slot) {
  const bool from_base = reference_ == nullptr;
  if (from_base && !model_.has_adapters()) {
    throw core::internal_error("a DPO pass without reference log-probabilities or LoRA adapters");
  }
  run(batch, grad_scale, backward, slot, from_base ? std::vector<double>{} : reference_->of(batch),
      from_base);
}

void DpoLoss::run(const model::Batch& batch, float grad_scale, bool backward, model::SumSlot slot,
                  std::span<const double> reference, bool from_base) {
  model_.load_batch(batch, reference);
  if (model_.holds_share()) {
    run_share(batch, grad_scale, backward, slot, reference, from_base);
    return;
  }
  const model::HeadInputs in = model_.head();
  kernels::Ops& ops = model_.pass_ops();
  const bool mean = settings_.loss == kernels::PreferenceLoss::ipo;
  ConstTensorView reference_logps = in.reference;
  if (from_base) {
    // LoRA: the frozen model without its adapters is the reference, no second copy of it.
    const core::TraceRange range("DPO reference (the base model)");
    model_.forward({.training = false, .adapters = false});
    const TensorView logps = in.row_f64.first_rows(in.sequences);
    sequence_log_probs_into(model_, in, mean, logps);
    reference_logps = logps;
  }
  model_.forward({.training = backward});
  sequence_log_probs_into(model_, in, mean, TensorView{});
  const TensorView d_rows = in.row_f32[1].first_rows(in.counted);
  ops.dpo_loss({.sums = model_.sums(slot).slice(0, 4),
                .d_rows = backward ? d_rows : TensorView{},
                .row_loss = in.row_f32[0].first_rows(in.counted),
                .ranges = in.ranges,
                .reference = reference_logps,
                .beta = settings_.beta,
                .label_smoothing = settings_.label_smoothing,
                .loss = settings_.loss,
                .grad_scale = grad_scale});
  // Each row weighted by its sequence's share of the loss.
  if (backward) weighted_lm_head_backward(model_, in, d_rows, "DPO");
}

void DpoLoss::run_share(const model::Batch& batch, float grad_scale, bool backward,
                        model::SumSlot slot, std::span<const double> reference, bool from_base) {
  // A context-parallel share: the group gathers its rows' cross-entropies, every rank computes
  // the whole batch's loss from them (the same sums in the same order as one rank holding the
  // whole batch), rank 0 of the group adds it to the sums, and each rank's rows take their
  // gradients.
  const model::HeadInputs in = model_.head();
  kernels::Ops& ops = model_.pass_ops();
  const bool mean = settings_.loss == kernels::PreferenceLoss::ipo;
  std::vector<double> reference_logps(reference.begin(), reference.end());
  if (from_base) {
    const core::TraceRange range("DPO reference (the base model)");
    model_.forward({.training = false, .adapters = false});
    const model::LlamaModel::WholeRows base = whole_row_losses(model_, in);
    reference_logps.assign(static_cast<std::size_t>(in.sequences), 0.0);
    ops.sequence_log_probs({.logps = TensorView(std::span<double>(reference_logps)),
                            .row_loss = values_of(base),
                            .ranges = ranges_of(base),
                            .mean = mean});
  }
  model_.forward({.training = backward});
  const model::LlamaModel::WholeRows rows = whole_row_losses(model_, in);
  std::vector<float> d_whole(backward ? rows.values.size() : 0);
  std::array<double, 4> not_counted{};  // the other ranks' copy of the sums
  ops.dpo_loss({.sums = batch.context_rank == 0 ? model_.sums(slot).slice(0, 4)
                                                : TensorView(std::span<double>(not_counted)),
                .d_rows = backward ? TensorView(std::span<float>(d_whole)) : TensorView{},
                .row_loss = values_of(rows),
                .ranges = ranges_of(rows),
                .reference = ConstTensorView(std::span<const double>(reference_logps)),
                .beta = settings_.beta,
                .label_smoothing = settings_.label_smoothing,
                .loss = settings_.loss,
                .grad_scale = grad_scale});
  if (!backward) return;
  std::vector<float> d_mine(rows.mine.size());
  for (std::size_t i = 0; i < d_mine.size(); ++i)
    d_mine[i] = d_whole[static_cast<std::size_t>(rows.mine[i])];
  const TensorView d_rows = in.row_f32[1].first_rows(in.counted);
  ops.copy(d_rows, ConstTensorView(std::span<const float>(d_mine)));
  weighted_lm_head_backward(model_, in, d_rows, "DPO");
}

LossSums DpoLoss::forward_backward(const model::Batch& batch, float grad_scale,
                                   std::span<const double> reference) {
  model_.zero_sums(model::SumSlot::call);
  if (reference.empty() && !model_.has_adapters()) {
    throw core::internal_error("a DPO pass without reference log-probabilities or LoRA adapters");
  }
  run(batch, grad_scale, true, model::SumSlot::call, reference, reference.empty());
  return read(model::SumSlot::call);
}

void DpoLoss::describe_step(const LossSums& global, std::int64_t units, StepMetrics& m) const {
  describe_pair_step(global, units, m);
  const auto denominator = static_cast<double>(units);
  m.chosen_reward = units > 0 ? global.chosen / denominator : 0.0;
  m.rejected_reward = units > 0 ? (global.chosen - global.margin) / denominator : 0.0;
}

EvalMetrics DpoLoss::eval_metrics(const EvalTotals& global) const {
  EvalMetrics m = pair_eval_metrics(global);
  m.phase = Phase::dpo;
  return m;
}

std::vector<double> sequence_log_probs(model::LlamaModel& model, const model::Batch& batch,
                                       bool mean, bool adapters) {
  require_language_model(model, "log-probabilities");
  model.load_batch(batch);
  model.forward({.training = false, .adapters = adapters});
  const model::HeadInputs in = model.head();
  if (model.holds_share()) {  // the group's rows, the whole sequences
    const model::LlamaModel::WholeRows rows = whole_row_losses(model, in);
    std::vector<double> host(static_cast<std::size_t>(in.sequences));
    model.pass_ops().sequence_log_probs({.logps = TensorView(std::span<double>(host)),
                                         .row_loss = values_of(rows),
                                         .ranges = ranges_of(rows),
                                         .mean = mean});
    return host;
  }
  const TensorView logps = in.row_f64.first_rows(in.sequences);
  sequence_log_probs_into(model, in, mean, logps);
  std::vector<double> host(static_cast<std::size_t>(in.sequences));
  model.pass_ops().copy(TensorView(std::span<double>(host)), logps);
  return host;
}

}  // namespace l3::train
