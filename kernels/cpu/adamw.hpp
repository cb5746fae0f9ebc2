// AdamW exactly as torch.optim.AdamW (decoupled weight decay, bias correction):
//   p *= 1 - lr * wd
//   m += (1 - b1) (g - m);  v = b2 v + (1 - b2) g^2           with g = grad * grad_scale
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once

#include <span>

#include "kernels/ops.hpp"

namespace l3::kernels::cpu {

void adamw(std::span<float> params, std::span<const float> grads, std::span<float> m,
           std::span<float> v, const AdamWParams& hyper);

}  // namespace l3::kernels::cpu
