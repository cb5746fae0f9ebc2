// DataParallel's ZeRO-2 half: the gradient window the model writes into (two alternating slots
// and one for the tied embedding), the per-group reductions, and the reduced pieces added into
// the optimizers' gradients. See data_parallel.hpp.
#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "core/error.hpp"
#include "train/data_parallel.hpp"

namespace l3::train {

void DataParallel::make_group_buckets(std::int64_t bucket) {
  groups_ = layout_.gradient_groups();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const std::size_t first = buckets_.size();
    const std::vector<Range> cut = cut_buckets({groups_[g].begin, groups_[g].end}, bucket);
    buckets_.insert(buckets_.end(), cut.begin(), cut.end());
    group_buckets_.emplace_back(first, buckets_.size());
    bucket_group_.insert(bucket_group_.end(), cut.size(), g);
  }
}

void DataParallel::setup_gradient_slots() {
  if (layout_.lm_head_tied()) {
    pinned_group_ = 0;  // the lm_head's gradients land in the embedding's group first
  }
  std::int64_t largest = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (g != pinned_group_) largest = std::max(largest, groups_[g].size());
  }
  const kernels::DType dtype = ops_.compute_dtype();
  slots_[0] = ops_.allocate(dtype, largest);
  slots_[1] = ops_.allocate(dtype, largest);
  if (pinned_group_ != kNoGroup) slots_[kPinnedSlot] = ops_.allocate(dtype, groups_[0].size());
  group_state_.assign(groups_.size(), GroupState{});
}

std::int64_t DataParallel::gradient_slot_bytes() const noexcept {
  std::int64_t bytes = 0;
  for (const kernels::Buffer& s : slots_) bytes += static_cast<std::int64_t>(s.view().bytes());
  return bytes;
}

kernels::TensorView DataParallel::slot_view(std::size_t group) const {
  const int slot = group_state_[group].slot;
  return slots_.at(static_cast<std::size_t>(slot)).slice(0, groups_[group].size());
}

void DataParallel::begin_micro_batch() {
  if (!config_.shard_gradients) return;
  for (GroupState& g : group_state_) g.released = false;
}

kernels::TensorView DataParallel::gradients(std::int64_t offset, std::int64_t numel) {
  if (!config_.shard_gradients) {
    throw core::internal_error("DataParallel: a gradient window without --shard-gradients");
  }
  // The group holding offset: the last whose begin is at or before it.
  const auto it =
      std::upper_bound(groups_.begin(), groups_.end(), offset,
                       [](std::int64_t o, const model::LayoutSpan& g) { return o < g.begin; });
  const auto g = static_cast<std::size_t>(it - groups_.begin()) - 1;
  if (it == groups_.begin() || offset + numel > groups_[g].end) {
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
  if (state.slot < 0 || state.pending) acquire(g);
  return slot_view(g).slice(offset - groups_[g].begin, numel);
}

void DataParallel::ready(std::int64_t offset) {
  if (!config_.shard_gradients) return;
  // Every rank releases every group once per micro-batch, from the last to the first, so the
  // reductions match across ranks whatever each rank's backward touched.
  for (std::size_t g = groups_.size(); g-- > 0;) {
    if (groups_[g].begin < offset) break;
    if (group_state_[g].released) continue;
    if (group_state_[g].slot < 0 || group_state_[g].pending) acquire(g);
    release(g);
  }
}

void DataParallel::acquire(std::size_t group) {
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

void DataParallel::release(std::size_t group) {
  GroupState& state = group_state_[group];
  state.released = true;
  state.pending = true;
  if (!exchange_) return;
  const auto [first, last] = group_buckets_[group];
  if (worker_thread_) {
    {
      const std::scoped_lock lock(mutex_);
      for (std::size_t b = last; b-- > first;) queue_.push_back(b);
      launched_ += last - first;
      state.ticket = launched_;
    }
    changed_.notify_all();
    return;
  }
  // Queued on the exchange's stream, or done here and now.
  for (std::size_t b = last; b-- > first;) reduce_bucket(b);
  state.ticket = exchange_->mark();
}

void DataParallel::retire(std::size_t group) {
  GroupState& state = group_state_[group];
  if (exchange_ && worker_thread_) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_ >= state.ticket || failure_ != nullptr; });
    if (failure_) std::rethrow_exception(failure_);
  } else if (exchange_) {
    exchange_->join_ticket(state.ticket);
  }
  // This rank's reduced pieces, added into what the optimizers keep for the step.
  const kernels::TensorView slot = slot_view(group);
  const auto [first, last] = group_buckets_[group];
  for (std::size_t b = first; b < last; ++b) {
    const Range p = piece(b, rank_);
    if (p.size() == 0) continue;
    ops_.add_into(optimizers_[b].own_gradients(),
                  slot.slice(p.begin - groups_[group].begin, p.size()), p.size());
  }
  slot_owner_[static_cast<std::size_t>(state.slot)] = kNoGroup;
  state.slot = -1;
  state.pending = false;
}

void DataParallel::finish_group_reductions() {
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (group_state_[g].slot >= 0 && !group_state_[g].pending) {
      throw core::internal_error(
          fmt::format("gradient group {} was written but never reported complete", g));
    }
  }
  // Any order: each waits for its own reductions.
  for (std::size_t g = groups_.size(); g-- > 0;) {
    if (group_state_[g].pending) retire(g);
  }
}

}  // namespace l3::train
