// A model's weights spread over ranks and never updated: evaluation of a model larger than one
// rank's memory (`eval --shard-parameters`), and LoRA's frozen model with --shard-parameters
// (forward and backward passes read it): each rank loads and holds 1/N of them (its
// pieces of a ShardPlan over the gradient groups) in the compute dtype, and the model reads
// every layer group through a ParameterGather over those pieces (parameter_gather.hpp). Nothing
// else: no master copy, no gradients, no optimizer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "model/lora_merge.hpp"
#include "model/parameter_layout.hpp"
#include "parallel/parameter_gather.hpp"
#include "parallel/shard_plan.hpp"
#include "train/model_source.hpp"

namespace l3::parallel {

class ShardedWeights {
 public:
  // Collective over `world`: every rank reads its pieces of `source`'s weights (random ones from
  // `seed` without a checkpoint or model directory) as initial_weights_of_ranges does, and folds
  // `adapters` into them when given (a PEFT adapter: eval --adapter --shard-parameters).
  ShardedWeights(const dist::World& world, kernels::Ops& ops, const model::ParameterLayout& layout,
                 const train::ModelSource& source, std::uint64_t seed,
                 const model::AdapterFold* adapters = nullptr);
  ShardedWeights(const ShardedWeights&) = delete;
  ShardedWeights& operator=(const ShardedWeights&) = delete;
  ShardedWeights(ShardedWeights&&) = delete;
  ShardedWeights& operator=(ShardedWeights&&) = delete;
  ~ShardedWeights() = default;

  // For LlamaModel::set_parameter_window (a model built with own_parameters false).
  [[nodiscard]] model::ParameterWindow& window() noexcept { return *gather_; }
  // The elements this rank holds (its share) and the bytes of the gather slots.
  [[nodiscard]] std::int64_t held_elements() const noexcept { return held_; }
  [[nodiscard]] std::int64_t gather_slot_bytes() const noexcept { return gather_->slot_bytes(); }
  // The gathers' times and counts since the last call (ParameterGather::take_times).
  [[nodiscard]] GatherTimes take_gather_times() noexcept { return gather_->take_times(); }
  // This rank's pieces: their ranges of the layout (ascending) and their values widened to fp32
  // on the host (asynchronous GRPO's generating ranks take the frozen model from them).
  struct HostPieces {
    std::vector<model::FlatRange> ranges;
    std::vector<float> values;
  };
  [[nodiscard]] HostPieces host_pieces(kernels::Ops& ops) const;

 private:
  ShardPlan plan_;
  int rank_;
  kernels::Buffer pieces_;        // this rank's pieces back to back, in layout order
  std::vector<std::int64_t> at_;  // where bucket b's piece starts in pieces_ (-1: empty)
  std::int64_t held_ = 0;
  std::unique_ptr<ParameterGather> gather_;
};

}  // namespace l3::parallel
