#include "kernels/cpu/dropout.hpp"

#include "kernels/cpu/checks.hpp"
#include "kernels/dropout_mask.hpp"

namespace l3::kernels::cpu {

void dropout(std::span<float> out, std::span<const float> x, float p, float scale,
             std::uint64_t seed) {
  const auto n = static_cast<std::int64_t>(x.size());
  require_size(out.size(), n, "dropout", "out");
  float* o = out.data();
  const float* in = x.data();
  if (p == 0.0F) {
#pragma omp parallel for simd schedule(static) if (n > (std::int64_t{1} << 16))
    for (std::int64_t i = 0; i < n; ++i) o[i] = in[i] * scale;
    return;
  }
  const float kept_scale = scale / (1.0F - p);
  const std::uint32_t threshold = dropout_threshold(p);
#pragma omp parallel for schedule(static) if (n > (std::int64_t{1} << 14))
  for (std::int64_t i = 0; i < n; ++i) {
    o[i] = dropout_keep(seed, static_cast<std::uint64_t>(i), threshold) ? in[i] * kept_scale : 0.0F;
  }
}

}  // namespace l3::kernels::cpu
