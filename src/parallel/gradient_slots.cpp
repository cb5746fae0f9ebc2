#include "parallel/gradient_slots.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"

namespace l3::parallel {

GradientSlots::GradientSlots(kernels::Ops& ops, const ShardPlan& plan,
                             ReductionScheduler& scheduler, ShardedOptimizer& optimizer, int rank,
                             std::size_t pinned_group)
    : ops_(ops),
      plan_(plan),
      scheduler_(scheduler),
      optimizer_(optimizer),
      rank_(rank),
      pinned_group_(pinned_group) {
  std::int64_t largest = 0;
  const std::vector<model::FlatRange>& groups = plan_.groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g != pinned_group_) largest = std::max(largest, groups[g].size());
  }
  const kernels::DType dtype = ops_.compute_dtype();
  slots_[0] = ops_.allocate(dtype, largest);
  slots_[1] = ops_.allocate(dtype, largest);
  if (pinned_group_ != kNoGroup) slots_[kPinnedSlot] = ops_.allocate(dtype, groups[0].size());
  group_state_.assign(groups.size(), GroupState{});
}

void GradientSlots::begin_step() {
  for (train::AdamW& o : optimizer_.optimizers()) ops_.zero(o.own_gradients());
  for (GroupState& g : group_state_) g = {};
  slot_owner_.fill(kNoGroup);
}

std::pair<kernels::TensorView, std::int64_t> GradientSlots::bucket_storage(std::size_t b) const {
  const std::size_t g = plan_.group_of_bucket(b);
  return {slot_view(g), plan_.groups()[g].begin};
}

std::int64_t GradientSlots::bytes() const noexcept {
  std::int64_t bytes = 0;
  for (const kernels::Buffer& s : slots_) bytes += static_cast<std::int64_t>(s.view().bytes());
  return bytes;
}

kernels::TensorView GradientSlots::slot_view(std::size_t group) const {
  const int slot = group_state_[group].slot;
  return slots_.at(static_cast<std::size_t>(slot)).slice(0, plan_.groups()[group].size());
}

void GradientSlots::begin_micro_batch() {
  for (GroupState& g : group_state_) g.released = false;
}

kernels::TensorView GradientSlots::gradients(std::int64_t offset, std::int64_t numel) {
  const std::vector<model::FlatRange>& groups = plan_.groups();
  const std::size_t g = plan_.group_at(offset);
  if (g == groups.size() || offset + numel > groups[g].end) {
    throw core::internal_error(fmt::format("gradients [{}, {}) are not within one gradient group",
                                           offset, offset + numel));
  }
  GroupState& state = group_state_[g];
  if (state.released) {
    throw core::internal_error(
        fmt::format("gradients [{}, {}) written after their group was reported complete", offset,
                    offset + numel));
  }
  // Not resident in this micro-batch yet (perhaps still pending from the previous one).
  if (state.slot < 0 || state.pending) take_slot(g);
  return slot_view(g).slice(offset - groups[g].begin, numel);
}

void GradientSlots::ready(std::int64_t offset) {
  const std::vector<model::FlatRange>& groups = plan_.groups();
  for (std::size_t g = groups.size(); g-- > 0;) {
    if (groups[g].begin < offset) break;
    if (group_state_[g].released) continue;
    if (group_state_[g].slot < 0 || group_state_[g].pending) take_slot(g);
    launch(g);
  }
}

void GradientSlots::take_slot(std::size_t group) {
  // Still pending from the previous micro-batch: its reduced pieces go into the optimizers
  // before its slot, or another, takes this micro-batch's gradients.
  if (group_state_[group].pending) retire(group);
  int slot = kPinnedSlot;
  if (group != pinned_group_) {
    slot = next_slot_;
    next_slot_ = 1 - next_slot_;
  }
  const std::size_t previous = slot_owner_[static_cast<std::size_t>(slot)];
  if (previous != kNoGroup) {
    if (!group_state_[previous].pending) {
      throw core::internal_error(
          fmt::format("gradient group {} needs the slot of group {}, which is still being written",
                      group, previous));
    }
    retire(previous);
  }
  group_state_[group].slot = slot;
  slot_owner_[static_cast<std::size_t>(slot)] = group;
  ops_.zero(slot_view(group));
}

void GradientSlots::launch(std::size_t group) {
  GroupState& state = group_state_[group];
  state.released = true;
  state.pending = true;
  if (scheduler_.exchange() == nullptr) return;
  const auto [first, last] = plan_.group_buckets(group);
  std::vector<std::size_t> buckets;  // the last first
  for (std::size_t b = last; b-- > first;) buckets.push_back(b);
  scheduler_.launch(buckets);
  state.ticket = scheduler_.ticket();
}

void GradientSlots::retire(std::size_t group) {
  GroupState& state = group_state_[group];
  scheduler_.wait(state.ticket);
  // This rank's reduced pieces, added into what the optimizers keep for the step.
  const kernels::TensorView slot = slot_view(group);
  const auto [first, last] = plan_.group_buckets(group);
  const std::int64_t origin = plan_.groups()[group].begin;
  for (std::size_t b = first; b < last; ++b) {
    const model::FlatRange p = plan_.piece(b, rank_);
    if (p.size() == 0) continue;
    ops_.add_into(optimizer_.of_bucket(b).own_gradients(), slot.slice(p.begin - origin, p.size()));
  }
  slot_owner_[static_cast<std::size_t>(state.slot)] = kNoGroup;
  state.slot = -1;
  state.pending = false;
}

void GradientSlots::finish() {
  for (std::size_t g = 0; g < group_state_.size(); ++g) {
    if (group_state_[g].slot >= 0 && !group_state_[g].pending) {
      throw core::internal_error(
          fmt::format("gradient group {} was written but never reported complete", g));
    }
  }
  // Any order: each waits for its own reductions.
  for (std::size_t g = group_state_.size(); g-- > 0;) {
    if (group_state_[g].pending) retire(g);
  }
}

}  // namespace l3::parallel
