// LoRA adapters folded into a model's weights on the host, as PEFT's merge_and_unload does: each
// adapted W (out, in) += scale * B A, and a reward model's score head replaced by the trained one
// of the adapter layout. The merged model needs no adapters to compute what the adapter model
// computes (without dropout), to within fp32 rounding.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/parameter_layout.hpp"

namespace l3::model {

// One weight of a model's layout that carries an adapter, and where its A (r, in) and B (out, r)
// are in the adapter layout.
struct AdaptedWeight {
  std::int64_t weight = 0;  // offset of W (out, in) in the model's layout
  std::int64_t a = 0;       // offsets in the adapter layout
  std::int64_t b = 0;
  std::int64_t out = 0;
  std::int64_t in = 0;
};

// Every adapted weight, in layout order. An internal Error unless `adapter_layout` is an adapter
// layout of the model of `layout` (same shapes and head; `layout` a model's layout).
[[nodiscard]] std::vector<AdaptedWeight> adapted_weights(const ParameterLayout& layout,
                                                         const ParameterLayout& adapter_layout);

// w (out, in) += scale * B A for one adapted weight; `adapters` laid out by the adapter layout.
void add_adapter_product(std::span<float> w, const AdaptedWeight& adapted,
                         std::span<const float> adapters, std::int64_t rank, float scale);

// The same for elements [first, first + out.size()) of W only (row-major): a rank's share.
void add_adapter_product_range(std::span<float> out, const AdaptedWeight& adapted,
                               std::span<const float> adapters, std::int64_t rank, float scale,
                               std::int64_t first);

// weights: laid out by `layout`, fp32; adapters: laid out by `adapter_layout`, an adapter layout
// of the same model config and head (an internal Error otherwise).
void merge_adapters(std::span<float> weights, const ParameterLayout& layout,
                    std::span<const float> adapters, const ParameterLayout& adapter_layout);

}  // namespace l3::model
