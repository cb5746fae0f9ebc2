// GRPO's advantages from a step's rewards, as TRL's GRPOTrainer computes them, and RLOO's
// leave-one-out form. The rewards are those of the whole step (every rank's, in the global order
// of prompts), so that every rank computes the same values whatever the number of ranks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "train/grpo_settings.hpp"

namespace l3::train::grpo {

// The epsilon TRL adds to the standard deviation before dividing by it.
inline constexpr double kStdEpsilon = 1e-4;

struct Advantages {
  std::vector<double> values;     // one per completion
  std::vector<double> group_std;  // per group: its rewards' unbiased standard deviation
  double batch_std = 0.0;         // every reward's (unbiased)
  // Groups whose rewards are all equal (std ~ 0: no signal), as a fraction of the groups (batch
  // scaling: 1 when the whole batch's are, else 0; TRL's frac_reward_zero_std).
  double frac_zero_std = 0.0;
};

// rewards: groups of `group` consecutive completions (one prompt's). A completion's advantage is
//   grpo: r - mean(group);  rloo: r - mean(the group's other completions) = G/(G-1) (r - mean)
// divided, per `scaling`, by (its group's std + 1e-4), by (the batch's std + 1e-4), or by 1.
// Standard deviations are unbiased (Bessel's correction, as torch.std); a group of one has 0.
[[nodiscard]] Advantages compute_advantages(std::span<const double> rewards, std::int64_t group,
                                            AdvantageEstimator estimator, RewardScaling scaling);

// The unbiased standard deviation of `values` (0 for fewer than two).
[[nodiscard]] double unbiased_std(std::span<const double> values);

}  // namespace l3::train::grpo
