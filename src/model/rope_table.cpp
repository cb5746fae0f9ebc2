#include "model/rope_table.hpp"

#include <cmath>
#include <numbers>

namespace l3::model {

std::vector<float> rope_inverse_frequencies(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  const auto dim = static_cast<float>(config.head_dim);
  const auto base = static_cast<float>(config.rope_theta);
  std::vector<float> inv_freq(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i) {
    // torch: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all in float32
    const float exponent = static_cast<float>(2 * i) / dim;
    inv_freq[static_cast<std::size_t>(i)] = 1.0F / std::pow(base, exponent);
  }
  if (!config.rope_scaling.enabled) return inv_freq;

  const RopeScaling& s = config.rope_scaling;
  const auto factor = static_cast<float>(s.factor);
  const auto low = static_cast<float>(s.low_freq_factor);
  const auto high = static_cast<float>(s.high_freq_factor);
  const auto old_context = static_cast<float>(s.original_max_position_embeddings);
  const float low_freq_wavelen = old_context / low;
  const float high_freq_wavelen = old_context / high;
  for (float& f : inv_freq) {
    const float wavelen = 2.0F * std::numbers::pi_v<float> / f;
    // long wavelengths (low frequencies) are slowed down by `factor`
    const float scaled = wavelen > low_freq_wavelen ? f / factor : f;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth = (old_context / wavelen - low) / (high - low);
      f = (1.0F - smooth) * scaled / factor + smooth * scaled;
    } else {
      f = scaled;
    }
  }
  return inv_freq;
}

RopeTable make_rope_table(const ModelConfig& config, std::int64_t positions) {
  const std::vector<float> inv_freq = rope_inverse_frequencies(config);
  RopeTable table;
  table.positions = positions;
  table.half = config.head_dim / 2;
  const auto size = static_cast<std::size_t>(positions * table.half);
  table.cos.resize(size);
  table.sin.resize(size);
  for (std::int64_t p = 0; p < positions; ++p) {
    for (int i = 0; i < table.half; ++i) {
      // torch: freqs = inv_freq @ position (float32), then cos/sin of the float32 angle
      const float angle = static_cast<float>(p) * inv_freq[static_cast<std::size_t>(i)];
      const auto j = static_cast<std::size_t>(p * table.half + i);
      table.cos[j] = std::cos(angle);
      table.sin[j] = std::sin(angle);
    }
  }
  return table;
}

void RopeBuffers::ensure(kernels::Ops& ops, const ModelConfig& config, std::int64_t positions) {
  if (positions <= positions_) return;
  const RopeTable table = make_rope_table(config, positions);
  const kernels::Shape shape{table.positions, table.half};
  cos_ = kernels::allocate(ops, kernels::DType::f32, shape);
  sin_ = kernels::allocate(ops, kernels::DType::f32, shape);
  ops.copy(cos_.view(), kernels::ConstTensorView(std::span<const float>(table.cos)));
  ops.copy(sin_.view(), kernels::ConstTensorView(std::span<const float>(table.sin)));
  positions_ = positions;
}

}  // namespace l3::model
