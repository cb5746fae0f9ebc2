// Context parallelism's group (--context-parallel C): C consecutive ranks of the run's world
// that hold each micro-batch's rows between them (data::context_share) and exchange, in every
// layer's attention, the keys and values of the whole sequence (model::ContextExchange), over
// MPI on a communicator of their own. The CPU backend's: the views are fp32 host memory.
#pragma once

#include <cstdint>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/world.hpp"
#include "model/context_exchange.hpp"

namespace l3::parallel {

class ContextGroup final : public model::ContextExchange {
 public:
  // Groups of `ranks` consecutive ranks of `world` (ranks divides its size). Collective.
  ContextGroup(const dist::World& world, int ranks);

  [[nodiscard]] int ranks() const noexcept override { return ranks_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  void all_gather(kernels::ConstTensorView local, kernels::TensorView whole,
                  std::int64_t rows) override;
  void reduce_scatter(kernels::ConstTensorView whole, kernels::TensorView local,
                      std::int64_t rows) override;
  [[nodiscard]] std::vector<float> all_gather_varying(std::span<const float> mine) override;
  [[nodiscard]] std::vector<std::int32_t> all_gather_varying(
      std::span<const std::int32_t> mine) override;

 private:
  // The (rows * 2 * chunk, width) layout of a share, checked against the whole's.
  struct Layout {
    std::int64_t chunk = 0;  // tokens per chunk
    std::int64_t width = 0;  // values per token
    std::int64_t local = 0;  // values of a share
  };
  [[nodiscard]] Layout layout(kernels::ConstTensorView local, kernels::ConstTensorView whole,
                              std::int64_t rows, const char* what) const;
  // Element offset in a share of rank-major staging, and in the whole, of row b's part p
  // (0: chunk r, 1: chunk 2C - 1 - r) of rank r.
  [[nodiscard]] std::int64_t whole_offset(const Layout& l, int r, std::int64_t b, int p) const;
  template <typename T>
  [[nodiscard]] std::vector<T> gather_varying(std::span<const T> mine) const;

  dist::UniqueComm comm_;
  int rank_ = 0;
  int ranks_ = 1;
  std::vector<float> staging_;  // every rank's share, rank-major
};

}  // namespace l3::parallel
