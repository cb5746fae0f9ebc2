// Where a run's parameters, gradients and optimizer state live over its ranks: one typed value
// built and validated once from the options (parallel::choose_placement) and read by every layer
// that depends on it: the model (which buffers it owns: ModelOptions), the memory plan, the
// data-parallel optimizer (parallel::DataParallel) and the logs.
//
//   stage       weights                 gradients               optimizer state
//   replicated  whole on every rank     whole                   whole on every rank
//   optimizer   whole                   whole, reduce-scattered 1/G per rank       (ZeRO-1)
//   gradients   whole                   two layer-group slots   1/G                (ZeRO-2)
//   parameters  1/G, gathered per group two layer-group slots   1/G                (ZeRO-3)
//
// G is the shard group: all the ranks, or (hybrid sharding) groups of `shard_group` consecutive
// ranks that each hold the states whole. With LoRA (`frozen_model`), what trains is the adapters;
// at stage `parameters` the frozen model is what is sharded (over all the ranks) and the
// adapters get ZeRO-2. Forward-only runs (evaluate, score, generate) hold frozen weights, whole
// or sharded: Placement::frozen.
#pragma once

#include <string>

namespace l3::model {

enum class ZeroStage { replicated = 0, optimizer = 1, gradients = 2, parameters = 3 };

struct Placement {
  ZeroStage stage = ZeroStage::optimizer;
  int ranks = 1;
  int shard_group = 0;  // ranks per shard group; 0: one group of all the ranks
  // The model's own weights are frozen: LoRA's adapters train (or, in a forward-only run,
  // nothing does).
  bool frozen_model = false;
  // The fp32 master weights live in the optimizers' state (this rank's pieces when sharded),
  // not whole in the model: always when the backend computes in bf16, and at stage parameters.
  bool master_in_optimizer = false;
  // Gradients add up in fp32 (several micro-batches per step in bf16): the model's whole
  // buffer, or at stages gradients and parameters the optimizers' reduced pieces.
  bool fp32_gradients = false;
  // Forward passes only (evaluate, score, generate): no gradients, no optimizer.
  bool forward_only = false;
  // The process grid: groups of `context_parallel` consecutive ranks share each sequence
  // (context parallelism); the ranks / context_parallel groups are data parallel. The states
  // are sharded and reduced over all the ranks, as pure data parallelism does.
  int context_parallel = 1;
  // Tensor parallelism: groups of `tensor_parallel` consecutive ranks hold each layer's slices
  // (model/tensor_slice.hpp) and run the same micro-batches; the context and data groups are
  // formed over the ranks of one tensor rank (rank = (data x C + context) x T + tensor), and the
  // states are sharded and reduced over those ranks_data() ranks.
  int tensor_parallel = 1;

  // Forward passes only, over frozen weights held whole or sharded over `ranks` ranks.
  [[nodiscard]] static Placement frozen(bool sharded, int ranks) noexcept;

  [[nodiscard]] bool shards_optimizer() const noexcept { return stage >= ZeroStage::optimizer; }
  [[nodiscard]] bool shards_gradients() const noexcept { return stage >= ZeroStage::gradients; }
  // Stage parameters: the weights that train (ZeRO-3), or LoRA's frozen model.
  [[nodiscard]] bool shards_trained_weights() const noexcept {
    return stage == ZeroStage::parameters && !frozen_model;
  }
  [[nodiscard]] bool shards_frozen_weights() const noexcept {
    return stage == ZeroStage::parameters && frozen_model;
  }
  // The model holds no whole copy of its weights (it reads them through a ParameterWindow).
  [[nodiscard]] bool model_holds_weights() const noexcept { return stage != ZeroStage::parameters; }
  [[nodiscard]] bool hybrid() const noexcept {
    return shard_group > 0 && shard_group < ranks_per_tensor_rank();
  }
  // The ranks the trained states are sharded over.
  [[nodiscard]] int shard_ranks() const noexcept {
    return hybrid() ? shard_group : ranks_per_tensor_rank();
  }
  // The data-parallel groups: the ranks that read different samples.
  [[nodiscard]] int data_parallel_ranks() const noexcept {
    return ranks / (context_parallel * tensor_parallel);
  }
  // The ranks of one tensor rank: what the states are sharded and reduced over.
  [[nodiscard]] int ranks_per_tensor_rank() const noexcept { return ranks / tensor_parallel; }

  // "0 (off)", "1", "2", "3", "3 (hybrid: shard groups of G ranks)", or LoRA's "2 over the
  // adapters, the frozen model sharded (1/N on each rank)": for logs and plans.
  [[nodiscard]] std::string stage_name() const;
  // The process grid for logs and plans: "tensor parallel T x context parallel C x data
  // parallel D" (the axes used), empty for pure data parallelism.
  [[nodiscard]] std::string grid() const;
  // When and how gradients are reduced, for the run's plan line.
  [[nodiscard]] std::string reduction_description(bool overlapping) const;
};

}  // namespace l3::model
