// One decoder block's forward, written once for training (LlamaModel) and generation
// (Generator): x_out = h + down(silu(gate(m)) * up(m)), m = rmsnorm(h), h = x + o_proj(att),
// att = attention(rope(q), rope(k), v), q/k/v = projections of rmsnorm(x). Only the attention
// differs: the training forward's packed causal segments, or the generator's KV cache. The
// caller gives it as `attend`, which reads a.q, a.k, a.v (after RoPE) and writes a.att (and
// a.lse).
#pragma once

#include <cstdint>
#include <functional>

#include "kernels/ops.hpp"
#include "model/model_config.hpp"
#include "model/parameter_layout.hpp"

namespace l3::model {

// A block's weights as views into the flat parameter buffer (no lookups by name), shaped:
// the norms (H), the projections (out, in) as stored by Hugging Face.
struct BlockWeights {
  kernels::ConstTensorView input_norm, q_proj, k_proj, v_proj, o_proj, post_attention_norm,
      gate_proj, up_proj, down_proj;
};
// `weight(offset, shape)`: the parameter at layout position `offset`, viewed as `shape` (from
// the flat parameter buffer, or from a ParameterWindow).
using WeightLookup =
    std::function<kernels::ConstTensorView(std::int64_t offset, const kernels::Shape& shape)>;
[[nodiscard]] BlockWeights block_weights(const ParameterLayout& layout, int layer,
                                         const WeightLookup& weight);

// The n rows of a block's activations (views of these shapes; ln1/ln2 and rstd1/rstd2 may share
// storage where nothing reads them later).
struct BlockViews {
  kernels::TensorView ln1;    // (n, H)  rmsnorm(x)
  kernels::TensorView rstd1;  // (n)
  kernels::TensorView q;      // (n, n_heads, head_dim), after RoPE
  kernels::TensorView k;      // (n, n_kv_heads, head_dim), after RoPE
  kernels::TensorView v;      // (n, n_kv_heads, head_dim)
  kernels::TensorView att;    // (n, n_heads, head_dim)  attention output, before o_proj
  kernels::TensorView lse;    // (n_heads, n)
  kernels::TensorView h;      // (n, H)  x + o_proj(att)
  kernels::TensorView ln2;    // (n, H)  rmsnorm(h)
  kernels::TensorView rstd2;  // (n)
  kernels::TensorView gate;   // (n, I)
  kernels::TensorView up;     // (n, I)
  kernels::TensorView act;    // (n, I)  silu(gate) * up
};

// RoPE's inputs: each row's position (n) i32 and the backend's tables (rope_table.hpp).
struct RopeViews {
  kernels::ConstTensorView positions, cos, sin;
};

// x_in and x_out (n, H) may be the same buffer.
void decoder_block_forward(kernels::Ops& ops, const ModelConfig& config, const BlockWeights& w,
                           const RopeViews& rope, kernels::ConstTensorView x_in,
                           kernels::TensorView x_out, const BlockViews& a,
                           const std::function<void()>& attend);

}  // namespace l3::model
