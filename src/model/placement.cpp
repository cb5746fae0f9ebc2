#include "model/placement.hpp"

#include <fmt/format.h>

namespace l3::model {

Placement Placement::frozen(bool sharded, int ranks) noexcept {
  return {.stage = sharded ? ZeroStage::parameters : ZeroStage::replicated,
          .ranks = ranks,
          .frozen_model = true,
          .forward_only = true};
}

std::string Placement::stage_name() const {
  switch (stage) {
    case ZeroStage::replicated:
      return "0 (off)";
    case ZeroStage::optimizer:
      return "1";
    case ZeroStage::gradients:
      return "2";
    case ZeroStage::parameters:
      if (frozen_model) {
        return fmt::format("2 over the adapters, the frozen model sharded (1/{} on each rank)",
                           ranks);
      }
      return hybrid() ? fmt::format("3 (hybrid: shard groups of {} ranks)", shard_group) : "3";
  }
  return "?";
}

std::string Placement::grid() const {
  if (context_parallel <= 1 && tensor_parallel <= 1) return {};
  std::string out;
  if (tensor_parallel > 1) out += fmt::format("tensor parallel {} x ", tensor_parallel);
  if (context_parallel > 1) out += fmt::format("context parallel {} x ", context_parallel);
  return out + fmt::format("data parallel {}", data_parallel_ranks());
}

std::string Placement::reduction_description(bool overlapping) const {
  if (shards_frozen_weights())
    return "of every micro-batch, the frozen weights all-gathered group by group";
  if (shards_trained_weights()) return "of every micro-batch, weights all-gathered group by group";
  if (shards_gradients()) return "of every micro-batch";
  return overlapping ? "overlapped with the backward pass" : "after the backward";
}

}  // namespace l3::model
