#include "model/lora_merge.hpp"

#include <algorithm>
#include <array>

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
  const std::int64_t out = adapted.out;
  const std::int64_t in = adapted.in;
  if (static_cast<std::int64_t>(w.size()) != out * in)
    throw core::internal_error("add_adapter_product: the weight has another shape");
  const std::span<const float> a =
      adapters.subspan(static_cast<std::size_t>(adapted.a), static_cast<std::size_t>(rank * in));
  const std::span<const float> b =
      adapters.subspan(static_cast<std::size_t>(adapted.b), static_cast<std::size_t>(out * rank));
  std::vector<float> scaled_bt(static_cast<std::size_t>(rank * out));  // scale * B^T (r, out)
  for (std::int64_t i = 0; i < out; ++i) {
    for (std::int64_t j = 0; j < rank; ++j) {
      scaled_bt[static_cast<std::size_t>(j * out + i)] =
          scale * b[static_cast<std::size_t>(i * rank + j)];
    }
  }
  // W (out, in) += (scale B^T)^T A: matmul_backward's dw += dy^T x with dy = scale B^T.
  kernels::cpu::matmul_backward({}, w, scaled_bt, a, {}, rank, out, in, false);
}

void merge_adapters(std::span<float> weights, const ParameterLayout& layout,
                    std::span<const float> adapters, const ParameterLayout& adapter_layout) {
  if (static_cast<std::int64_t>(weights.size()) != layout.total() ||
      static_cast<std::int64_t>(adapters.size()) != adapter_layout.total()) {
    throw core::internal_error("merge_adapters: the buffers are not of these layouts");
  }
  const LoraConfig& lora = adapter_layout.lora();
  for (const AdaptedWeight& w : adapted_weights(layout, adapter_layout)) {
    add_adapter_product(
        weights.subspan(static_cast<std::size_t>(w.weight), static_cast<std::size_t>(w.out * w.in)),
        w, adapters, lora.rank, lora.scale());
  }
  if (layout.head() == HeadKind::reward) {
    const auto h = static_cast<std::size_t>(layout.config().hidden_size);
    const std::span<const float> score =
        adapters.subspan(static_cast<std::size_t>(adapter_layout.score()), h);
    std::copy(score.begin(), score.end(),
              weights.begin() + static_cast<std::ptrdiff_t>(layout.score()));
  }
}

}  // namespace l3::model
