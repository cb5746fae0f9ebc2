#include "model/lora_merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <vector>

#include "core/error.hpp"
#include "kernels/cpu/matmul.hpp"

namespace l3::model {

void merge_adapters(std::span<float> weights, const ParameterLayout& layout,
                    std::span<const float> adapters, const ParameterLayout& adapter_layout) {
  const ModelConfig& x = layout.config();
  const ModelConfig& y = adapter_layout.config();
  const bool same_shapes = x.hidden_size == y.hidden_size &&
                           x.intermediate_size == y.intermediate_size && x.n_layers == y.n_layers &&
                           x.q_size() == y.q_size() && x.kv_size() == y.kv_size();
  if (!adapter_layout.adapters() || layout.adapters() || layout.head() != adapter_layout.head() ||
      !same_shapes || static_cast<std::int64_t>(weights.size()) != layout.total() ||
      static_cast<std::int64_t>(adapters.size()) != adapter_layout.total()) {
    throw core::internal_error("merge_adapters: the adapters are not of this model's layout");
  }
  const ModelConfig& c = layout.config();
  const LoraConfig& lora = adapter_layout.lora();
  const float scale = lora.scale();
  const std::int64_t r = lora.rank;
  std::vector<float> scaled_bt;  // scale * B^T (r, out)
  for (int l = 0; l < c.n_layers; ++l) {
    const BlockOffsets& w = layout.block(l);
    const std::array<std::int64_t, kLoraTargetCount> base{
        w.q_proj, w.k_proj, w.v_proj, w.o_proj, w.gate_proj, w.up_proj, w.down_proj};
    const AdapterOffsets& o = adapter_layout.adapter(l);
    for (const LoraTarget t : kLoraTargets) {
      const auto k = static_cast<std::size_t>(t);
      if (o.a[k] < 0) continue;
      const auto [out, in] = lora_target_shape(c, t);
      const std::span<const float> a =
          adapters.subspan(static_cast<std::size_t>(o.a[k]), static_cast<std::size_t>(r * in));
      const std::span<const float> b =
          adapters.subspan(static_cast<std::size_t>(o.b[k]), static_cast<std::size_t>(out * r));
      scaled_bt.assign(static_cast<std::size_t>(r * out), 0.0F);
      for (std::int64_t i = 0; i < out; ++i) {
        for (std::int64_t j = 0; j < r; ++j) {
          scaled_bt[static_cast<std::size_t>(j * out + i)] =
              scale * b[static_cast<std::size_t>(i * r + j)];
        }
      }
      // W (out, in) += (scale B^T)^T A: matmul_backward's dw += dy^T x with dy = scale B^T.
      kernels::cpu::matmul_backward(
          {},
          weights.subspan(static_cast<std::size_t>(base[k]), static_cast<std::size_t>(out * in)),
          scaled_bt, a, {}, r, out, in, false);
    }
  }
  if (layout.head() == HeadKind::reward) {
    const auto h = static_cast<std::size_t>(c.hidden_size);
    const std::span<const float> score =
        adapters.subspan(static_cast<std::size_t>(adapter_layout.score()), h);
    std::copy(score.begin(), score.end(),
              weights.begin() + static_cast<std::ptrdiff_t>(layout.score()));
  }
}

}  // namespace l3::model
