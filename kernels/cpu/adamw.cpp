#include "kernels/cpu/adamw.hpp"

#include <cmath>

#include "kernels/cpu/checks.hpp"

namespace l3::kernels::cpu {

void adamw(std::span<float> params, std::span<const float> grads, std::span<float> m,
           std::span<float> v, const AdamWParams& hyper) {
  const auto n = static_cast<std::int64_t>(params.size());
  require_size(grads.size(), n, "adamw", "grads");
  require_size(m.size(), n, "adamw", "m");
  require_size(v.size(), n, "adamw", "v");
  const auto t = static_cast<double>(hyper.step);
  const auto bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hyper.beta1), t));
  const auto bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(hyper.beta2), t)));
  const float step_size = hyper.lr / bias1;
  const float decay = 1.0F - hyper.lr * hyper.weight_decay;
  const float b1 = hyper.beta1;
  const float b2 = hyper.beta2;
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const auto j = static_cast<std::size_t>(i);
    const float g = grads[j] * hyper.grad_scale;
    m[j] += (1.0F - b1) * (g - m[j]);  // torch: exp_avg.lerp_(grad, 1 - beta1)
    v[j] = b2 * v[j] + (1.0F - b2) * g * g;
    const float denom = std::sqrt(v[j]) / bias2_sqrt + hyper.eps;
    params[j] = params[j] * decay - step_size * m[j] / denom;
  }
}

}  // namespace l3::kernels::cpu
