// DPO's loss settings (kernels::DpoLossArgs has the formulas): beta, label smoothing
// (conservative DPO) and the loss (sigmoid, or IPO).
#pragma once

#include "kernels/ops.hpp"

namespace l3::model {

struct DpoSettings {
  double beta = 0.1;
  double label_smoothing = 0.0;
  kernels::PreferenceLoss loss = kernels::PreferenceLoss::sigmoid;
};

}  // namespace l3::model
