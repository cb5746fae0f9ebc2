#include "model/decoder_block.hpp"

#include "core/rng.hpp"

namespace l3::model {

namespace {
// The first rows x cols elements of a work buffer, as a (rows, cols) matrix.
kernels::TensorView matrix_of(kernels::TensorView buffer, std::int64_t rows, std::int64_t cols) {
  return buffer.slice(0, rows * cols).reshape({rows, cols});
}
}  // namespace

std::uint64_t BlockAdapters::target_seed(LoraTarget t) const noexcept {
  return dropout_rng.bits64(dropout_index + static_cast<std::uint64_t>(t));
}

void lora_forward(kernels::Ops& ops, const BlockAdapters& ad, LoraTarget t, kernels::TensorView y,
                  kernels::ConstTensorView x, kernels::TensorView u,
                  kernels::TensorView x_dropped) {
  kernels::ConstTensorView input = x;
  if (ad.dropout > 0.0F) {
    const kernels::TensorView dropped = matrix_of(x_dropped, x.rows(), x.row_size());
    ops.dropout({.out = dropped,
                 .x = x.reshape({x.rows(), x.row_size()}),  // (n, heads, head_dim) of o_proj
                 .p = ad.dropout,
                 .seed = ad.target_seed(t)});
    input = dropped;
  }
  ops.matmul({.y = u, .x = input, .w = ad.a_of(t)});
  if (ad.scale != 1.0F) ops.dropout({.out = u, .x = u, .scale = ad.scale});
  ops.matmul({.y = y, .x = u, .w = ad.b_of(t), .accumulate = true});
}

void lora_backward(kernels::Ops& ops, const BlockAdapters& ad, LoraTarget t,
                   const LoraGradients& grads, kernels::TensorView dx, kernels::ConstTensorView dy,
                   kernels::ConstTensorView x, kernels::ConstTensorView u, kernels::TensorView du,
                   kernels::TensorView scratch) {
  // u already carries the scale: dB += dy^T u, and du = dy B is d/du of y, times scale for A's.
  ops.matmul_backward({.dx = du, .dw = grads.b, .dy = dy, .x = u, .w = ad.b_of(t)});
  if (ad.scale != 1.0F) ops.dropout({.out = du, .x = du, .scale = ad.scale});
  if (ad.dropout == 0.0F) {
    ops.matmul_backward(
        {.dx = dx, .dw = grads.a, .dy = du, .x = x, .w = ad.a_of(t), .accumulate_dx = true});
    return;
  }
  // The forward's mask, drawn again from its seed: dA += du^T dropout(x), then
  // dx += dropout(du A) (the same mask and 1 / (1 - p)).
  const kernels::TensorView work = matrix_of(scratch, x.rows(), x.row_size());
  const std::uint64_t seed = ad.target_seed(t);
  ops.dropout(
      {.out = work, .x = x.reshape({x.rows(), x.row_size()}), .p = ad.dropout, .seed = seed});
  ops.matmul_backward({.dw = grads.a, .dy = du, .x = work, .w = ad.a_of(t)});
  ops.matmul_backward({.dx = work, .dy = du, .w = ad.a_of(t)});
  ops.dropout({.out = work, .x = work, .p = ad.dropout, .seed = seed});
  ops.add_into(dx, work);
}

BlockWeights block_weights(const ParameterLayout& layout, int layer, const WeightLookup& weight) {
  return block_tensors<BlockWeights>(layout, layer, weight);
}

void decoder_block_forward(kernels::Ops& ops, const ModelConfig& c, const BlockWeights& w,
                           const RopeViews& rope, kernels::ConstTensorView x_in,
                           kernels::TensorView x_out, const BlockViews& a,
                           const std::function<void()>& attend, const BlockAdapters* adapters,
                           const TensorReduce& reduce) {
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const auto rotate = [&](kernels::TensorView x) {
    ops.rope({.x = x, .positions = rope.positions, .cos = rope.cos, .sin = rope.sin});
  };
  // y (+)= x W^T, plus the target's adapter when it has one (before RoPE, as in PEFT).
  const auto project = [&](LoraTarget t, kernels::TensorView y, kernels::ConstTensorView x,
                           kernels::ConstTensorView weight, bool accumulate) {
    ops.matmul({.y = y, .x = x, .w = weight, .accumulate = accumulate});
    if (adapters != nullptr && adapters->has(t)) {
      lora_forward(ops, *adapters, t, y, x, a.lora_u[static_cast<std::size_t>(t)], a.lora_x);
    }
  };

  // attention half: h = x + o_proj(attn(rope(q), rope(k), v)), q/k/v from rmsnorm(x)
  ops.rmsnorm({.out = a.ln1, .rstd = a.rstd1, .x = x_in, .w = w.input_norm, .eps = eps});
  project(LoraTarget::q, a.q, a.ln1, w.q_proj, false);
  project(LoraTarget::k, a.k, a.ln1, w.k_proj, false);
  project(LoraTarget::v, a.v, a.ln1, w.v_proj, false);
  if (!rope.in_attend) {
    rotate(a.q);
    rotate(a.k);
  }
  attend();
  if (reduce) {
    // tensor parallelism: this rank's heads' part of o_proj, the group's sum, the residual
    project(LoraTarget::o, a.h, a.att, w.o_proj, false);
    reduce(a.h);
    ops.add_into(a.h, x_in);
  } else {
    ops.copy(a.h, x_in);  // the residual, then += o_proj(att)
    project(LoraTarget::o, a.h, a.att, w.o_proj, true);
  }

  // MLP half: x' = h + down(silu(gate(m)) * up(m)), m = rmsnorm(h)
  ops.rmsnorm({.out = a.ln2, .rstd = a.rstd2, .x = a.h, .w = w.post_attention_norm, .eps = eps});
  project(LoraTarget::gate, a.gate, a.ln2, w.gate_proj, false);
  project(LoraTarget::up, a.up, a.ln2, w.up_proj, false);
  ops.swiglu({.out = a.act, .gate = a.gate, .up = a.up});
  if (reduce) {
    project(LoraTarget::down, x_out, a.act, w.down_proj, false);
    reduce(x_out);
    ops.add_into(x_out, a.h);
    return;
  }
  ops.copy(x_out, a.h);
  project(LoraTarget::down, x_out, a.act, w.down_proj, true);
}

void decoder_block_backward(kernels::Ops& ops, const ModelConfig& /*config*/, const BlockWeights& w,
                            const BlockGradients& g, const RopeViews& rope,
                            kernels::ConstTensorView x_in, kernels::TensorView d_resid,
                            const BlockViews& a, const BlockBackwardViews& d,
                            const std::function<void()>& attend_backward,
                            const BlockAdapters* adapters,
                            const BlockAdapterGradients* adapter_grads,
                            const TensorReduce& reduce) {
  // dx (+)= dy W, dW += dy^T x; then the target's adapter, which fed the same y from x.
  const auto project_backward = [&](LoraTarget t, kernels::TensorView dx,
                                    kernels::ConstTensorView dy, kernels::ConstTensorView x,
                                    kernels::ConstTensorView weight, kernels::TensorView dw,
                                    bool accumulate) {
    ops.matmul_backward(
        {.dx = dx, .dw = dw, .dy = dy, .x = x, .w = weight, .accumulate_dx = accumulate});
    if (adapters != nullptr && adapters->has(t)) {
      const auto k = static_cast<std::size_t>(t);
      lora_backward(ops, *adapters, t, adapter_grads->grads[k], dx, dy, x, a.lora_u[k],
                    adapter_grads->du, adapter_grads->scratch);
    }
  };

  // MLP half. d_resid holds d(x'); the residual passes it on to d(h) unchanged.
  project_backward(LoraTarget::down, d.d_act, d_resid, a.act, w.down_proj, g.down_proj, false);
  ops.swiglu_backward(
      {.dgate = d.d_gate, .dup = d.d_up, .dout = d.d_act, .gate = a.gate, .up = a.up});
  project_backward(LoraTarget::gate, d.d_ln, d.d_gate, a.ln2, w.gate_proj, g.gate_proj, false);
  project_backward(LoraTarget::up, d.d_ln, d.d_up, a.ln2, w.up_proj, g.up_proj, true);
  if (reduce) reduce(d.d_ln);  // tensor parallelism: the group's columns' parts of d(ln2)
  ops.rmsnorm_backward({.dx = d_resid,
                        .dw = g.post_attention_norm,
                        .dout = d.d_ln,
                        .x = a.h,
                        .w = w.post_attention_norm,
                        .rstd = a.rstd2});

  // Attention half. d_resid holds d(h); the residual passes it on to d(x).
  project_backward(LoraTarget::o, d.d_att, d_resid, a.att, w.o_proj, g.o_proj, false);
  attend_backward();
  for (const kernels::TensorView dx : {d.d_q, d.d_k}) {
    ops.rope_backward({.x = dx, .positions = rope.positions, .cos = rope.cos, .sin = rope.sin});
  }
  // d_q and d_k before RoPE, where the adapters added.
  project_backward(LoraTarget::q, d.d_ln, d.d_q, a.ln1, w.q_proj, g.q_proj, false);
  project_backward(LoraTarget::k, d.d_ln, d.d_k, a.ln1, w.k_proj, g.k_proj, true);
  project_backward(LoraTarget::v, d.d_ln, d.d_v, a.ln1, w.v_proj, g.v_proj, true);
  if (reduce) reduce(d.d_ln);  // the group's heads' parts of d(ln1)
  ops.rmsnorm_backward({.dx = d_resid,
                        .dw = g.input_norm,
                        .dout = d.d_ln,
                        .x = x_in,
                        .w = w.input_norm,
                        .rstd = a.rstd1});
}

}  // namespace l3::model
