#include "parallel/parameter_gather.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/error.hpp"
#include "core/timer.hpp"

namespace l3::parallel {

ParameterGather::ParameterGather(const dist::World& shards, kernels::Ops& ops,
                                 const ShardPlan& plan, OwnPiece own_piece, ExchangeChoice exchange,
                                 bool prefetch, std::size_t pinned_group)
    : ops_(ops),
      plan_(plan),
      own_piece_(std::move(own_piece)),
      rank_(shards.rank()),
      prefetch_(prefetch),
      pinned_group_(pinned_group) {
  if (!plan.by_group()) {
    throw core::internal_error("ParameterGather: the plan's buckets must follow the groups");
  }
  const std::vector<model::FlatRange>& groups = plan_.groups();
  // The shapes of ZeRO-2's gradient slots (model::gradient_slot_elements).
  std::int64_t largest = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g != pinned_group_) largest = std::max(largest, groups[g].size());
  }
  const kernels::DType dtype = ops_.compute_dtype();
  slots_[0] = ops_.allocate(dtype, largest);
  slots_[1] = ops_.allocate(dtype, largest);
  if (pinned_group_ != kNoGroup)
    slots_[kPinnedSlot] = ops_.allocate(dtype, groups[pinned_group_].size());
  state_.assign(groups.size(), GroupState{});
  if (shards.size() > 1) {
    exchange_ = make_gradient_exchange(shards, ops, exchange);
    // Staged through host buffers (the GPU fallback's path): on the acquiring thread only.
    if (!exchange_->queued() && !exchange_->host_thread_safe()) prefetch_ = false;
  }
}

ParameterGather::~ParameterGather() {
  // A prefetch still running writes into a slot: it finishes first (its error, if any, has no
  // one left to report to). Queued: the compute stream, on which the slots are freed, waits for it.
  if (in_flight_.valid()) in_flight_.wait();
  if (queued() && in_flight_group_ != kNoGroup) {
    try {
      exchange_->join_ticket(in_flight_ticket_);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a failed exchange is reported elsewhere
    }
  }
}

std::int64_t ParameterGather::slot_bytes() const noexcept {
  std::int64_t bytes = 0;
  for (const kernels::Buffer& s : slots_) bytes += static_cast<std::int64_t>(s.bytes());
  return bytes;
}

GatherTimes ParameterGather::take_times() noexcept { return std::exchange(times_, {}); }

void ParameterGather::abandon_slot(std::size_t group) noexcept {
  const int slot = state_[group].slot;
  if (slot >= 0) owner_[static_cast<std::size_t>(slot)] = kNoGroup;
  state_[group].slot = -1;
}

int ParameterGather::claim_slot(std::size_t group) {
  int slot = kPinnedSlot;
  if (group != pinned_group_) {
    const auto held = [&](int s) {
      const std::size_t owner = owner_[static_cast<std::size_t>(s)];
      return owner != kNoGroup && state_[owner].holds > 0;
    };
    // The alternating slot, unless its group is still held: then the other one.
    slot = next_slot_;
    if (held(slot)) slot = 1 - slot;
    if (held(slot)) {
      throw core::internal_error(fmt::format(
          "ParameterGather: gradient group {} acquired while two others are held", group));
    }
    next_slot_ = 1 - slot;
  }
  const std::size_t evicted = owner_[static_cast<std::size_t>(slot)];
  if (evicted != kNoGroup) state_[evicted].slot = -1;
  owner_[static_cast<std::size_t>(slot)] = group;
  state_[group].slot = slot;
  return slot;
}

void ParameterGather::acquire(std::size_t group, model::Pass pass) {
  GroupState& state = state_.at(group);
  if (group == in_flight_group_) {
    wait_prefetch();
  } else if (state.slot < 0) {
    wait_prefetch();  // one gather at a time on the communicator, in the same order everywhere
    const int slot = claim_slot(group);
    const core::Stopwatch watch;
    try {
      gather(group, slots_[static_cast<std::size_t>(slot)].view());
      if (exchange_ != nullptr) exchange_->join();  // queued: the compute stream waits for it
    } catch (...) {
      abandon_slot(group);
      throw;
    }
    times_.gather_seconds += watch.seconds();
    if (!queued()) times_.wait_seconds += watch.seconds();
    ++times_.gathers;
  }
  ++state.holds;
  if (prefetch_ && exchange_ != nullptr) prefetch_after(group, pass);
}

