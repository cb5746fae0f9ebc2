#include "model/decoder_block.hpp"

namespace l3::model {

BlockWeights block_weights(const ParameterLayout& layout, int layer, const WeightLookup& weight) {
  const ModelConfig& c = layout.config();
  const BlockOffsets& o = layout.block(layer);
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  return {.input_norm = weight(o.input_norm, h),
          .q_proj = weight(o.q_proj, {q, h}),
          .k_proj = weight(o.k_proj, {kv, h}),
          .v_proj = weight(o.v_proj, {kv, h}),
          .o_proj = weight(o.o_proj, {h, q}),
          .post_attention_norm = weight(o.post_attention_norm, h),
          .gate_proj = weight(o.gate_proj, {i, h}),
          .up_proj = weight(o.up_proj, {i, h}),
          .down_proj = weight(o.down_proj, {h, i})};
}

void decoder_block_forward(kernels::Ops& ops, const ModelConfig& c, const BlockWeights& w,
                           const RopeViews& rope, kernels::ConstTensorView x_in,
                           kernels::TensorView x_out, const BlockViews& a,
                           const std::function<void()>& attend) {
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const auto rotate = [&](kernels::TensorView x) {
    ops.rope({.x = x, .positions = rope.positions, .cos = rope.cos, .sin = rope.sin});
  };

  // attention half: h = x + o_proj(attn(rope(q), rope(k), v)), q/k/v from rmsnorm(x)
  ops.rmsnorm({.out = a.ln1, .rstd = a.rstd1, .x = x_in, .w = w.input_norm, .eps = eps});
  ops.matmul({.y = a.q, .x = a.ln1, .w = w.q_proj});
  ops.matmul({.y = a.k, .x = a.ln1, .w = w.k_proj});
  ops.matmul({.y = a.v, .x = a.ln1, .w = w.v_proj});
  rotate(a.q);
  rotate(a.k);
  attend();
  ops.copy(a.h, x_in);  // the residual, then += o_proj(att)
  ops.matmul({.y = a.h, .x = a.att, .w = w.o_proj, .accumulate = true});

  // MLP half: x' = h + down(silu(gate(m)) * up(m)), m = rmsnorm(h)
  ops.rmsnorm({.out = a.ln2, .rstd = a.rstd2, .x = a.h, .w = w.post_attention_norm, .eps = eps});
  ops.matmul({.y = a.gate, .x = a.ln2, .w = w.gate_proj});
  ops.matmul({.y = a.up, .x = a.ln2, .w = w.up_proj});
  ops.swiglu({.out = a.act, .gate = a.gate, .up = a.up});
  ops.copy(x_out, a.h);
  ops.matmul({.y = x_out, .x = a.act, .w = w.down_proj, .accumulate = true});
}

}  // namespace l3::model
