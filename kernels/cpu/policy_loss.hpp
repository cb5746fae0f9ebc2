// The clipped policy-gradient loss of GRPO and its variants (Shao et al. 2024; as TRL's
// GRPOTrainer._compute_loss, per token) from the counted rows' cross-entropies, with the k3
// estimate of the KL divergence to a reference model (kernels/ops.hpp, PolicyLossArgs, has the
// formulas).
#pragma once

#include <cstdint>
#include <limits>
#include <span>

#include "kernels/ops.hpp"

namespace l3::kernels::cpu {

// Per counted row (C each); every array but row_loss, advantages and weights may be empty.
struct PolicyRows {
  std::span<const float> row_loss{};       // -log p of each row's token under the policy
  std::span<const float> advantages{};     // A_c
  std::span<const float> weights{};        // each row's weight in the summed loss
  std::span<const float> old_logps{};      // empty: the policy's own, detached (ratio 1)
  std::span<const float> ref_row_loss{};   // -log p under the reference; empty: no KL term
  std::span<const float> sampled_logps{};  // the generator's, for `largest`
  std::span<const float> row_entropy{};    // summed into `entropy`
  // (S + 1): completion k's rows are [starts[k], starts[k+1]); needed by sequence_* modes.
  std::span<const std::int32_t> completion_starts{};
};

struct PolicyParams {
  double epsilon_low = 0.2;
  double epsilon_high = 0.2;
  double beta = 0.0;
  ImportanceSampling importance_sampling = ImportanceSampling::off;
  double clip_min = 0.0;
  double clip_max = std::numeric_limits<double>::infinity();
  float grad_scale = 1.0F;
};

struct PolicyStats {
  double loss = 0.0;      // sum of L_c
  double kl = 0.0;        // sum of kl_c
  std::int64_t low = 0;   // rows clipped below (ratio < 1 - epsilon_low, A < 0)
  std::int64_t high = 0;  // rows clipped above (ratio > 1 + epsilon_high, A > 0)
  double entropy = 0.0;   // sum of row_entropy
  double largest = 0.0;   // max |logp_c - sampled_logps[c]| (0 without sampled_logps)
  // Importance sampling (0 when off), over its units (completions or rows): the sum of rho,
  // the units, the rows whose raw ratio was outside the bounds, the largest and smallest rho
  // (+inf without units).
  double ratio_sum = 0.0;
  std::int64_t ratio_units = 0;
  std::int64_t rejected = 0;
  double ratio_max = 0.0;
  double ratio_min = std::numeric_limits<double>::infinity();
};

// Sums in row order in fp64. With d_rows (C) non-empty, d_rows[c] = grad_scale * dL_c/d
// row_loss[c].
PolicyStats policy_loss(const PolicyRows& rows, const PolicyParams& params,
                        std::span<float> d_rows);

}  // namespace l3::kernels::cpu
