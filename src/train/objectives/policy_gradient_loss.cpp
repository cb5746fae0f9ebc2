#include "train/objectives/policy_gradient_loss.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.hpp"
#include "core/trace_range.hpp"

namespace l3::train {

using kernels::ConstTensorView;
using kernels::TensorView;

PolicyGradientLoss::PolicyGradientLoss(model::LlamaModel& model, const GrpoSettings& settings)
    : Objective(model), settings_(settings) {
  if (model.layout().head() != model::HeadKind::language_model)
    throw core::internal_error("a policy-gradient loss for a model without a language-model head");
}

namespace {

kernels::ImportanceSampling importance_sampling(const GrpoSettings& s) {
  if (!s.importance_sampling_correction) return kernels::ImportanceSampling::off;
  switch (s.importance_sampling_mode) {
    case ImportanceSamplingMode::sequence_truncate:
      return kernels::ImportanceSampling::sequence_truncate;
    case ImportanceSamplingMode::token_mask:
      return kernels::ImportanceSampling::token_mask;
    case ImportanceSamplingMode::token_truncate:
      return kernels::ImportanceSampling::token_truncate;
    case ImportanceSamplingMode::sequence_mask:
      break;
  }
  return kernels::ImportanceSampling::sequence_mask;
}

// The counted rows' completions (S + 1 boundaries, in counted-row order): a completion's
// counted positions are contiguous in one segment (cu_seqlens), and no other segment has any.
// Then batch.completions - S empty ones: completions left out of the loss
// (--mask-truncated-completions), whose ratio TRL still counts (exp(0) = 1).
void completion_starts(const model::Batch& batch, std::vector<std::int32_t>& starts) {
  starts.assign(1, 0);
  std::size_t segment = 0;
  bool open = false;  // the current segment has a counted row
  std::int32_t row = 0;
  for (std::size_t t = 0; t < batch.loss_mask.size(); ++t) {
    while (segment + 1 < batch.cu_seqlens.size() &&
           static_cast<std::size_t>(batch.cu_seqlens[segment + 1]) <= t) {
      ++segment;
      if (open) starts.push_back(row);
      open = false;
    }
    if (batch.loss_mask[t] == 0) continue;
    open = true;
    ++row;
  }
  if (open) starts.push_back(row);
  const auto counted = static_cast<std::int64_t>(starts.size()) - 1;
  if (counted > batch.completions) {
    throw core::internal_error(
        fmt::format("GRPO: {} segments with counted tokens in a micro-batch of {} completions",
                    counted, batch.completions));
  }
  starts.resize(static_cast<std::size_t>(batch.completions) + 1, row);
}

}  // namespace

std::int64_t PolicyGradientLoss::units(const model::Batch& batch) const {
  switch (settings_.loss_type) {
    case PolicyLossType::grpo:
      return batch.completions;
    case PolicyLossType::bnpo:
      return 1;  // every micro-batch, those with no rows too (TRL divides by the accumulation)
    case PolicyLossType::dr_grpo:
      return batch.completions * settings_.max_completion_length;
    case PolicyLossType::dapo:
      break;
  }
  return batch.counted_tokens();
}

ConstTensorView PolicyGradientLoss::upload(const std::vector<float>& per_position,
                                           const model::Batch& batch, std::size_t which) {
  std::vector<float>& host = host_[which];
  host.clear();
  for (std::size_t t = 0; t < batch.loss_mask.size(); ++t) {
    if (batch.loss_mask[t] != 0) host.push_back(per_position[t]);
  }
  const auto c = static_cast<std::int64_t>(host.size());
  if (c == 0) return {};
  const TensorView rows = rows_[which].slice(0, c);
  model_.ops().copy(rows, ConstTensorView(std::span<const float>(host)));
  return rows;
}

void PolicyGradientLoss::pass(const model::Batch& batch, float grad_scale, bool backward,
                              model::SumSlot slot) {
  model_.load_batch(batch);
  const model::HeadInputs in = model_.head();
  kernels::Ops& ops = model_.pass_ops();
  const kernels::ImportanceSampling sampling = importance_sampling(settings_);
  if (const std::int64_t c = in.counted; c > capacity_) {
    for (kernels::Buffer& b : rows_) b = model_.ops().allocate(kernels::DType::f32, c);
    capacity_ = c;
  }
  ConstTensorView starts;
  if (kernels::is_sequence_level(sampling) && in.counted > 0) {
    completion_starts(batch, host_starts_);
    const auto n = static_cast<std::int64_t>(host_starts_.size());
    if (starts_.numel() < n) starts_ = model_.ops().allocate(kernels::DType::i32, n);
    const TensorView view = starts_.slice(0, n);
    model_.ops().copy(view, ConstTensorView(std::span<const std::int32_t>(host_starts_)));
    starts = view;
  }
  ConstTensorView advantages;
  ConstTensorView weights;
  ConstTensorView sampled;
  ConstTensorView old;
  ConstTensorView ref;
  if (in.counted > 0) {
    if (batch.advantages.size() != batch.loss_mask.size() ||
        batch.loss_weights.size() != batch.loss_mask.size() ||
        batch.sampled_logprobs.size() != batch.loss_mask.size()) {
      throw core::internal_error("a policy-gradient batch without its advantages and weights");
    }
    advantages = upload(batch.advantages, batch, 0);
    weights = upload(batch.loss_weights, batch, 1);
    sampled = upload(batch.sampled_logprobs, batch, 2);
    if (!batch.old_logprobs.empty()) old = upload(batch.old_logprobs, batch, 3);
    if (settings_.beta > 0) {
      if (batch.ref_logprobs.size() != batch.loss_mask.size())
        throw core::internal_error(
            "GRPO with beta > 0: a batch without the reference's log-probabilities");
      // The op takes the reference's per-row losses: -log ref.
      negated_.resize(batch.ref_logprobs.size());
      for (std::size_t t = 0; t < negated_.size(); ++t) negated_[t] = -batch.ref_logprobs[t];
      ref = upload(negated_, batch, 4);
    }
  }
  const TensorView row_loss = in.row_f32[0].first_rows(in.counted);
  const TensorView d_rows = in.row_f32[1].first_rows(in.counted);
  const TensorView entropy = in.row_f32[3].first_rows(in.counted);
  model_.forward({.training = backward});
  {
    const core::TraceRange range("lm_head + log-probabilities");
    const model::HeldGroup held = model_.hold_head(model::Pass::forward);
    ops.lm_head_cross_entropy({.row_loss = row_loss,
                               .row_entropy = entropy,
                               .h = in.hidden,
                               .w = model_.lm_head_weight(),
                               .rows = in.loss_rows,
                               .targets = in.loss_targets,
                               .logit_scale = settings_.logit_scale(),
                               .vocab = model_.vocab_share()});
  }
  const TensorView sums = model_.sums(slot);
  const bool sampled_ratio = sampling != kernels::ImportanceSampling::off;
  ops.policy_loss({.sums = sums.slice(0, sampled_ratio ? 8 : 5),
                   .largest = sums.slice(LossSums::kSums, sampled_ratio ? 3 : 1),
                   .d_rows = backward ? d_rows : TensorView{},
                   .row_loss = row_loss,
                   .advantages = advantages,
                   .weights = weights,
                   .old_logps = old,
                   .ref_row_loss = ref,
                   .sampled_logps = sampled,
                   .row_entropy = entropy,
                   .completion_starts = starts,
                   .epsilon_low = settings_.epsilon,
                   .epsilon_high = settings_.clip_high(),
                   .beta = settings_.beta,
                   .importance_sampling = sampling,
                   .clip_min = settings_.importance_sampling_clip_min.value_or(0.0),
                   .clip_max = settings_.importance_sampling_clip_max.value_or(
                       std::numeric_limits<double>::infinity()),
                   .grad_scale = grad_scale});
  if (backward) weighted_lm_head_backward(model_, in, d_rows, "GRPO", settings_.logit_scale());
}

LossSums PolicyGradientLoss::forward_backward(const model::Batch& batch, float grad_scale) {
  model_.zero_sums(model::SumSlot::call);
  pass(batch, grad_scale, true, model::SumSlot::call);
  return read(model::SumSlot::call);
}

void PolicyGradientLoss::describe_step(const LossSums& global, std::int64_t units,
                                       StepMetrics& m) const {
  m.loss = units > 0 ? global.loss / static_cast<double>(units) : 0.0;
  // Token means over the step's counted tokens (the trainer's loss_tokens).
  const double tokens = static_cast<double>(std::max<std::int64_t>(m.loss_tokens, 1));
  if (settings_.beta > 0) m.extra.emplace_back("kl", global.correct / tokens);
  m.extra.emplace_back("entropy", global.extra[0] / tokens);
  m.extra.emplace_back("clip_ratio/low_mean", global.margin / tokens);
  m.extra.emplace_back("clip_ratio/high_mean", global.chosen / tokens);
  m.extra.emplace_back("clip_ratio/region_mean", (global.margin + global.chosen) / tokens);
  m.extra.emplace_back("logp_mismatch", global.largest[0]);
  if (settings_.importance_sampling_correction) {
    // TRL's names; min, mean and max over the units (sequence_*: the completions, token_*: the
    // counted tokens), the ratios after masking or truncation; 1 / (1 + min) travels as a
    // maximum (0: no unit).
    const double units_seen = global.extra[2];
    const double inverse_min = global.largest[2];
    m.extra.emplace_back("sampling/importance_sampling_ratio/min",
                         inverse_min > 0 ? 1.0 / inverse_min - 1.0 : 0.0);
    m.extra.emplace_back("sampling/importance_sampling_ratio/mean",
                         units_seen > 0 ? global.extra[1] / units_seen : 0.0);
    m.extra.emplace_back("sampling/importance_sampling_ratio/max", global.largest[1]);
    const bool masking =
        settings_.importance_sampling_mode == ImportanceSamplingMode::sequence_mask ||
        settings_.importance_sampling_mode == ImportanceSamplingMode::token_mask;
    // The share of the step's counted tokens whose ratio was masked to 0 or truncated.
    m.extra.emplace_back(
        masking ? "sampling/importance_sampling_masked" : "sampling/importance_sampling_truncated",
        global.extra[3] / tokens);
  }
}

EvalMetrics PolicyGradientLoss::eval_metrics(const EvalTotals& /*global*/) const {
  // GRPO evaluates by generating (grpo::RolloutSource), not through loss passes.
  EvalMetrics m;
  m.phase = Phase::grpo;
  return m;
}

}  // namespace l3::train
