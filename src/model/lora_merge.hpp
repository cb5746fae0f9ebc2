// LoRA adapters folded into a model's weights on the host, as PEFT's merge_and_unload does: each
// adapted W (out, in) += scale * B A, and a reward model's score head replaced by the trained one
// of the adapter layout. The merged model needs no adapters to compute what the adapter model
// computes (without dropout), to within fp32 rounding.
#pragma once

#include <span>

#include "model/parameter_layout.hpp"

namespace l3::model {

// weights: laid out by `layout`, fp32; adapters: laid out by `adapter_layout`, an adapter layout
// of the same model config and head (an internal Error otherwise).
void merge_adapters(std::span<float> weights, const ParameterLayout& layout,
                    std::span<const float> adapters, const ParameterLayout& adapter_layout);

}  // namespace l3::model
