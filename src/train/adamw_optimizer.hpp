// AdamW over a range [begin, end) of the flat parameter buffer: the whole model, or one rank's
// ZeRO-1 shard. Owns the moments (fp32) of that range; weight decay applies to the 2-D weights
// only (ParameterLayout's TensorInfo::decay), never to norms; alignment padding is skipped.
#pragma once

#include <cstdint>

#include "kernels/ops.hpp"
#include "model/parameter_layout.hpp"

namespace l3::train {

struct AdamWConfig {
  float beta1 = 0.9F;
  float beta2 = 0.95F;
  float eps = 1e-8F;
  float weight_decay = 0.1F;
};

// The part of the flat buffer an AdamW updates, and what it keeps of its own there.
struct AdamWShard {
  std::int64_t begin = 0;
  std::int64_t end = -1;  // -1: the end of the layout
  // The fp32 master weights of [begin, end) (ZeRO-1 with the master weights sharded too: the
  // model holds only its compute-dtype weights).
  bool own_master = false;
  // The reduced gradients of [begin, end), in gradient_dtype (ZeRO-2: the whole gradient buffer
  // never exists; f32 so that the micro-batches of a step add up without a bf16 rounding each,
  // the compute dtype when there is one micro-batch to add).
  bool own_gradients = false;
  kernels::DType gradient_dtype = kernels::DType::f32;
};

class AdamW {
 public:
  AdamW(kernels::Ops& ops, const model::ParameterLayout& layout, AdamWConfig config,
        AdamWShard shard = {});

  // One update of master[begin, end) from grads[begin, end) (full flat buffers: the fp32 master
  // weights, the gradients in the compute dtype), the gradients multiplied by grad_scale first
  // (clipping). master is empty when the optimizer owns its master weights, grads when it owns
  // its gradients. weight_copy: the
  // compute-dtype weights to refresh from the master (bf16 on the GPU), or empty when the
  // master weights are the compute weights (the CPU backend).
  void step(kernels::TensorView master, kernels::TensorView weight_copy,
            kernels::ConstTensorView grads, float lr, float grad_scale);

  [[nodiscard]] std::int64_t steps_taken() const noexcept { return step_; }
  [[nodiscard]] kernels::TensorView first_moment() const noexcept { return m_.view(); }
  [[nodiscard]] kernels::TensorView second_moment() const noexcept { return v_.view(); }
  // The master weights of [begin, end) when own_master, else empty.
  [[nodiscard]] kernels::TensorView own_master() const noexcept { return master_.view(); }
  // The reduced gradients of [begin, end) when own_gradients, else empty.
  [[nodiscard]] kernels::TensorView own_gradients() const noexcept { return grads_.view(); }
  // Restoring a checkpoint.
  void set_steps_taken(std::int64_t steps) noexcept { step_ = steps; }
  [[nodiscard]] std::int64_t begin() const noexcept { return begin_; }
  [[nodiscard]] std::int64_t end() const noexcept { return end_; }

 private:
  kernels::Ops& ops_;
  const model::ParameterLayout& layout_;
  AdamWConfig config_;
  std::int64_t begin_ = 0;
  std::int64_t end_ = 0;
  kernels::Buffer m_;  // (end - begin)
  kernels::Buffer v_;
  kernels::Buffer master_;  // (end - begin) when own_master
  kernels::Buffer grads_;   // (end - begin) when own_gradients, gradient_dtype
  std::int64_t step_ = 0;
};

// Global gradient norm sqrt(sum g^2) over [begin, end) of the flat gradient buffer, and the
// factor min(1, max_norm / norm) that clips it (1 when max_norm <= 0: no clipping).
[[nodiscard]] double gradient_norm(kernels::Ops& ops, kernels::ConstTensorView grads);
[[nodiscard]] double clip_factor(double norm, double max_norm);

}  // namespace l3::train
