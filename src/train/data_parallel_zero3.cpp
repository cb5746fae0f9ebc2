// DataParallel's ZeRO-3 half: the parameter window the model reads its weights through, each
// gradient group all-gathered from the optimizers' master pieces into a gather slot when the
// model acquires it. See data_parallel.hpp.
#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "train/data_parallel.hpp"

namespace l3::train {

void DataParallel::setup_gather_slots() {
  // The same shapes as ZeRO-2's gradient slots (model::gradient_slot_elements): two of the
  // largest group, and the tied embedding's group, which the lm_head reads too, apart.
  std::int64_t largest = 0;
  const std::vector<model::FlatRange>& groups = plan_.groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g != pinned_group_) largest = std::max(largest, groups[g].size());
  }
  const kernels::DType dtype = ops_.compute_dtype();
  gather_slots_[0] = ops_.allocate(dtype, largest);
  gather_slots_[1] = ops_.allocate(dtype, largest);
  if (pinned_group_ != kNoGroup) {
    gather_slots_[kPinnedSlot] = ops_.allocate(dtype, groups[pinned_group_].size());
  }
  gather_state_.assign(groups.size(), GatherState{});
}

std::int64_t DataParallel::gather_slot_bytes() const noexcept {
  std::int64_t bytes = 0;
  for (const kernels::Buffer& s : gather_slots_) bytes += static_cast<std::int64_t>(s.bytes());
  return bytes;
}

void DataParallel::acquire(std::size_t group, model::Pass /*pass*/) {
  if (!config_.shard_parameters) {
    throw core::internal_error("DataParallel: a parameter window without parameter sharding");
  }
  GatherState& state = gather_state_.at(group);
  if (state.slot < 0) {
    int slot = kPinnedSlot;
    if (group != pinned_group_) {
      // The alternating slot, unless its group is still held: then the other one.
      slot = next_gather_slot_;
      const std::size_t owner = gather_owner_[static_cast<std::size_t>(slot)];
      if (owner != kNoGroup && gather_state_[owner].holds > 0) slot = 1 - slot;
      const std::size_t other = gather_owner_[static_cast<std::size_t>(slot)];
      if (other != kNoGroup && gather_state_[other].holds > 0) {
        throw core::internal_error(fmt::format(
            "DataParallel: gradient group {} acquired while two others are held", group));
      }
      next_gather_slot_ = 1 - slot;
    }
    const std::size_t evicted = gather_owner_[static_cast<std::size_t>(slot)];
    if (evicted != kNoGroup) gather_state_[evicted].slot = -1;
    gather_owner_[static_cast<std::size_t>(slot)] = group;
    state.slot = slot;
    const core::Stopwatch watch;
    gather(group, gather_slots_[static_cast<std::size_t>(slot)].view());
    times_.gather_seconds += watch.seconds();
  }
  ++state.holds;
}

void DataParallel::gather(std::size_t group, kernels::TensorView slot) {
  const model::FlatRange span = plan_.groups()[group];
  const auto [first, last] = plan_.group_buckets(group);
  // This rank's pieces from its optimizers' master weights, then every other rank's.
  for (std::size_t b = first; b < last; ++b) {
    const model::FlatRange p = plan_.piece(b, rank_);
    if (p.size() > 0) {
      ops_.copy(slot.slice(p.begin - span.begin, p.size()), optimizer_.of_bucket(b).own_master());
    }
  }
  if (gather_exchange_ == nullptr) return;
  for (std::size_t b = first; b < last; ++b) {
    std::vector<model::FlatRange> pieces = plan_.pieces(b);
    for (model::FlatRange& p : pieces) p = {p.begin - span.begin, p.end - span.begin};
    const model::FlatRange whole = plan_.buckets()[b];
    gather_exchange_->all_gather(slot, {whole.begin - span.begin, whole.end - span.begin}, pieces);
  }
  gather_exchange_->join();
}

void DataParallel::forget_gathered() {
  for (GatherState& s : gather_state_) {
    if (s.holds > 0) {
      throw core::internal_error("DataParallel: weights changed while a group is held");
    }
    s.slot = -1;
  }
  gather_owner_.fill(kNoGroup);
}

kernels::ConstTensorView DataParallel::parameters(std::int64_t offset, std::int64_t numel) {
  const std::size_t g = plan_.group_at(offset);
  if (g == plan_.groups().size() || offset + numel > plan_.groups()[g].end ||
      gather_state_[g].holds == 0) {
    throw core::internal_error(
        fmt::format("DataParallel: weights [{}, {}) read outside an acquired gradient group",
                    offset, offset + numel));
  }
  const model::FlatRange span = plan_.groups()[g];
  return gather_slots_[static_cast<std::size_t>(gather_state_[g].slot)].slice(offset - span.begin,
                                                                              numel);
}

void DataParallel::release(std::size_t group) noexcept {
  // The gathered weights stay in their slot until another group needs it: a group acquired
  // again before that (the tied embedding) is not gathered twice. An update changes the
  // weights: update() forgets every gathered group.
  GatherState& state = gather_state_[group];
  if (state.holds > 0) --state.holds;
}

}  // namespace l3::train
