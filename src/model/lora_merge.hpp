// LoRA adapters folded into a model's weights on the host, as PEFT's merge_and_unload does: each
// adapted W (out, in) += scale * B A, and a reward model's score head replaced by the trained one
// of the adapter layout. The merged model needs no adapters to compute what the adapter model
// computes (without dropout), to within fp32 rounding.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
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

// What adapters change in a model's tensors, a tensor or a share of one at a time: an adapted
// weight gets scale B A added, a reward model's score head is replaced by the trained one,
// other tensors stay as they are. For who folds adapters into weights it streams or holds
// only a share of (export, sharded evaluation).
class AdapterFold {
 public:
  // `layout`: a model's layout; `adapter_layout`: an adapter layout of the same model and head
  // (an internal Error otherwise); `adapters`: its values.
  AdapterFold(const ParameterLayout& layout, ParameterLayout adapter_layout,
              std::vector<float> adapters);

  // Elements [first, first + out.size()) of `t`, a tensor of the model's layout.
  void apply(const TensorInfo& t, std::int64_t first, std::span<float> out) const;

  [[nodiscard]] const ParameterLayout& adapter_layout() const noexcept { return adapter_layout_; }
  [[nodiscard]] std::span<const float> adapters() const noexcept { return adapters_; }

 private:
  ParameterLayout adapter_layout_;
  std::vector<float> adapters_;
  std::unordered_map<std::int64_t, AdaptedWeight> adapted_;  // by the weight's offset
  std::int64_t score_ = -1;  // the model's score head (reward), else -1
};

// weights: laid out by `layout`, fp32; adapters: laid out by `adapter_layout`, an adapter layout
// of the same model config and head (an internal Error otherwise).
void merge_adapters(std::span<float> weights, const ParameterLayout& layout,
                    std::span<const float> adapters, const ParameterLayout& adapter_layout);

}  // namespace l3::model
