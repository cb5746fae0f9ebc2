// Context parallelism's exchanges inside the model's attention: a group of C ranks holds one
// whole micro-batch between them (data::context_share: chunks r and 2C - 1 - r of the 2C of
// every row on rank r), and each rank's queries attend to the whole sequence's keys and values,
// gathered before the attention and gathered again for its backward (Llama 3's all-gather
// scheme: the (N, n_kv_heads, head_dim) K and V are the smallest tensors of a block, and
// nothing whole is kept between the two passes).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/tensor.hpp"

namespace l3::model {

class ContextExchange {
 public:
  ContextExchange() = default;
  virtual ~ContextExchange() = default;
  ContextExchange(const ContextExchange&) = delete;
  ContextExchange& operator=(const ContextExchange&) = delete;
  ContextExchange(ContextExchange&&) = delete;
  ContextExchange& operator=(ContextExchange&&) = delete;

  [[nodiscard]] virtual int ranks() const noexcept = 0;
  // whole (rows * 2C * chunk, ...) in the whole's token order = every rank's local
  // (rows * 2 * chunk, ...) put at its tokens. Collective over the group.
  virtual void all_gather(kernels::ConstTensorView local, kernels::TensorView whole,
                          std::int64_t rows) = 0;
  // local = the sum over the group's ranks of their `whole`'s rows at this rank's tokens (the
  // keys' and values' gradients, to which every rank's queries contributed). Collective.
  virtual void reduce_scatter(kernels::ConstTensorView whole, kernels::TensorView local,
                              std::int64_t rows) = 0;
  // Every rank's `mine` (host values, any number) one after another in rank order: the small
  // per-row values a loss over whole sequences needs (DPO's rows' cross-entropies). Collective.
  [[nodiscard]] virtual std::vector<float> all_gather_varying(std::span<const float> mine) = 0;
  [[nodiscard]] virtual std::vector<std::int32_t> all_gather_varying(
      std::span<const std::int32_t> mine) = 0;
};

}  // namespace l3::model
