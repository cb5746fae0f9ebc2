// ZeRO-2's gradient window (model/gradient_window.hpp), DataParallel's counterpart of
// ParameterGather: the model's backward writes each gradient group (ParameterLayout::
// gradient_groups: the head, a block, the embedding) into one of two slots the size of the
// largest group (the tied embedding, written first and complete last, into a slot of its own).
// A group reported complete has its buckets (which never cross groups) reduce-scattered at once,
// in every micro-batch; before its slot is reused, the reduced pieces this rank owns are added
// into the optimizers' gradients (AdamW::own_gradients).
//
// A group is resident (in a slot, being written), released (its reductions launched: ticket)
// and retired (added into the optimizers, slot free) in each micro-batch. Every rank releases
// every group once per micro-batch, from the last to the first, whatever its backward touched,
// so the reductions match across ranks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/ops.hpp"
#include "model/gradient_window.hpp"
#include "parallel/reduction_scheduler.hpp"
#include "parallel/shard_plan.hpp"
#include "parallel/sharded_optimizer.hpp"

namespace l3::parallel {

class GradientSlots final : public model::GradientWindow {
 public:
  // The slots for `plan`'s groups (by_group plan) in the compute dtype; `pinned_group`: the
  // tied embedding's group (kNoGroup when the lm_head is not tied). Reductions are launched on
  // `scheduler`, and this rank's (`rank` in the shard group) reduced pieces are added into
  // `optimizer`'s gradients.
  static constexpr std::size_t kNoGroup = static_cast<std::size_t>(-1);
  GradientSlots(kernels::Ops& ops, const ShardPlan& plan, ReductionScheduler& scheduler,
                ShardedOptimizer& optimizer, int rank, std::size_t pinned_group);

  // A new step: nothing resident, nothing pending, the optimizers' gradients zeroed.
  void begin_step();
  void begin_micro_batch();
  kernels::TensorView gradients(std::int64_t offset, std::int64_t numel) override;
  void ready(std::int64_t offset) override;
  // Every pending group retired (after the step's last micro-batch).
  void finish();

  // Where bucket b's gradients are, while its group is resident: the slot and the layout
  // position of its element 0.
  [[nodiscard]] std::pair<kernels::TensorView, std::int64_t> bucket_storage(std::size_t b) const;
  [[nodiscard]] std::int64_t bytes() const noexcept;

 private:
  struct GroupState {
    int slot = -1;  // 0, 1, kPinnedSlot; -1: none
    bool released = false;
    bool pending = false;  // released, not yet retired
    std::uint64_t ticket = 0;
  };
  static constexpr int kPinnedSlot = 2;

  void take_slot(std::size_t group);  // a slot for the group, zeroed
  void launch(std::size_t group);     // its reductions launched
  void retire(std::size_t group);     // its reductions done, added into the optimizers
  [[nodiscard]] kernels::TensorView slot_view(std::size_t group) const;

  kernels::Ops& ops_;
  const ShardPlan& plan_;
  ReductionScheduler& scheduler_;
  ShardedOptimizer& optimizer_;
  int rank_;
  std::size_t pinned_group_;
  std::vector<GroupState> group_state_;
  std::array<kernels::Buffer, 3> slots_;  // two alternating, one for the pinned group
  std::array<std::size_t, 3> slot_owner_{kNoGroup, kNoGroup, kNoGroup};
  int next_slot_ = 0;
};

}  // namespace l3::parallel
