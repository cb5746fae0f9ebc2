// This rank's optimizer state under data parallelism: one AdamW per piece it owns (ZeRO-1/2,
// over a ShardPlan) or one over the whole buffer (unsharded), the fp32 master weights (in the
// optimizers, this rank's pieces only, when the model computes in bf16 or shard_master asks;
// else the model's whole copy), and the copies in and out of them by flat range that
// checkpoints and fresh starts need.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kernels/ops.hpp"
#include "model/parameter_layout.hpp"
#include "parallel/shard_plan.hpp"
#include "train/adamw_optimizer.hpp"

namespace l3::parallel {

// The model's weights as the optimizer sees them.
struct ModelWeights {
  kernels::TensorView master;   // whole fp32 master weights; empty with shard_master
  kernels::TensorView compute;  // the weights the model computes with when they are not
                                // `master` (bf16, or shard_master); else empty
};

struct OptimizerSharding {
  bool sharded = true;         // one optimizer per piece of this rank (else the whole buffer)
  bool shard_master = false;   // the master weights live in the optimizers
  bool own_gradients = false;  // ZeRO-2: the optimizers keep their reduced gradients
  kernels::DType gradient_dtype = kernels::DType::f32;  // of those gradients
  // ZeRO-3 (with shard_master): the model holds no weights, not even in the compute dtype: the
  // master pieces are the only copy, and each layer group is gathered from them (rounded to the
  // compute dtype on the way) when the model reads it (parameter_gather.hpp).
  bool gathered = false;
};

class ShardedOptimizer {
 public:
  ShardedOptimizer(kernels::Ops& ops, const model::ParameterLayout& layout,
                   train::AdamWConfig adamw, const ShardPlan& plan, int rank,
                   OptimizerSharding sharding, ModelWeights weights);

  // AdamW on every optimizer of this rank: `grads` the model's whole flat buffer (empty with
  // own_gradients), multiplied by grad_scale first (clipping).
  void update(kernels::TensorView grads, float lr, float grad_scale);

  // Sharded: the optimizer of bucket b (its piece of this rank; possibly empty).
  [[nodiscard]] train::AdamW& of_bucket(std::size_t bucket) { return optimizers_.at(bucket); }
  [[nodiscard]] std::vector<train::AdamW>& optimizers() noexcept { return optimizers_; }
  [[nodiscard]] const ModelWeights& weights() const noexcept { return weights_; }
  [[nodiscard]] bool sharded() const noexcept { return sharding_.sharded; }

  // The ranges whose state this rank holds: its pieces when sharded, else the whole buffer.
  [[nodiscard]] std::vector<model::FlatRange> state_ranges() const;
  // The fp32 master weights of `ranges` (within state_ranges()) to / from host arrays holding
  // the ranges back to back. Loading also sets the compute weights of those ranges (the
  // caller all-gathers the others).
  void save_master(const std::vector<model::FlatRange>& ranges, std::span<float> values);
  void load_master(const std::vector<model::FlatRange>& ranges, std::span<const float> values);
  // The master weights of state_ranges() from the whole flat array (a fresh start).
  void load_master_from_whole(std::span<const float> all);
  // The AdamW moments, likewise; and the update count of every optimizer.
  void save_moments(const std::vector<model::FlatRange>& ranges, std::span<float> m,
                    std::span<float> v);
  void load_moments(const std::vector<model::FlatRange>& ranges, std::span<const float> m,
                    std::span<const float> v);
  [[nodiscard]] std::int64_t adamw_steps() const noexcept;
  void set_adamw_steps(std::int64_t steps) noexcept;

 private:
  // The optimizer holding flat position `begin` and the offset of `begin` in its state.
  [[nodiscard]] std::pair<train::AdamW*, std::int64_t> optimizer_at(std::int64_t begin);
  [[nodiscard]] kernels::TensorView master_of(model::FlatRange r);

  kernels::Ops& ops_;
  const model::ParameterLayout& layout_;
  const ShardPlan& plan_;
  int rank_;
  OptimizerSharding sharding_;
  ModelWeights weights_;
  std::vector<train::AdamW> optimizers_;
};

}  // namespace l3::parallel
