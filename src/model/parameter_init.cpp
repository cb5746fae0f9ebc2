#include "model/parameter_init.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace l3::model {

void initialize_parameters(std::span<float> params, const ParameterLayout& layout,
                           std::uint64_t seed) {
  if (static_cast<std::int64_t>(params.size()) != layout.total()) {
    throw core::internal_error("initialize_parameters: buffer size differs from the layout");
  }
  std::fill(params.begin(), params.end(), 0.0F);
  const std::vector<TensorInfo>& tensors = layout.tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    const std::span<float> values =
        params.subspan(static_cast<std::size_t>(t.offset), static_cast<std::size_t>(t.numel));
    if (t.shape.size() == 1) {  // RMSNorm weights
      std::fill(values.begin(), values.end(), 1.0F);
      continue;
    }
    const float std = t.name == "score.weight"
                          ? 1.0F / static_cast<float>(layout.config().hidden_size + 1)
                          : kInitStd;
    core::fill_normal(
        values, 0.0F, std,
        core::CounterRng(seed, core::RngPurpose::parameter_init, static_cast<std::uint32_t>(i)));
  }
}

}  // namespace l3::model
