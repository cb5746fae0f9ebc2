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
// ZeRO-3 (shard_parameters, with shard_gradients and shard_master): no rank holds the whole
// model. The optimizers' fp32 master pieces are the only copy of the weights, and the model reads
// its weights through a ParameterGather over them (parameter_gather.hpp): each layer group
// all-gathered into a gather slot before it is read (in the compute dtype: on the GPU each rank
// rounds its pieces to bf16 as it puts them in, as the update rounds ZeRO-1's bf16 copy, so no
// bf16 shard is kept beside the master), the next one while it computes. Every rank must acquire
// the same groups in the same order: a rank without data for a micro-batch runs it with no
// rows (LlamaModel::load_batch).
//
// Hybrid sharding (shard_group_size G < the W ranks, with ZeRO-3): the states are sharded over
// groups of G consecutive ranks (a node, say) and each group holds them whole: the plan, the
// gathers and the reduce-scatters work within the group, and the reduced piece each rank owns
// is then all-reduced with the ranks owning the same piece in the other W / G groups (right
// behind the reduce-scatter: on the communication thread, or on the NCCL stream by a follower
// exchange), so that every group updates the same weights; the first group writes the
// checkpoints.
//
// The parts: the ShardPlan (buckets, pieces, groups: arithmetic, tested without MPI), the
// ReductionScheduler (the communication thread or stream, and the waits), the ShardedOptimizer
// (the AdamW state and master weights of this rank, and their checkpoint copies). DataParallel
// ties them to a step and holds the ZeRO-2 GradientSlots and the ZeRO-3
// ParameterGather.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "model/gradient_window.hpp"
#include "model/parameter_layout.hpp"
#include "model/parameter_window.hpp"
#include "model/placement.hpp"
#include "model/tensor_exchange.hpp"
#include "parallel/exchange_choice.hpp"
#include "parallel/gradient_slots.hpp"
#include "parallel/parameter_gather.hpp"
#include "parallel/reduction_scheduler.hpp"
#include "parallel/shard_plan.hpp"
#include "parallel/sharded_optimizer.hpp"
#include "train/adamw_optimizer.hpp"

namespace l3::parallel {

struct DataParallelConfig {
  std::int64_t bucket_elements = std::int64_t{8} << 20;  // 32 MiB of fp32 gradients
  // Where the trained values' weights, gradients and optimizer state live (model/placement.hpp,
  // checked by parallel::choose_placement): ZeRO-1 shards the optimizer state, ZeRO-2 the
  // gradients too (in groups, each reduced as it completes), ZeRO-3 the weights as well (only
  // with the master weights in the optimizers and a model that holds none), in hybrid shard
  // groups or over all the ranks. With LoRA's frozen model sharded, the adapters get ZeRO-2.
  // ZeRO-2's reduced gradients are fp32 with placement.fp32_gradients (several micro-batches
  // per step add up without a bf16 rounding each), else the compute dtype.
  model::Placement placement{};
  bool overlap = true;  // reduce during the backward pass (thread or stream)
  // ZeRO-3: gather the group a pass will acquire next while the current one computes (on a
  // thread of its own); false: each group when acquired (for measurements).
  bool prefetch_gathers = true;
  ExchangeChoice exchange = ExchangeChoice::automatic;  // make_gradient_exchange's choice
  // Tensor parallelism: the group whose slices' squared gradient norms add up (null: none),
  // and the layout ranges this rank leaves to tensor rank 0 in the norm (the replicated tensors,
  // whose gradients every rank of the group holds alike; ascending; empty on tensor rank 0).
  model::TensorExchange* tensor = nullptr;
  std::vector<model::FlatRange> counted_by_tensor_rank_0;
};

struct ReductionTimes {
  double wait_seconds = 0;    // the training thread blocked waiting for reductions
  double reduce_seconds = 0;  // time spent in reduce-scatter (host time to queue it on a GPU)
  // Parameter all-gathers: after the update (ZeRO-1), of each group before its use (ZeRO-3).
  double gather_seconds = 0;            // time the gathers took, on whichever thread ran them
  double gather_wait_seconds = 0;       // the training thread blocked on them (ZeRO-3: less)
  std::int64_t gathers = 0;             // ZeRO-3: layer groups gathered
  std::int64_t gathers_prefetched = 0;  // of which started before they were acquired
};

class DataParallel {
 public:
  // Collective over `world` (the exchange duplicates its communicator).
  DataParallel(const dist::World& world, kernels::Ops& ops, const model::ParameterLayout& layout,
               DataParallelConfig config, train::AdamWConfig adamw, ModelWeights weights);
  ~DataParallel();
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

