#include "train/objectives/bradley_terry_loss.hpp"

#include <array>
#include <vector>

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

std::vector<float> BradleyTerryLoss::run_share(const model::Batch& batch, float grad_scale,
                                               double center, bool backward, model::SumSlot slot) {
  // A context-parallel share: each sequence's score is read where its last token is; the group
  // gathers them, every rank computes the whole batch's loss (rank 0 of the group counts it),
  // and each rank's last tokens take their gradients (the score head's add up over the ranks
  // as data parallelism adds every gradient). Host arrays: the CPU backend's memory.
  const model::HeadInputs in = model_.head();
  kernels::Ops& ops = model_.pass_ops();
  std::vector<std::int32_t> held;  // sequences whose last token is here
  std::vector<std::int32_t> rows;  // and its row
  const std::span<const std::int32_t> sequence_rows = model_.share_sequence_rows();
  for (std::size_t s = 0; s < sequence_rows.size(); ++s) {
    if (sequence_rows[s] < 0) continue;
    held.push_back(static_cast<std::int32_t>(s));
    rows.push_back(sequence_rows[s]);
  }
  const auto view_i32 = [](const std::vector<std::int32_t>& v) {
    return kernels::ConstTensorView(std::span<const std::int32_t>(v));
  };
  const model::HeldGroup held_head =
      model_.hold_head(backward ? model::Pass::backward : model::Pass::forward);
  std::vector<float> mine(held.size());
  ops.gather_dot({.scores = TensorView(std::span<float>(mine)),
                  .h = in.hidden,
                  .w = model_.score_weight(),
                  .rows = view_i32(rows)});
  ops.synchronize();
  model::ContextExchange& group = model_.context_exchange();
  const std::vector<std::int32_t> all_held =
      group.all_gather_varying(std::span<const std::int32_t>(held));
  const std::vector<float> all_scores = group.all_gather_varying(std::span<const float>(mine));
  std::vector<float> scores(sequence_rows.size(), 0.0F);
  for (std::size_t k = 0; k < all_held.size(); ++k)
    scores[static_cast<std::size_t>(all_held[k])] = all_scores[k];
  std::vector<float> d_scores(backward ? scores.size() : 0);
  std::array<double, 3> not_counted{};  // the other ranks' copy of the sums
  ops.bradley_terry({.sums = batch.context_rank == 0 ? model_.sums(slot).slice(0, 3)
                                                     : TensorView(std::span<double>(not_counted)),
                     .d_scores = backward ? TensorView(std::span<float>(d_scores)) : TensorView{},
                     .scores = kernels::ConstTensorView(std::span<const float>(scores)),
                     .margins = batch.margins.empty() ? kernels::ConstTensorView{}
                                                      : kernels::ConstTensorView(
                                                            std::span<const float>(batch.margins)),
                     .center = center,
                     .grad_scale = grad_scale});
  if (!backward) return scores;
  std::vector<float> d_mine(held.size());
  for (std::size_t k = 0; k < held.size(); ++k)
    d_mine[k] = d_scores[static_cast<std::size_t>(held[k])];
  ops.zero(in.d_hidden);
  ops.gather_dot_backward({.dh = in.d_hidden,
                           .dw = model_.score_grad(),
                           .dscores = kernels::ConstTensorView(std::span<const float>(d_mine)),
                           .h = in.hidden,
                           .w = model_.score_weight(),
                           .rows = view_i32(rows)});
  return scores;
}

std::vector<float> BradleyTerryLoss::run(const model::Batch& batch, float grad_scale, double center,
                                         bool backward, model::SumSlot slot) {
  model_.load_batch(batch);
  model_.forward({.training = backward});
  if (model_.holds_share()) {
    std::vector<float> scores = run_share(batch, grad_scale, center, backward, slot);
    if (backward) model_.backward();
    return scores;
  }
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
    if (!backward) return {};
    ops.zero(in.d_hidden);
    ops.gather_dot_backward({.dh = in.d_hidden,
                             .dw = model_.score_grad(),
                             .dscores = d_scores,
                             .h = in.hidden,
                             .w = model_.score_weight(),
                             .rows = in.score_rows});
  }
  model_.backward();
  return {};
}

RewardOutput BradleyTerryLoss::call(const model::Batch& batch, float grad_scale, double center,
                                    bool backward) {
  model_.zero_sums(model::SumSlot::call);
  std::vector<float> scores = run(batch, grad_scale, center, backward, model::SumSlot::call);
  // A context-parallel group's pairs count on its rank 0 (units); every rank has the scores.
  const std::int64_t pairs = units(batch);
  if (!model_.holds_share()) {
    scores.resize(static_cast<std::size_t>(2 * batch.pairs()));
    model_.pass_ops().copy(TensorView(std::span<float>(scores)),
                           model_.head().row_f32[0].first_rows(2 * batch.pairs()));
  } else if (pairs == 0) {
    scores.clear();  // counted by rank 0 of the group
  }
  const LossSums sums = read(model::SumSlot::call);
  RewardOutput out;
  const auto half = static_cast<std::ptrdiff_t>(scores.size() / 2);
  out.chosen.assign(scores.begin(), scores.begin() + half);
  out.rejected.assign(scores.begin() + half, scores.end());
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
