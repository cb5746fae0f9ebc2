// The whole Llama model in fp64, composed from the reference ops: the oracle for whole-model
// gradient checks (its finite differences against the fp32 model's backward).
#pragma once

#include <array>
#include <cmath>

#include "kernels/cpu/bradley_terry.hpp"
#include "model/batch.hpp"
#include "model/parameter_layout.hpp"
#include "model/rope_table.hpp"
#include "reference_ops.hpp"

namespace l3::test::reference {

inline Vec slice(const Vec& p, std::int64_t offset, std::int64_t n) {
  return {p.begin() + offset, p.begin() + offset + n};
}

// The final normalised hidden states (N, H).
inline Vec backbone(const Vec& p, const model::ParameterLayout& layout, const model::Batch& b) {
  const model::ModelConfig& c = layout.config();
  const std::int64_t n = b.tokens_count();
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  const std::vector<float> inv_freq = model::rope_inverse_frequencies(c);
  Vec x(static_cast<std::size_t>(n * h));
  for (std::int64_t t = 0; t < n; ++t)
    for (std::int64_t j = 0; j < h; ++j)
      x[static_cast<std::size_t>(t * h + j)] = p[static_cast<std::size_t>(
          layout.embedding() + b.tokens[static_cast<std::size_t>(t)] * h + j)];
  for (int l = 0; l < c.n_layers; ++l) {
    const model::BlockOffsets& w = layout.block(l);
    const Vec n1 = rmsnorm(x, slice(p, w.input_norm, h), h, c.rms_norm_eps);
    const Vec qv = rope(matmul(n1, slice(p, w.q_proj, q * h), n, q, h), b.positions, inv_freq,
                        c.n_heads, c.head_dim);
    const Vec kvv = rope(matmul(n1, slice(p, w.k_proj, kv * h), n, kv, h), b.positions, inv_freq,
                         c.n_kv_heads, c.head_dim);
    const Vec vv = matmul(n1, slice(p, w.v_proj, kv * h), n, kv, h);
    const Vec att = attention(qv, kvv, vv, b.cu_seqlens, c.n_heads, c.n_kv_heads, c.head_dim);
    const Vec o = matmul(att, slice(p, w.o_proj, h * q), n, h, q);
    Vec hs(x.size());
    for (std::size_t j = 0; j < x.size(); ++j) hs[j] = x[j] + o[j];
    const Vec n2 = rmsnorm(hs, slice(p, w.post_attention_norm, h), h, c.rms_norm_eps);
    const Vec a = swiglu(matmul(n2, slice(p, w.gate_proj, i * h), n, i, h),
                         matmul(n2, slice(p, w.up_proj, i * h), n, i, h));
    const Vec d = matmul(a, slice(p, w.down_proj, h * i), n, h, i);
    for (std::size_t j = 0; j < x.size(); ++j) x[j] = hs[j] + d[j];
  }
  return rmsnorm(x, slice(p, layout.final_norm(), h), h, c.rms_norm_eps);
}

inline double sft_loss(const Vec& p, const model::ParameterLayout& layout, const model::Batch& b) {
  const model::ModelConfig& c = layout.config();
  return cross_entropy(backbone(p, layout, b),
                       slice(p, layout.lm_head(), c.vocab_size * c.hidden_size), b.targets,
                       b.loss_mask, c.vocab_size, c.hidden_size);
}

inline double reward_loss(const Vec& p, const model::ParameterLayout& layout, const model::Batch& b,
                          double center) {
  const std::int64_t h = layout.config().hidden_size;
  const Vec out = backbone(p, layout, b);
  auto score = [&](std::int32_t row) {
    double s = 0;
    for (std::int64_t j = 0; j < h; ++j)
      s += out[static_cast<std::size_t>(row * h + j)] *
           p[static_cast<std::size_t>(layout.score() + j)];
    return s;
  };
  double total = 0;
  for (std::size_t k = 0; k < b.chosen_last.size(); ++k) {
    const double c = score(b.chosen_last[k]);
    const double r = score(b.rejected_last[k]);
    const double z = c - r - b.margins[k];
    total += std::log1p(std::exp(-z)) + center * (c + r) * (c + r);
  }
  return total;
}

// Three random coordinates of every tensor of `layout` (for finite differences).
template <typename Random>
std::vector<std::size_t> sample_coordinates(const model::ParameterLayout& layout, Random& rnd) {
  std::vector<std::size_t> sample;
  sample.reserve(3 * layout.tensors().size());
  for (const auto& t : layout.tensors()) {
    for (int k = 0; k < 3; ++k) {
      sample.push_back(static_cast<std::size_t>(t.offset) +
                       static_cast<std::size_t>(rnd.uniform01() * static_cast<double>(t.numel)));
    }
  }
  return sample;
}

// The model's parameters (layout) with LoRA's adapters (an adapter layout) folded in, in fp64:
// W + scale * B A for each adapter, and a reward model's trained score head in place of the
// model's. With dropout off, the adapter model computes exactly this model.
inline Vec merge_adapters(const Vec& p, const model::ParameterLayout& layout, const Vec& adapters,
                          const model::ParameterLayout& adapter_layout) {
  const model::ModelConfig& c = layout.config();
  const model::LoraConfig& lora = adapter_layout.lora();
  const double scale = lora.rslora ? lora.alpha / std::sqrt(static_cast<double>(lora.rank))
                                   : lora.alpha / static_cast<double>(lora.rank);
  const std::int64_t r = lora.rank;
  Vec merged = p;
  for (int l = 0; l < c.n_layers; ++l) {
    const model::BlockOffsets& w = layout.block(l);
    const std::array<std::int64_t, model::kLoraTargetCount> base{
        w.q_proj, w.k_proj, w.v_proj, w.o_proj, w.gate_proj, w.up_proj, w.down_proj};
    const model::AdapterOffsets& o = adapter_layout.adapter(l);
    for (const model::LoraTarget t : model::kLoraTargets) {
      const auto k = static_cast<std::size_t>(t);
      if (o.a[k] < 0) continue;
      const auto [out, in] = model::lora_target_shape(c, t);
      for (std::int64_t i = 0; i < out; ++i) {
        for (std::int64_t j = 0; j < in; ++j) {
          double delta = 0.0;
          for (std::int64_t q = 0; q < r; ++q) {
            delta += adapters[static_cast<std::size_t>(o.b[k] + i * r + q)] *
                     adapters[static_cast<std::size_t>(o.a[k] + q * in + j)];
          }
          merged[static_cast<std::size_t>(base[k] + i * in + j)] += scale * delta;
        }
      }
    }
  }
  if (layout.head() == model::HeadKind::reward) {
    for (std::int64_t j = 0; j < c.hidden_size; ++j) {
      merged[static_cast<std::size_t>(layout.score() + j)] =
          adapters[static_cast<std::size_t>(adapter_layout.score() + j)];
    }
  }
  return merged;
}

}  // namespace l3::test::reference
