// The parameter window of ZeRO-3 (model/parameter_window.hpp) over ranks that each hold one piece
// of every bucket of a ShardPlan (by_group: buckets never cross a gradient group): when the model
// acquires a group, its weights are all-gathered from the pieces' owners into a gather slot, and
// released after the pass is done with them. Two slots the size of the largest group alternate;
// the tied embedding (the lm_head reads it at the end of the forward pass, long after the
// embedding) has a third of its own. A gathered group stays in its slot until the slot is needed
// again, so that a group acquired twice in a row is gathered once; forget() drops them all (the
// weights changed).
//
// Prefetch: when a group is acquired, the group the pass reads next (the next one in a forward
// pass, the previous one in a backward pass, down to the first block: the embedding's backward
// reads no weight) is gathered into the other slot on a thread of its own while this one
// computes. Every rank acquires the same groups in the same order (a rank without data runs a
// batch of no rows, LlamaModel::load_batch), so every rank predicts the same group and the gathers
// stay collective; one gather at a time runs on the window's communicator (a duplicate of the shard
// group's), which meets no other traffic.
//
// How a gather runs depends on the exchange (gradient_exchange.hpp):
//   - MPI on host memory (the CPU backend): on the acquiring thread, or for a prefetch on a thread
//     of its own, which the next acquire waits for.
//   - queued (NCCL on the CUDA backend): this rank's pieces are copied into the slot on the
//     compute stream (converted to the compute dtype on the way: the fp32 master pieces become
//     the bf16 weights the model reads, rounded as the update rounds its bf16 copy), and the
//     all-gather is queued on the exchange's communication stream behind that copy and behind
//     every kernel queued so far (those reading the slot's previous group included). The ticket
//     of the gather (GradientExchange::mark) is joined by the compute stream when the group is
//     acquired: a prefetched group's all-gather runs on the communication stream while the
//     current group's kernels run on the compute stream, and the host never waits.
//   - MPI staged through host buffers (the GPU fallback): on the acquiring thread only (no
//     prefetch: the staging buffers are not thread-safe).
//
// Used by DataParallel (training: the pieces are the optimizers' master weights) and by the
// evaluation of a sharded model (the pieces loaded by each rank).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>

#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "model/parameter_layout.hpp"
#include "model/parameter_window.hpp"
#include "parallel/exchange_choice.hpp"
#include "parallel/gradient_exchange.hpp"
#include "parallel/shard_plan.hpp"

namespace l3::parallel {

struct GatherTimes {
  // The gathers' own time, on whichever thread ran them (queued: the host's time to queue them).
  double gather_seconds = 0;
  double wait_seconds = 0;      // the thread that acquires blocked on them (queued: 0)
  std::int64_t gathers = 0;     // groups gathered
  std::int64_t prefetched = 0;  // of which started before they were acquired
};

class ParameterGather final : public model::ParameterWindow {
 public:
  // This rank's piece of bucket b (plan.piece(b, shards.rank()) elements, any dtype ops.copy
  // converts from); called from the prefetch thread too, so it must only read.
  using OwnPiece = std::function<kernels::ConstTensorView(std::size_t bucket)>;
  static constexpr std::size_t kNoGroup = static_cast<std::size_t>(-1);

  // Collective over `shards` (the ranks the plan's pieces are spread over). `pinned_group`: the
  // tied embedding's group (kNoGroup when the lm_head is not tied).
  ParameterGather(const dist::World& shards, kernels::Ops& ops, const ShardPlan& plan,
                  OwnPiece own_piece, ExchangeChoice exchange, bool prefetch,
                  std::size_t pinned_group);
  ~ParameterGather() override;
  ParameterGather(const ParameterGather&) = delete;
  ParameterGather& operator=(const ParameterGather&) = delete;
  ParameterGather(ParameterGather&&) = delete;
  ParameterGather& operator=(ParameterGather&&) = delete;

  void acquire(std::size_t group, model::Pass pass) override;
  [[nodiscard]] kernels::ConstTensorView parameters(std::int64_t offset,
                                                    std::int64_t numel) override;
  void release(std::size_t group) noexcept override;

  // The pieces changed: every group is gathered again when next acquired (no group may be held).
  void forget();
  // The times since the last call, and the counters reset.
  [[nodiscard]] GatherTimes take_times() noexcept;
  // Bytes of the gather slots.
  [[nodiscard]] std::int64_t slot_bytes() const noexcept;

 private:
  struct GroupState {
    int slot = -1;  // 0, 1, kPinnedSlot; -1: not gathered
    int holds = 0;
  };
  static constexpr int kPinnedSlot = 2;

  // A slot for `group` (not one a held group is in), its previous group forgotten.
  [[nodiscard]] int claim_slot(std::size_t group);
  // The slot's previous group forgotten, nothing gathered there.
  void abandon_slot(std::size_t group) noexcept;
  // Gathers (queued: queues) the group into the slot.
  void gather(std::size_t group, kernels::TensorView slot);
  // Starts gathering the group after `group` in `pass`, when there is one and a free slot.
  void prefetch_after(std::size_t group, model::Pass pass);
  // The prefetch in flight, if any, done (its errors rethrown); queued: the compute stream
  // waits for it.
  void wait_prefetch();
  [[nodiscard]] bool queued() const noexcept { return exchange_ != nullptr && exchange_->queued(); }

  kernels::Ops& ops_;
  const ShardPlan& plan_;
  OwnPiece own_piece_;
  int rank_;
  bool prefetch_;
  std::size_t pinned_group_;
  std::unique_ptr<GradientExchange> exchange_;  // null on one rank
  std::vector<GroupState> state_;
  std::array<kernels::Buffer, 3> slots_;  // two alternating, one for the tied embedding
  std::array<std::size_t, 3> owner_{kNoGroup, kNoGroup, kNoGroup};
  int next_slot_ = 0;
  std::future<double> in_flight_;       // host: the prefetch's seconds; invalid: none
  std::uint64_t in_flight_ticket_ = 0;  // queued: the prefetch's ticket
  std::size_t in_flight_group_ = kNoGroup;
  GatherTimes times_;
};

}  // namespace l3::parallel
