#include "train/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace l3::train {

double LrSchedule::at(std::int64_t step) const {
  if (step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const std::int64_t decay_steps = std::max<std::int64_t>(1, total - warmup - 1);
  const double progress =
      std::clamp(static_cast<double>(step - warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace l3::train
