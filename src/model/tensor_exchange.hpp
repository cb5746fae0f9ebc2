// Tensor parallelism's exchanges inside the model (Megatron's scheme): a group of T ranks holds
// one layer's attention heads, MLP columns and vocabulary rows between them (tensor_slice.hpp),
// and every rank sees the whole residual stream. The row-parallel projections (o_proj,
// down_proj) and the embedding give each rank a part of the stream that the group sums; the
// column-parallel projections' backward (q/k/v, gate/up) and the lm_head's give a part of the
// stream's gradient, summed likewise; the cross-entropy's softmax spans the group's slices of
// the vocabulary (kernels::VocabShare).
#pragma once

#include <span>

#include "kernels/tensor.hpp"

namespace l3::model {

class TensorExchange {
 public:
  TensorExchange() = default;
  virtual ~TensorExchange() = default;
  TensorExchange(const TensorExchange&) = delete;
  TensorExchange& operator=(const TensorExchange&) = delete;
  TensorExchange(TensorExchange&&) = delete;
  TensorExchange& operator=(TensorExchange&&) = delete;

  [[nodiscard]] virtual int ranks() const noexcept = 0;
  [[nodiscard]] virtual int rank() const noexcept = 0;
  // x = the sum of the group's x, added in rank order: the same bits on every rank and in every
  // run, whatever the MPI library's reduction algorithm. Collective over the group.
  virtual void all_reduce_sum(kernels::TensorView x) = 0;
  // all (ranks x mine.size()) = every rank's `mine` in rank order. Collective.
  virtual void all_gather(std::span<const double> mine, std::span<double> all) = 0;
};

}  // namespace l3::model
