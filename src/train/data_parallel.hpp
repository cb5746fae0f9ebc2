// Data parallelism over the ranks of a World, with a ZeRO-1 sharded optimizer.
//
// The flat gradient buffer is cut into buckets (contiguous ranges, the last one first because
// the backward pass finishes the gradients from the end of the layout to its start). Each
// bucket is split into one piece per rank. During the backward pass of a step's last
// micro-batch, each bucket whose gradients are complete is reduce-scattered (rank r receives
// the global sum of piece r) by a GradientExchange: MPI on a communication thread (CPU), or
// NCCL on a communication stream (GPU). Reduction of the late layers thus overlaps the
// backward of the early ones.
//
// ZeRO-1 (shard_optimizer): rank r owns the AdamW state of its pieces only (1/W of the
// optimizer memory), updates them, and the updated parameters are all-gathered bucket by
// bucket. When the model computes in bf16, the fp32 master weights are sharded the same way
// (shard_master): rank r keeps the master of its pieces only, writes their bf16 copy, and the
// bf16 weights are what is all-gathered. Without sharding, the reduced pieces are
// all-gathered instead and every rank runs AdamW on the whole buffer. Both give bit-identical
// weights: the same reduced gradients, the same elementwise update, and a gradient norm summed
// piece by piece in a fixed order (not in MPI's order), so it does not depend on how the work was
// split either.
//
// ZeRO-2 (shard_gradients, with shard_optimizer): the model holds no gradient buffer. Its
// backward writes each gradient group (ParameterLayout::gradient_groups: the head, a block, the
// embedding) into one of two slots the size of the largest group (the tied embedding, written
// first and complete last, into a slot of its own); a completed group's buckets, which never
// cross groups then, are reduce-scattered at once, in every micro-batch, and before its slot is
// reused the reduced pieces this rank owns are added into the optimizers' gradients
// (AdamW::own_gradients). Gradient memory per rank: two groups plus 1/W of the model, instead of
// the whole model. One micro-batch per step on up to two ranks gives ZeRO-1's weights bit for
// bit (the buckets differ, so the gradient norm's summation order does, by an ulp or so; on
// more ranks MPI's or NCCL's order of the ranks' terms may differ with the bucket too); with
// several micro-batches, each is reduced across ranks before they are added up (ZeRO-1 adds
// them up first), which rounds differently.
//
// Pieces and buckets start at multiples of ParameterLayout::kAlignment elements, so every
// element is updated by the same vector code path whatever the number of ranks.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "model/gradient_window.hpp"
#include "model/parameter_layout.hpp"
#include "train/adamw_optimizer.hpp"
#include "train/gradient_exchange.hpp"

namespace l3::train {

struct DataParallelConfig {
  std::int64_t bucket_elements = std::int64_t{8} << 20;  // 32 MiB of fp32 gradients
  bool shard_optimizer = true;                           // ZeRO-1
  bool shard_gradients = false;                          // ZeRO-2 (needs shard_optimizer)
  // ZeRO-2: the reduced gradients each rank keeps are fp32, so that several micro-batches per
  // step add up without a bf16 rounding each; false: the compute dtype (one micro-batch per
  // step has nothing to add up, and takes half the memory).
  bool fp32_reduced_gradients = true;
  bool overlap = true;  // reduce during the backward pass (thread or stream)
  // Keep the fp32 master weights in the optimizers (this rank's pieces only when sharded)
  // rather than whole in the model. Required when the model computes in bf16 (its weights are
  // then a copy refreshed by the update); possible in f32, where it costs memory (tests).
  bool shard_master = false;
  std::string exchange = "auto";  // make_gradient_exchange's choice
};

// The model's weights as the optimizer sees them.
struct ModelWeights {
  kernels::TensorView master;   // whole fp32 master weights; empty with shard_master
  kernels::TensorView compute;  // the weights the model computes with when they are not
                                // `master` (bf16, or shard_master); else empty
};

struct ReductionTimes {
  double wait_seconds = 0;    // the training thread blocked waiting for reductions
  double reduce_seconds = 0;  // time spent in reduce-scatter (host time to queue it on a GPU)
  double gather_seconds = 0;  // parameter all-gather after the update
};

class DataParallel final : public model::GradientWindow {
 public:
  // Collective over `world` (the exchange duplicates its communicator).
  DataParallel(const dist::World& world, kernels::Ops& ops, const model::ParameterLayout& layout,
               DataParallelConfig config, AdamWConfig adamw, ModelWeights weights);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  DataParallel(DataParallel&&) = delete;
  DataParallel& operator=(DataParallel&&) = delete;

