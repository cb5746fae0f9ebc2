// Tensor parallelism's group (--tensor-parallel T): T consecutive ranks of the run's world that
// hold each layer's heads, MLP columns and vocabulary rows between them (model/tensor_slice.hpp)
// and sum the residual stream's parts and its gradients (model::TensorExchange), over MPI on a
// communicator of their own. The CPU backend's: the views are fp32 host memory.
#pragma once

#include <span>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/world.hpp"
#include "model/tensor_exchange.hpp"

namespace l3::parallel {

class TensorGroup final : public model::TensorExchange {
 public:
  // Groups of `ranks` consecutive ranks of `world` (ranks divides its size). Collective.
  TensorGroup(const dist::World& world, int ranks);

  [[nodiscard]] int ranks() const noexcept override { return ranks_; }
  [[nodiscard]] int rank() const noexcept override { return rank_; }
  // An all-gather, then the sum in rank order on every rank (MPI_Allreduce may add in another
  // order on each rank, and the replicated computation after it must be the same bits).
  void all_reduce_sum(kernels::TensorView x) override;
  void all_gather(std::span<const double> mine, std::span<double> all) override;

 private:
  dist::UniqueComm comm_;
  int rank_ = 0;
  int ranks_ = 1;
  std::vector<float> staging_;  // (ranks x x.numel()) rank-major
};

}  // namespace l3::parallel
