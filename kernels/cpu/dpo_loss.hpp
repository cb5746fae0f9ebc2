// Direct preference optimisation (DPO, Rafailov et al. 2023; as TRL's DPOTrainer) from the
// counted rows' cross-entropies: each sequence's log-probability is minus the sum of its rows'
// losses, and a pair's loss compares the policy's log-ratio of chosen over rejected with the
// reference model's (kernels/ops.hpp, DpoLossArgs, has the formulas).
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

// A sequence's counted rows [begin, end) in the list of counted rows.
struct RowRange {
  std::int32_t begin = 0;
  std::int32_t end = 0;
};

// logps[s] = -(sum of row_loss over ranges[s]), added in row order in fp64; divided by the row
// count when `mean` (0 for an empty range).
void sequence_log_probs(std::span<double> logps, std::span<const float> row_loss,
                        std::span<const RowRange> ranges, bool mean);

enum class DpoKind : std::uint8_t { sigmoid, ipo };

struct DpoStats {
  double loss = 0.0;         // sum over pairs
  std::int64_t correct = 0;  // pairs whose chosen reward is strictly the higher
  double margin = 0.0;       // sum of chosen reward - rejected reward
  double chosen = 0.0;       // sum of chosen rewards
};

// Pairs P = reference.size() / 2; ranges (2P): the chosen sequences, then the rejected ones.
// With d_rows (row_loss.size()) non-empty, d_rows = grad_scale * d(summed loss)/d(row_loss),
// rows of no sequence 0.
DpoStats dpo_loss(std::span<const float> row_loss, std::span<const RowRange> ranges,
                  std::span<const double> reference, double beta, double label_smoothing,
                  DpoKind kind, float grad_scale, std::span<float> d_rows);

}  // namespace l3::kernels::cpu
