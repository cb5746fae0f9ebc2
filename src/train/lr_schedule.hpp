// Learning rate per step: linear warmup from lr/warmup to lr over `warmup` steps, then a cosine
// decay to min_lr at the last step. Step s is 0-based (the s-th optimizer update).
#pragma once

#include <cstdint>

namespace l3::train {

struct LrSchedule {
  double lr = 3e-4;
  double min_lr = 3e-5;  // the CLI's default: 0.1 x lr (so --lr 0 leaves weights untouched)
  std::int64_t warmup = 0;
  std::int64_t total = 1;

  [[nodiscard]] double at(std::int64_t step) const;
};

}  // namespace l3::train
