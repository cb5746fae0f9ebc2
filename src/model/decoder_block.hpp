// One decoder block, forward and backward, written once for training (LlamaModel) and
// generation (Generator, forward only): x_out = h + down(silu(gate(m)) * up(m)), m = rmsnorm(h),
// h = x + o_proj(att), att = attention(rope(q), rope(k), v), q/k/v = projections of rmsnorm(x),
// each projection with its LoRA adapter where the block has one. Only the attention differs:
// the training pass's packed causal segments, or the generator's KV cache. The caller gives it
// as `attend` (reads a.q, a.k, a.v after RoPE, writes a.att and a.lse) and `attend_backward`.
#pragma once

#include <array>
#include <cstdint>
#include <functional>

#include "core/rng.hpp"
#include "kernels/ops.hpp"
#include "model/lora_config.hpp"
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

// Block `layer`'s nine tensors as `at(offset, shape)` views them, in a BlockWeights or a
// BlockGradients (the same members): one place for their shapes.
template <typename Parts, typename Lookup>
[[nodiscard]] Parts block_tensors(const ParameterLayout& layout, int layer, const Lookup& at) {
  const ModelConfig& c = layout.config();
  const BlockOffsets& o = layout.block(layer);
  const std::int64_t h = c.hidden_size;
  const std::int64_t i = c.intermediate_size;
  const std::int64_t q = c.q_size();
  const std::int64_t kv = c.kv_size();
  return {.input_norm = at(o.input_norm, kernels::Shape{h}),
          .q_proj = at(o.q_proj, kernels::Shape{q, h}),
          .k_proj = at(o.k_proj, kernels::Shape{kv, h}),
          .v_proj = at(o.v_proj, kernels::Shape{kv, h}),
          .o_proj = at(o.o_proj, kernels::Shape{h, q}),
          .post_attention_norm = at(o.post_attention_norm, kernels::Shape{h}),
          .gate_proj = at(o.gate_proj, kernels::Shape{i, h}),
          .up_proj = at(o.up_proj, kernels::Shape{i, h}),
          .down_proj = at(o.down_proj, kernels::Shape{h, i})};
}

// A block's LoRA adapters (lora_config.hpp) as views into the adapter buffer: A (r, in) and
// B (out, r) of each target, empty where a layer has none; y = W x + scale * B (A dropout(x)).
struct BlockAdapters {
  std::array<kernels::ConstTensorView, kLoraTargetCount> a{}, b{};
  float scale = 0.0F;
  float dropout = 0.0F;  // 0 outside training
  // This block's dropout masks in this micro-batch: target t's mask seed is
  // dropout_rng.bits64(dropout_index + t) (LlamaModel::set_dropout_draw).
  core::CounterRng dropout_rng{0, core::RngPurpose::lora_dropout};
  std::uint64_t dropout_index = 0;

  [[nodiscard]] bool has(LoraTarget t) const noexcept {
    return !a[static_cast<std::size_t>(t)].empty();
  }
  [[nodiscard]] kernels::ConstTensorView a_of(LoraTarget t) const {
    return a[static_cast<std::size_t>(t)];
  }
  [[nodiscard]] kernels::ConstTensorView b_of(LoraTarget t) const {
    return b[static_cast<std::size_t>(t)];
  }
  // The dropout seed of one target's input: each adapter draws a mask of its own, as each of
  // PEFT's lora_dropout modules does.
  [[nodiscard]] std::uint64_t target_seed(LoraTarget t) const noexcept;
};

// The forward half of one adapter: u = scale * (A dropout(x)) (n, r), kept for the backward,
// then y += u B^T. x_dropped (n, in) holds dropout(x) when dropout > 0.
void lora_forward(kernels::Ops& ops, const BlockAdapters& adapters, LoraTarget t,
                  kernels::TensorView y, kernels::ConstTensorView x, kernels::TensorView u,
                  kernels::TensorView x_dropped);