void ParameterGather::gather(std::size_t group, kernels::TensorView slot) {
  const model::FlatRange span = plan_.groups()[group];
  const auto [first, last] = plan_.group_buckets(group);
  // This rank's pieces, then every other rank's.
  for (std::size_t b = first; b < last; ++b) {
    const model::FlatRange p = plan_.piece(b, rank_);
    if (p.size() > 0) ops_.copy(slot.slice(p.begin - span.begin, p.size()), own_piece_(b));
  }
  if (exchange_ == nullptr) return;
  for (std::size_t b = first; b < last; ++b) {
    std::vector<model::FlatRange> pieces = plan_.pieces(b);
    for (model::FlatRange& p : pieces) p = {p.begin - span.begin, p.end - span.begin};
    const model::FlatRange whole = plan_.buckets()[b];
    exchange_->all_gather(slot, {whole.begin - span.begin, whole.end - span.begin}, pieces);
  }
}

void ParameterGather::prefetch_after(std::size_t group, model::Pass pass) {
  if (in_flight_group_ != kNoGroup) return;
  std::size_t next = 0;
  if (pass == model::Pass::forward) {
    next = group + 1;
    if (next >= state_.size()) return;
  } else {
    if (group <= 1) return;
    next = group - 1;
  }
  if (state_[next].slot >= 0) return;  // gathered already
  if (next != pinned_group_) {
    const auto held = [&](std::size_t s) {
      return owner_[s] != kNoGroup && state_[owner_[s]].holds > 0;
    };
    if (held(0) && held(1)) return;  // no free slot: gathered when acquired
  }
  const int slot = claim_slot(next);
  const kernels::TensorView target = slots_[static_cast<std::size_t>(slot)].view();
  ++times_.gathers;
  ++times_.prefetched;
  if (queued()) {
    // Queued behind the kernels queued so far; the acquire of `next` joins its ticket.
    const core::Stopwatch watch;
    try {
      gather(next, target);
      in_flight_ticket_ = exchange_->mark();
    } catch (...) {
      abandon_slot(next);
      throw;
    }
    times_.gather_seconds += watch.seconds();
    in_flight_group_ = next;
    return;
  }
  in_flight_group_ = next;
  in_flight_ = std::async(std::launch::async, [this, next, target] {
    const core::Stopwatch watch;
    gather(next, target);
    return watch.seconds();
  });
}

void ParameterGather::wait_prefetch() {
  if (in_flight_group_ == kNoGroup) return;
  const core::Stopwatch watch;
  const std::size_t group = std::exchange(in_flight_group_, kNoGroup);
  try {
    if (queued()) {
      exchange_->join_ticket(in_flight_ticket_);
      return;
    }
    times_.gather_seconds += in_flight_.get();
  } catch (...) {
    // The slot holds no complete weights: forget it, then report.
    abandon_slot(group);
    throw;
  }
  times_.wait_seconds += watch.seconds();
}

void ParameterGather::forget() {
  wait_prefetch();
  for (GroupState& s : state_) {
    if (s.holds > 0) {
      throw core::internal_error("ParameterGather: the weights changed while a group is held");
    }
    s.slot = -1;
  }
  owner_.fill(kNoGroup);
}

kernels::ConstTensorView ParameterGather::parameters(std::int64_t offset, std::int64_t numel) {
  const std::size_t g = plan_.group_at(offset);
  if (g == plan_.groups().size() || offset + numel > plan_.groups()[g].end ||
      state_[g].holds == 0) {
    throw core::internal_error(
        fmt::format("ParameterGather: weights [{}, {}) read outside an acquired gradient group",
                    offset, offset + numel));
  }
  const model::FlatRange span = plan_.groups()[g];
  return slots_[static_cast<std::size_t>(state_[g].slot)].slice(offset - span.begin, numel);
}

void ParameterGather::release(std::size_t group) noexcept {
  // The gathered weights stay in their slot until another group needs it: a group acquired
  // again before that (the tied embedding) is not gathered twice.
  GroupState& state = state_[group];
  if (state.holds > 0) --state.holds;
}

}  // namespace l3::parallel
