#include "model/lora_merge.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "core/error.hpp"
#include "kernels/cpu/matmul.hpp"

namespace l3::model {

std::vector<AdaptedWeight> adapted_weights(const ParameterLayout& layout,
                                           const ParameterLayout& adapter_layout) {
  const ModelConfig& x = layout.config();
  const ModelConfig& y = adapter_layout.config();
  const bool same_shapes = x.hidden_size == y.hidden_size &&
                           x.intermediate_size == y.intermediate_size && x.n_layers == y.n_layers &&
                           x.q_size() == y.q_size() && x.kv_size() == y.kv_size();
  if (!adapter_layout.adapters() || layout.adapters() || layout.head() != adapter_layout.head() ||
      !same_shapes) {
    throw core::internal_error("adapted_weights: the adapters are not of this model's layout");
  }
  std::vector<AdaptedWeight> adapted;
  for (int l = 0; l < x.n_layers; ++l) {
    const BlockOffsets& w = layout.block(l);
    const std::array<std::int64_t, kLoraTargetCount> base{
        w.q_proj, w.k_proj, w.v_proj, w.o_proj, w.gate_proj, w.up_proj, w.down_proj};
    const AdapterOffsets& o = adapter_layout.adapter(l);
    for (const LoraTarget t : kLoraTargets) {
      const auto k = static_cast<std::size_t>(t);
      if (o.a[k] < 0) continue;
      const auto [out, in] = lora_target_shape(x, t);
      adapted.push_back({.weight = base[k], .a = o.a[k], .b = o.b[k], .out = out, .in = in});
    }
  }
  return adapted;
}

void add_adapter_product(std::span<float> w, const AdaptedWeight& adapted,
                         std::span<const float> adapters, std::int64_t rank, float scale) {
  if (static_cast<std::int64_t>(w.size()) != adapted.out * adapted.in)
    throw core::internal_error("add_adapter_product: the weight has another shape");
  // One code path for whole weights and shares, so that both round alike.
  add_adapter_product_range(w, adapted, adapters, rank, scale, 0);
}

void add_adapter_product_range(std::span<float> out, const AdaptedWeight& adapted,
                               std::span<const float> adapters, std::int64_t rank, float scale,
                               std::int64_t first) {
  const std::int64_t in = adapted.in;
  const auto count = static_cast<std::int64_t>(out.size());
  if (first < 0 || first + count > adapted.out * in)
    throw core::internal_error("add_adapter_product_range: the range is outside the weight");
  if (count == 0) return;
  const std::span<const float> a =
      adapters.subspan(static_cast<std::size_t>(adapted.a), static_cast<std::size_t>(rank * in));
  // Rows of W at most this many at a time: the delta block stays small whatever the share.
  constexpr std::int64_t kRows = 256;
  std::vector<float> scaled_bt;  // scale * B[rows]^T (r, rows)
  std::vector<float> block;      // scale * B[rows] A (rows, in)
  const std::int64_t last_row = (first + count - 1) / in;
  for (std::int64_t r0 = first / in; r0 <= last_row; r0 += kRows) {
    const std::int64_t rows = std::min(kRows, last_row + 1 - r0);
    scaled_bt.assign(static_cast<std::size_t>(rank * rows), 0.0F);
    for (std::int64_t i = 0; i < rows; ++i) {
      for (std::int64_t j = 0; j < rank; ++j) {
        scaled_bt[static_cast<std::size_t>(j * rows + i)] =
            scale * adapters[static_cast<std::size_t>(adapted.b + (r0 + i) * rank + j)];
      }
    }
    block.assign(static_cast<std::size_t>(rows * in), 0.0F);
    kernels::cpu::matmul_backward({}, block, scaled_bt, a, {}, rank, rows, in, false);
    // The block covers W's elements [r0 in, (r0 + rows) in); add what lies in the range.
    const std::int64_t lo = std::max(first, r0 * in);
    const std::int64_t hi = std::min(first + count, (r0 + rows) * in);
    for (std::int64_t e = lo; e < hi; ++e)
      out[static_cast<std::size_t>(e - first)] += block[static_cast<std::size_t>(e - r0 * in)];
  }
}

AdapterFold::AdapterFold(const ParameterLayout& layout, ParameterLayout adapter_layout,
                         std::vector<float> adapters)
    : adapter_layout_(std::move(adapter_layout)), adapters_(std::move(adapters)) {
  if (static_cast<std::int64_t>(adapters_.size()) != adapter_layout_.total())
    throw core::internal_error("AdapterFold: the values are not of the adapter layout");
  for (const AdaptedWeight& w : adapted_weights(layout, adapter_layout_))
    adapted_.emplace(w.weight, w);
  if (layout.head() == HeadKind::reward) score_ = layout.score();
}

void AdapterFold::apply(const TensorInfo& t, std::int64_t first, std::span<float> out) const {
  if (t.offset == score_) {
    const std::span<const float> score = std::span(adapters_).subspan(
        static_cast<std::size_t>(adapter_layout_.score() + first), out.size());
    std::copy(score.begin(), score.end(), out.begin());
    return;
  }
  if (const auto found = adapted_.find(t.offset); found != adapted_.end()) {
    const LoraConfig& lora = adapter_layout_.lora();
    add_adapter_product_range(out, found->second, adapters_, lora.rank, lora.scale(), first);
  }
}

void merge_adapters(std::span<float> weights, const ParameterLayout& layout,
                    std::span<const float> adapters, const ParameterLayout& adapter_layout) {
  if (static_cast<std::int64_t>(weights.size()) != layout.total() ||
      static_cast<std::int64_t>(adapters.size()) != adapter_layout.total()) {
    throw core::internal_error("merge_adapters: the buffers are not of these layouts");
  }
  const AdapterFold fold(layout, adapter_layout, {adapters.begin(), adapters.end()});
  for (const TensorInfo& t : layout.tensors()) {
    fold.apply(
        t, 0,
        weights.subspan(static_cast<std::size_t>(t.offset), static_cast<std::size_t>(t.numel)));
  }
}

}  // namespace l3::model