  // One step: begin_step before the last micro-batch's backward, gradients_ready from the
  // model's hook during it (the thread that runs the backward), finish_reduction after it.
  // grads: the model's flat gradient buffer (compute dtype); empty with shard_gradients.
  void begin_step(kernels::TensorView grads);
  void gradients_ready(std::int64_t offset);
  void finish_reduction();

  // ZeRO-2: the model writes its gradients into this (LlamaModel::set_gradient_window), and
  // every micro-batch of a step, on every rank, sits between begin_micro_batch() and
  // end_micro_batch() (which completes the groups a micro-batch without a backward left
  // untouched, with zeros, so that every rank takes part in the same reductions).
  [[nodiscard]] bool shards_gradients() const noexcept { return config_.shard_gradients; }
  void begin_micro_batch();
  void end_micro_batch() { ready(0); }
  kernels::TensorView gradients(std::int64_t offset, std::int64_t numel) override;
  void ready(std::int64_t offset) override;
  // Bytes of the ZeRO-2 slots (0 without).
  [[nodiscard]] std::int64_t gradient_slot_bytes() const noexcept;

  // sqrt(sum g^2) of the reduced gradients. Collective; the same value on every rank.
  [[nodiscard]] double gradient_norm();
  // AdamW on this rank's share with the gradients scaled by grad_scale (clipping), then the
  // weights all-gathered (ZeRO-1).
  void update(float lr, float grad_scale);

  // All-gathers the weights the model computes with from their owners (after update(), or
  // after each rank loaded its pieces). Nothing to do on one rank or without sharding.
  void gather_parameters();

  // Checkpoints: the ranges this rank writes (its pieces, ascending; sharded or not, so that
  // every value is written once), and the ranges whose state it must hold (its pieces when
  // sharded, the whole buffer otherwise).
  [[nodiscard]] std::vector<Range> write_ranges() const;
  [[nodiscard]] std::vector<Range> state_ranges() const;
  // The fp32 master weights of `ranges` (within state_ranges()) to / from host arrays holding
  // the ranges back to back. Loading also sets the compute weights of those ranges; call
  // gather_parameters() afterwards for the others.
  void save_master(const std::vector<Range>& ranges, std::span<float> values);
  void load_master(const std::vector<Range>& ranges, std::span<const float> values);
  // The master weights of state_ranges() from the whole flat array (a fresh start).
  void load_master_from_whole(std::span<const float> all);
  // The AdamW moments, likewise; and the update count of every optimizer.
  void save_moments(const std::vector<Range>& ranges, std::span<float> m, std::span<float> v);
  void load_moments(const std::vector<Range>& ranges, std::span<const float> m,
                    std::span<const float> v);
  [[nodiscard]] std::int64_t adamw_steps() const noexcept;
  void set_adamw_steps(std::int64_t steps) noexcept;

  [[nodiscard]] const std::vector<Range>& buckets() const noexcept { return buckets_; }
  // Piece r of bucket b: what rank r owns of it.
  [[nodiscard]] Range piece(std::size_t bucket, int rank) const;
  // The optimizers of this rank: one per owned piece (ZeRO-1) or one for the whole buffer.
  [[nodiscard]] std::vector<AdamW>& optimizers() noexcept { return optimizers_; }
  [[nodiscard]] bool sharded() const noexcept { return config_.shard_optimizer; }
  [[nodiscard]] bool overlapping() const noexcept { return overlap_; }
  // The exchange's name ("mpi", "nccl", ...); "none" on one rank.
  [[nodiscard]] std::string_view exchange_name() const noexcept;
  // Times of the last step.
  [[nodiscard]] const ReductionTimes& times() const noexcept { return times_; }

