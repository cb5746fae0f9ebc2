// Rewards of whole sequences with a reward-head model: the score head read at each sequence's
// last token, exactly where reward training reads it (BradleyTerryLoss).
#pragma once

#include <cstdint>
#include <span>

#include "model/llama_model.hpp"

namespace l3::train {

struct PairRewards {
  float chosen = 0.0F;
  float rejected = 0.0F;
};

// The reward of one sequence (not empty). pad_id fills no position here but keeps the batch
// well-formed; an over-long sequence is the model's usage Error.
[[nodiscard]] float sequence_reward(model::LlamaModel& model, std::span<const std::int32_t> tokens,
                                    std::int32_t pad_id);

// The rewards of the two sides of a preference pair, in one forward pass.
[[nodiscard]] PairRewards pair_rewards(model::LlamaModel& model,
                                       std::span<const std::int32_t> chosen,
                                       std::span<const std::int32_t> rejected, std::int32_t pad_id);

// A scoring pass of no rows: the parameter-window calls a scoring pass makes, for a rank that
// takes part in another rank's gathers (sharded parameters) without a sequence of its own.
void score_nothing(model::LlamaModel& model);

}  // namespace l3::train
