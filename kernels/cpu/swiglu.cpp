#include "kernels/cpu/swiglu.hpp"

#include <cmath>

#include "kernels/cpu/checks.hpp"

namespace l3::kernels::cpu {

void swiglu(std::span<float> out, std::span<const float> gate, std::span<const float> up) {
  const auto n = static_cast<std::int64_t>(out.size());
  require_size(gate.size(), n, "swiglu", "gate");
  require_size(up.size(), n, "swiglu", "up");
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[static_cast<std::size_t>(i)];
    out[static_cast<std::size_t>(i)] = g / (1.0F + std::exp(-g)) * up[static_cast<std::size_t>(i)];
  }
}

void swiglu_backward(std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                     std::span<const float> gate, std::span<const float> up) {
  const auto n = static_cast<std::int64_t>(dout.size());
  require_size(dgate.size(), n, "swiglu_backward", "dgate");
  require_size(dup.size(), n, "swiglu_backward", "dup");
  require_size(gate.size(), n, "swiglu_backward", "gate");
  require_size(up.size(), n, "swiglu_backward", "up");
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) {
    const auto j = static_cast<std::size_t>(i);
    const float g = gate[j];
    const float sig = 1.0F / (1.0F + std::exp(-g));
    const float silu = g * sig;
    dgate[j] = dout[j] * up[j] * sig * (1.0F + g * (1.0F - sig));
    dup[j] = dout[j] * silu;
  }
}

}  // namespace l3::kernels::cpu
