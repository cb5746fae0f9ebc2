#include "model/parameter_init.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace l3::model {

namespace {

// Elements [first, first + values.size()) of tensor i.
void initialize_tensor_part(std::span<float> values, const ParameterLayout& layout, std::size_t i,
                            std::int64_t first, std::uint64_t seed, core::RngPurpose purpose) {
  const TensorInfo& t = layout.tensors()[i];
  if (t.shape.size() == 1) {  // RMSNorm weights
    std::fill(values.begin(), values.end(), 1.0F);
    return;
  }
  const core::CounterRng rng(seed, purpose, static_cast<std::uint32_t>(i));
  if (t.name.ends_with("lora_B.weight")) {  // the adapter starts as no change at all
    std::fill(values.begin(), values.end(), 0.0F);
    return;
  }
  if (t.name.ends_with("lora_A.weight")) {  // (r, in): fan_in = in
    const auto bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(t.shape[1])));
    core::fill_uniform(values, -bound, bound, rng, static_cast<std::uint64_t>(first));
    return;
  }
  const float std = t.name == "score.weight"
                        ? 1.0F / static_cast<float>(layout.config().hidden_size + 1)
                        : kInitStd;
  core::fill_normal(values, 0.0F, std, rng, static_cast<std::uint64_t>(first));
}

}  // namespace

void initialize_parameters(std::span<float> params, const ParameterLayout& layout,
                           std::uint64_t seed, core::RngPurpose purpose) {
  if (static_cast<std::int64_t>(params.size()) != layout.total()) {
    throw core::internal_error("initialize_parameters: buffer size differs from the layout");
  }
  initialize_parameter_ranges(params, layout, seed, {{0, layout.total()}}, purpose);
}

void initialize_parameter_ranges(std::span<float> values, const ParameterLayout& layout,
                                 std::uint64_t seed, const std::vector<FlatRange>& ranges,
                                 core::RngPurpose purpose) {
  std::int64_t position = 0;
  for (const FlatRange& r : ranges) {
    if (position + r.size() > static_cast<std::int64_t>(values.size())) {
      throw core::internal_error("initialize_parameter_ranges: fewer values than the ranges");
    }
    const std::span<float> out =
        values.subspan(static_cast<std::size_t>(position), static_cast<std::size_t>(r.size()));
    std::fill(out.begin(), out.end(), 0.0F);  // padding
    const std::vector<TensorInfo>& tensors = layout.tensors();
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const std::int64_t lo = std::max(r.begin, tensors[i].offset);
      const std::int64_t hi = std::min(r.end, tensors[i].offset + tensors[i].numel);
      if (lo >= hi) continue;
      initialize_tensor_part(
          out.subspan(static_cast<std::size_t>(lo - r.begin), static_cast<std::size_t>(hi - lo)),
          layout, i, lo - tensors[i].offset, seed, purpose);
    }
    position += r.size();
  }
}

}  // namespace l3::model