 private:
  void reduce_bucket(std::size_t bucket);
  [[nodiscard]] std::vector<Range> pieces_of(std::size_t bucket) const;
  // The optimizer holding flat position `begin` and the offset of `begin` in its state.
  [[nodiscard]] std::pair<AdamW*, std::int64_t> optimizer_at(std::int64_t begin);
  // The master weights of [r.begin, r.end) (within state_ranges()).
  [[nodiscard]] kernels::TensorView master_of(Range r);
  void launch_until(std::int64_t offset);  // reduce every bucket starting at or after offset
  void worker_loop();
  // The reduced gradients of piece r of bucket b (this rank's, with shard_gradients).
  [[nodiscard]] kernels::TensorView reduced_piece(std::size_t bucket, int rank) const;
  // Where bucket b's gradients are: the buffer and the layout position of its element 0.
  [[nodiscard]] std::pair<kernels::TensorView, std::int64_t> bucket_storage(std::size_t b) const;

  // [span.begin, span.end) cut into buckets of `bucket` elements from its end (where the
  // backward pass starts), aligned, in layout order. span.begin aligned.
  [[nodiscard]] static std::vector<Range> cut_buckets(Range span, std::int64_t bucket);

  // ZeRO-2 (data_parallel_zero2.cpp).
  void make_group_buckets(std::int64_t bucket);
  void setup_gradient_slots();
  void acquire(std::size_t group);  // a slot for the group, zeroed
  void release(std::size_t group);  // its reductions launched
  void retire(std::size_t group);   // its reductions done, added into the optimizers
  void finish_group_reductions();
  [[nodiscard]] kernels::TensorView slot_view(std::size_t group) const;

  const dist::World& world_;
  kernels::Ops& ops_;
  const model::ParameterLayout& layout_;
  DataParallelConfig config_;
  ModelWeights weights_;
  int size_;
  int rank_;
  std::vector<Range> buckets_;  // in layout order
  std::vector<AdamW> optimizers_;
  kernels::TensorView grads_;
  ReductionTimes times_;
  std::unique_ptr<GradientExchange> exchange_;  // null on one rank

  // Buckets are launched from the last to the first: next_launch_ counts those launched. With
  // a host exchange and overlap, a communication thread reduces them from a queue.
  std::size_t next_launch_ = 0;
  bool overlap_ = false;
  bool worker_thread_ = false;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::size_t> queue_;
  std::size_t done_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::thread worker_;

  // ZeRO-2 state. A group is resident (in a slot, being written), released (its reductions
  // launched: ticket) and retired (added into the optimizers, slot free) in each micro-batch.
  struct GroupState {
    int slot = -1;  // 0, 1, kPinnedSlot; -1: none
    bool released = false;
    bool pending = false;  // released, not yet retired
    std::uint64_t ticket = 0;
  };
  static constexpr int kPinnedSlot = 2;
  static constexpr std::size_t kNoGroup = static_cast<std::size_t>(-1);
  std::vector<model::LayoutSpan> groups_;
  std::vector<std::pair<std::size_t, std::size_t>> group_buckets_;  // [first, last) per group
  std::vector<std::size_t> bucket_group_;
  std::vector<GroupState> group_state_;
  std::array<kernels::Buffer, 3> slots_;  // two alternating, one for the pinned group
  std::array<std::size_t, 3> slot_owner_{kNoGroup, kNoGroup, kNoGroup};
  std::size_t pinned_group_ = kNoGroup;  // the tied embedding's group
  int next_slot_ = 0;
  std::uint64_t launched_ = 0;  // buckets queued to the worker thread this step
};

}  // namespace l3::train
