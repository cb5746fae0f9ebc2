// Tensor parallelism's split of the weights (Megatron-style): rank r of T holds
//   - the column-parallel projections' rows of its heads and MLP columns: q_proj (n_heads / T
//     heads), k_proj and v_proj (n_kv_heads / T), gate_proj and up_proj (I / T rows);
//   - the row-parallel projections' matching columns: o_proj (H, q / T), down_proj (H, I / T);
//   - the vocabulary's rows [r V / T, (r + 1) V / T) of the embedding and the lm_head;
//   - the norms and a reward model's score head whole (every rank computes the same there).
// So a rank's model is a Llama of n_heads / T, n_kv_heads / T, I / T and V / T (slice_config),
// and its flat buffer maps onto the whole model's by runs (slice_runs): checkpoints, imports
// and tests move whole tensors through them, so that what is stored does not depend on T.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model_config.hpp"
#include "model/parameter_layout.hpp"

namespace l3::model {

struct TensorSlice {
  int rank = 0;
  int ranks = 1;
  [[nodiscard]] bool active() const noexcept { return ranks > 1; }
};

// usage Error naming what does not divide when `ranks` cannot split `whole` (the heads, the key
// and value heads, the MLP's columns and the vocabulary must divide by it).
void check_tensor_parallel(const ModelConfig& whole, int ranks);
// The model one rank of `ranks` holds: its heads, columns and vocabulary rows.
[[nodiscard]] ModelConfig slice_config(const ModelConfig& whole, int ranks);

// Where `local` (the layout of slice_config, rank slice.rank) sits in `whole`: its elements
// [local_offset, + length) are the whole buffer's [whole_offset, + length).
struct SliceRun {
  std::int64_t whole_offset = 0;
  std::int64_t local_offset = 0;
  std::int64_t length = 0;
};
[[nodiscard]] std::vector<SliceRun> slice_runs(const ParameterLayout& whole,
                                               const ParameterLayout& local, TensorSlice slice);

// This rank's values out of a whole buffer, and back into one (the other ranks' elements
// untouched).
void take_slice(std::span<const SliceRun> runs, std::span<const float> whole,
                std::span<float> local);
void put_slice(std::span<const SliceRun> runs, std::span<const float> local,
               std::span<float> whole);

}  // namespace l3::model
