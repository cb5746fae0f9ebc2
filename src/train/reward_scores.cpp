#include "train/reward_scores.hpp"

#include <algorithm>
#include <vector>

#include "core/error.hpp"
#include "model/batch.hpp"
#include "train/objectives/bradley_terry_loss.hpp"

namespace l3::train {

namespace {

std::vector<std::int32_t> copy_of(std::span<const std::int32_t> tokens) {
  if (tokens.empty()) throw core::internal_error("the reward of an empty sequence");
  return {tokens.begin(), tokens.end()};
}

}  // namespace

float sequence_reward(model::LlamaModel& model, std::span<const std::int32_t> tokens,
                      std::int32_t pad_id) {
  const std::vector<std::int32_t> sequence = copy_of(tokens);
  const auto length = static_cast<std::int64_t>(sequence.size());
  model::BatchBuilder builder(1, length, pad_id);
  const std::int64_t last = builder.add(sequence, std::vector<std::uint8_t>(sequence.size(), 0));
  model::Batch batch = builder.finish();
  // One sequence as both sides of a pair: one forward pass, the score read at its last token.
  batch.chosen_last = {static_cast<std::int32_t>(last)};
  batch.rejected_last = batch.chosen_last;
  batch.margins = {0.0F};
  return BradleyTerryLoss(model).forward(batch, 0.0).chosen.at(0);
}

PairRewards pair_rewards(model::LlamaModel& model, std::span<const std::int32_t> chosen,
                         std::span<const std::int32_t> rejected, std::int32_t pad_id) {
  const std::vector<std::int32_t> c = copy_of(chosen);
  const std::vector<std::int32_t> r = copy_of(rejected);
  // Two rows as long as the longer side: each side starts a row of its own.
  const auto length = static_cast<std::int64_t>(std::max(c.size(), r.size()));
  model::BatchBuilder builder(2, length, pad_id);
  builder.add_pair(c, r);
  const RewardOutput out = BradleyTerryLoss(model).forward(builder.finish(), 0.0);
  return {out.chosen.at(0), out.rejected.at(0)};
}

void score_nothing(model::LlamaModel& model) {
  (void)BradleyTerryLoss(model).forward(model::Batch::none(1), 0.0);
}

}  // namespace l3::train
