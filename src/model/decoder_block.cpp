#include "model/decoder_block.hpp"

namespace l3::model {

BlockWeights block_weights(const ParameterLayout& layout, kernels::TensorView parameters,
                           int layer) {
  const ModelConfig& c = layout.config();
  const BlockOffsets& o = layout.block(layer);
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  return {.input_norm = parameters.slice(o.input_norm, h),
          .q_proj = parameters.slice(o.q_proj, q * h),
          .k_proj = parameters.slice(o.k_proj, kv * h),
          .v_proj = parameters.slice(o.v_proj, kv * h),
          .o_proj = parameters.slice(o.o_proj, h * q),
          .post_attention_norm = parameters.slice(o.post_attention_norm, h),
          .gate_proj = parameters.slice(o.gate_proj, i * h),
          .up_proj = parameters.slice(o.up_proj, i * h),
          .down_proj = parameters.slice(o.down_proj, h * i)};
}

void decoder_block_forward(kernels::Ops& ops, const ModelConfig& c, const BlockWeights& w,
                           const RopeViews& rope, std::int64_t n, kernels::TensorView x_in,
                           kernels::TensorView x_out, const BlockViews& a,
                           const std::function<void()>& attend) {
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // attention half: h = x + o_proj(attn(rope(q), rope(k), v)), q/k/v from rmsnorm(x)
  ops.rmsnorm(a.ln1, a.rstd1, x_in, w.input_norm, n, h, eps);
  ops.matmul(a.q, a.ln1, w.q_proj, n, q, h, false);
  ops.matmul(a.k, a.ln1, w.k_proj, n, kv, h, false);
  ops.matmul(a.v, a.ln1, w.v_proj, n, kv, h, false);
  ops.rope(a.q, rope.positions, rope.cos, rope.sin, n, c.n_heads, c.head_dim);
  ops.rope(a.k, rope.positions, rope.cos, rope.sin, n, c.n_kv_heads, c.head_dim);
  attend();
  ops.copy(a.h, x_in);  // the residual, then += o_proj(att)
  ops.matmul(a.h, a.att, w.o_proj, n, h, q, true);

  // MLP half: x' = h + down(silu(gate(m)) * up(m)), m = rmsnorm(h)
  ops.rmsnorm(a.ln2, a.rstd2, a.h, w.post_attention_norm, n, h, eps);
  ops.matmul(a.gate, a.ln2, w.gate_proj, n, i, h, false);
  ops.matmul(a.up, a.ln2, w.up_proj, n, i, h, false);
  ops.swiglu(a.act, a.gate, a.up, n * i);
  ops.copy(x_out, a.h);
  ops.matmul(x_out, a.act, w.down_proj, n, h, i, true);
}

}  // namespace l3::model
