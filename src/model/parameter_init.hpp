// Initial parameters, reproducible from the seed alone: weights ~ normal(0, 0.02) (Hugging
// Face's initializer_range), norms = 1, the reward score head ~ normal(0, 1/(hidden + 1)); in an
// adapter layout, LoRA's A ~ uniform(-1/sqrt(in), 1/sqrt(in)) (PEFT's kaiming_uniform_ with
// a = sqrt(5)) and B = 0.
// Tensor i draws from CounterRng(seed, purpose, stream i), element j from index j, so any slice
// can be initialised independently (ZeRO shards, device chunks). The purpose is parameter_init
// for a model's layout, adapter_init for an adapter layout (whose tensor i must not draw the
// model's tensor i's numbers).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/rng.hpp"
#include "model/parameter_layout.hpp"

namespace l3::model {

inline constexpr float kInitStd = 0.02F;

// params: the flat buffer (layout.total()), host fp32; padding is set to 0.
void initialize_parameters(std::span<float> params, const ParameterLayout& layout,
                           std::uint64_t seed,
                           core::RngPurpose purpose = core::RngPurpose::parameter_init);

// The same values at the layout positions `ranges` only (ascending, disjoint), back to back in
// `values`: a rank initialises its share without the rest.
void initialize_parameter_ranges(std::span<float> values, const ParameterLayout& layout,
                                 std::uint64_t seed, const std::vector<FlatRange>& ranges,
                                 core::RngPurpose purpose = core::RngPurpose::parameter_init);

}  // namespace l3::model
