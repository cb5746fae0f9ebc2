// The reward model's loss on preference pairs (Bradley-Terry, as TRL's RewardTrainer):
//   loss_p = -log sigmoid(r_chosen - r_rejected - margin_p) + center * (r_chosen + r_rejected)^2
// summed over pairs; the caller divides by the number of pairs in the global batch through
// grad_scale (and for the reported mean).
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

struct PreferenceStats {
  double loss = 0.0;  // sum over pairs
  std::int64_t pairs = 0;
  std::int64_t correct = 0;  // r_chosen > r_rejected strictly: ties count as wrong
  double margin = 0.0;       // sum over pairs of r_chosen - r_rejected
};

// d_chosen, d_rejected (may be empty for evaluation): grad_scale * d(loss)/d(score).
PreferenceStats bradley_terry(std::span<const float> chosen, std::span<const float> rejected,
                              std::span<const float> margins, double center_coefficient,
                              float grad_scale, std::span<float> d_chosen,
                              std::span<float> d_rejected);

}  // namespace l3::kernels::cpu