// Its backward, given dy (n, out) of y, the forward's x and u: dB += dy^T u, dA += du^T
// dropout(x) with du = scale * dy B, and dx += dropout'(du A) (dx holds the base layer's part
// already). du (n, r) is a work buffer; scratch (n, in) too, used when dropout > 0.
struct LoraGradients {
  kernels::TensorView a, b;  // dA (r, in), dB (out, r)
};
void lora_backward(kernels::Ops& ops, const BlockAdapters& adapters, LoraTarget t,
                   const LoraGradients& grads, kernels::TensorView dx, kernels::ConstTensorView dy,
                   kernels::ConstTensorView x, kernels::ConstTensorView u, kernels::TensorView du,
                   kernels::TensorView scratch);

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
  // With adapters: scale * A dropout(x) of each target (n, r), and (n, max in) for dropout(x).
  std::array<kernels::TensorView, kLoraTargetCount> lora_u{};
  kernels::TensorView lora_x{};
};

// RoPE's inputs: each row's position (n) i32 and the backend's tables (rope_table.hpp).
struct RopeViews {
  kernels::ConstTensorView positions, cos, sin;
  // Generation's decoding passes: attend() rotates q and k itself (Ops::rope_kv_cache_write,
  // fused with the cache write); the block does not.
  bool in_attend = false;
};

// A block's weight gradients, shaped as BlockWeights: views into the gradient buffer or a
// GradientWindow's slot, added into. Empty views for frozen weights (LoRA), whose gradients are
// not computed.
struct BlockGradients {
  kernels::TensorView input_norm, q_proj, k_proj, v_proj, o_proj, post_attention_norm, gate_proj,
      up_proj, down_proj;
};

// A block's adapters' gradients (empty where the block has no adapter on a target), and the
// adapters' backward work buffers: du (n, r) and scratch (rows, widest input; dropout only).
struct BlockAdapterGradients {
  std::array<LoraGradients, kLoraTargetCount> grads{};
  kernels::TensorView du, scratch;
};

// The backward's work buffers for n rows: the gradients of the block's activations.
struct BlockBackwardViews {
  kernels::TensorView d_ln;                 // (n, H)  of ln2, then of ln1
  kernels::TensorView d_act, d_gate, d_up;  // (n, I)
  kernels::TensorView d_att, d_q;           // (n, n_heads, head_dim)
  kernels::TensorView d_k, d_v;             // (n, n_kv_heads, head_dim)
};

// Tensor parallelism (tensor_exchange.hpp): x = the sum of x over the group, the same on every
// rank. Empty: the block is whole.
using TensorReduce = std::function<void(kernels::TensorView x)>;

// x_in and x_out (n, H) may be the same buffer. adapters: null for none. With `reduce` (tensor
// parallelism; the weights and activations are this rank's heads and MLP columns), the
// row-parallel projections' outputs are summed over the group before the residual adds.
void decoder_block_forward(kernels::Ops& ops, const ModelConfig& config, const BlockWeights& w,
                           const RopeViews& rope, kernels::ConstTensorView x_in,
                           kernels::TensorView x_out, const BlockViews& a,
                           const std::function<void()>& attend,
                           const BlockAdapters* adapters = nullptr,
                           const TensorReduce& reduce = {});

// The backward of decoder_block_forward, given its activations `a` and its input x_in:
// d_resid holds d(loss)/d(x_out) and is turned into d(loss)/d(x_in); the weights' gradients are
// added into `g`, the adapters' (with `adapters`) into `adapter_grads`. `attend_backward` reads
// d.d_att and a's attention inputs and output, and writes d.d_q, d.d_k, d.d_v (before RoPE's
// backward). Each adapter's backward follows its layer's, before that layer's dx is read on.
// With `reduce`, the column-parallel projections' input gradients are summed over the group
// before each norm's backward (whose weight gradients are then the same on every rank).
void decoder_block_backward(kernels::Ops& ops, const ModelConfig& config, const BlockWeights& w,
                            const BlockGradients& g, const RopeViews& rope,
                            kernels::ConstTensorView x_in, kernels::TensorView d_resid,
                            const BlockViews& a, const BlockBackwardViews& d,
                            const std::function<void()>& attend_backward,
                            const BlockAdapters* adapters = nullptr,
                            const BlockAdapterGradients* adapter_grads = nullptr,
                            const TensorReduce& reduce = {});

}  // namespace l3::model
