// Smoothing of noisy training curves (a step's loss jumps with its batch): the exponential
// moving average TensorBoard draws, so that a curve reads the same here as there.
#pragma once

#include <span>
#include <vector>

namespace l3::report {

// TensorBoard's default smoothing weight.
inline constexpr double kDefaultSmoothing = 0.6;

// The debiased exponential moving average of `values` with weight `smoothing` in [0, 1):
// s_i = (w s_{i-1} + (1 - w) v_i) / (1 - w^n), n the finite values so far. Without the
// debiasing the average would start at 0 and creep up; with it, the first smoothed value is the
// first value and a constant stays that constant. A NaN (a skipped step: a gap) stays NaN and
// leaves the average as it was, as TensorBoard does with non-finite values.
[[nodiscard]] std::vector<double> smooth_ema(std::span<const double> values,
                                             double smoothing = kDefaultSmoothing);

}  // namespace l3::report