  // ZeRO-2: the model writes its gradients into gradient_window(), and
  // every micro-batch of a step, on every rank, sits between begin_micro_batch() and
  // end_micro_batch() (which completes the groups a micro-batch without a backward left
  // untouched, with zeros, so that every rank takes part in the same reductions).
  [[nodiscard]] bool shards_gradients() const noexcept { return placement().shards_gradients(); }
  void begin_micro_batch() {
    if (slots_) slots_->begin_micro_batch();
  }
  void end_micro_batch() {
    if (slots_) slots_->ready(0);
  }
  // The window the model writes its gradients into (LlamaModel::set_gradient_window); null
  // without gradient sharding.
  [[nodiscard]] model::GradientWindow* gradient_window() noexcept { return slots_.get(); }
  // Bytes of the ZeRO-2 slots (0 without).
  [[nodiscard]] std::int64_t gradient_slot_bytes() const noexcept {
    return slots_ ? slots_->bytes() : 0;
  }

  // ZeRO-3: the window the model reads its weights through (LlamaModel::set_parameter_window);
  // null without parameter sharding.
  [[nodiscard]] bool shards_parameters() const noexcept {
    return placement().shards_trained_weights();
  }
  [[nodiscard]] model::ParameterWindow* parameter_window() noexcept { return gather_.get(); }
  // Bytes of the ZeRO-3 gather slots (0 without).
  [[nodiscard]] std::int64_t gather_slot_bytes() const noexcept {
    return gather_ ? gather_->slot_bytes() : 0;
  }

  // sqrt(sum g^2) of the reduced gradients. Collective; the same value on every rank.
  [[nodiscard]] double gradient_norm();
  // AdamW on this rank's share with the gradients scaled by grad_scale (clipping), then the
  // weights all-gathered (ZeRO-1).
  void update(float lr, float grad_scale);

  // All-gathers the weights the model computes with from their owners (after update(), or
  // after each rank loaded its pieces). Nothing to do on one rank or without sharding.
  void gather_parameters();

  // Checkpoints: the ranges this rank writes (its pieces, ascending; sharded or not, so that
  // every value is written once). What it holds, and the copies in and out: optimizer().
  // Hybrid sharding: the first shard group writes, the others hold the same values.
  [[nodiscard]] std::vector<model::FlatRange> write_ranges() const {
    return replica_ == 0 ? plan_.owned(rank_) : std::vector<model::FlatRange>{};
  }
  [[nodiscard]] ShardedOptimizer& optimizer() noexcept { return optimizer_; }
  [[nodiscard]] const ShardedOptimizer& optimizer() const noexcept { return optimizer_; }

  [[nodiscard]] const ShardPlan& plan() const noexcept { return plan_; }
  [[nodiscard]] const std::vector<model::FlatRange>& buckets() const noexcept {
    return plan_.buckets();
  }
  // Piece r of bucket b: what rank r owns of it.
  [[nodiscard]] model::FlatRange piece(std::size_t bucket, int rank) const {
    return plan_.piece(bucket, rank);
  }
  [[nodiscard]] bool sharded() const noexcept { return placement().shards_optimizer(); }
  [[nodiscard]] const model::Placement& placement() const noexcept { return config_.placement; }
  [[nodiscard]] bool overlapping() const noexcept { return scheduler_.overlapping(); }
  // The exchange's name ("mpi", "nccl", ...); "none" on one rank.
  [[nodiscard]] std::string_view exchange_name() const noexcept { return scheduler_.name(); }
  // Times of the step so far (of the last one after update()).
  [[nodiscard]] ReductionTimes times();

 private:
  void reduce_bucket(std::size_t bucket);
  // Launches every bucket (last first) starting at or after offset and not launched yet.
  void launch_until(std::int64_t offset);
  // The reduced gradients of piece r of bucket b (this rank's, with shard_gradients).
  [[nodiscard]] kernels::TensorView reduced_piece(std::size_t bucket, int rank);
  // Where bucket b's gradients are: the buffer and the layout position of its element 0.
  [[nodiscard]] std::pair<kernels::TensorView, std::int64_t> bucket_storage(std::size_t b) const;

  kernels::Ops& ops_;
  const model::ParameterLayout& layout_;
  DataParallelConfig config_;
  // Hybrid sharding: this rank's shard group and the ranks holding the same pieces in the other
  // groups (both empty without: the world is the one shard group).
  std::optional<dist::World> shard_world_;
  std::optional<dist::World> replica_world_;
  const dist::World& shards_;     // the ranks the states are sharded over
  int size_;                      // of shards_
  int rank_;                      // in shards_: the pieces this rank owns
  int replica_;                   // which shard group this rank is in (0 without hybrid sharding)
  ReductionScheduler scheduler_;  // before the plan: the exchange decides the piece sizes
  ShardPlan plan_;
  ShardedOptimizer optimizer_;
  kernels::TensorView grads_;
  ReductionTimes times_;
  // Buckets are launched from the last to the first: next_launch_ counts those launched.
  std::size_t next_launch_ = 0;

  std::unique_ptr<GradientSlots> slots_;                // ZeRO-2 and ZeRO-3
  std::unique_ptr<ParameterGather> gather_;             // ZeRO-3
  std::unique_ptr<GradientExchange> replica_exchange_;  // hybrid sharding: across the groups
};

}  // namespace l3::parallel
