// The whole Llama model in fp64, composed from the reference ops: the oracle for whole-model
// gradient checks (its finite differences against the fp32 model's backward).
#pragma once

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

}  // namespace l3::test::reference
