// Before a run allocates anything large: what it needs per rank against what this node has,
// the backend's memory (a GPU's; the host's on the CPU backend) and the host memory of the
// prefetched data. A run that cannot fit stops with a bad_input Error (exit 2) that names the
// largest need and the options that set it, instead of running out of memory minutes (or an
// hour of swapping) later. docs/TRAINING.md, "Memory".
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "model/memory_plan.hpp"
#include "train/train_config.hpp"

namespace l3::train {

// The memory plan's input for a training run of `config` on `model` with `ranks` ranks.
[[nodiscard]] model::MemoryPlanInput memory_plan_input(const TrainConfig& config,
                                                       const model::ModelConfig& model, bool cuda,
                                                       int ranks);

// Host bytes of one rank's prefetched steps (the data loader's ring of --prefetch-depth steps
// and the one in use: tokens, targets, masks, positions, segments and the rows read from the
// shards), for a step of `rows` rows of `seq_len` tokens per rank.
[[nodiscard]] std::int64_t prefetch_host_bytes(std::int64_t rows, std::int64_t seq_len, int depth);

struct MemoryNeed {
  std::vector<model::MemoryLine> backend;  // in the backend's memory, per rank
  std::int64_t host = 0;                   // in host memory besides, per rank
  std::string_view remedy;                 // which options lower it, for the message
};

// bad_input Error on every rank (they agree) when `need` does not fit: the backend's part in
// ops.memory_capacity() (or, on the CPU backend, with the host part in this node's memory
// shared by its ranks), the host part in host memory. L3_MEMORY_PER_RANK_MIB=M sets what a rank
// has instead (the GPU's part, or on the CPU backend the rank's share of the node): a node
// shared with other jobs, or a test of what fits.
void require_memory(const dist::World& world, const kernels::Ops& ops, const MemoryNeed& need);

}  // namespace l3::train
