#include "parallel/data_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <span>
#include <utility>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "dist/collectives.hpp"

namespace l3::parallel {

namespace {

ShardPlanInput plan_input(const model::ParameterLayout& layout, const DataParallelConfig& config,
                          int ranks, const GradientExchange* exchange) {
  return {.total = layout.total(),
          // ZeRO-2 reduces group by group: its buckets never cross a group.
          .groups = config.placement.shards_gradients() ? layout.gradient_groups()
                                                        : std::vector<model::FlatRange>{},
          .ranks = ranks,
          .bucket_elements = config.bucket_elements,
          .even_pieces = exchange != nullptr && exchange->prefers_even_pieces()};
}

bool hybrid(const DataParallelConfig& config) {
  return config.placement.shards_trained_weights() && config.placement.hybrid();
}

}  // namespace

DataParallel::DataParallel(const dist::World& world, kernels::Ops& ops,
                           const model::ParameterLayout& layout, DataParallelConfig config,
                           train::AdamWConfig adamw, ModelWeights weights)
    : ops_(ops),
      layout_(layout),
      config_(std::move(config)),
      shard_world_(hybrid(config_)
                       ? world.split(world.rank() / config_.placement.shard_group, world.rank())
                       : std::nullopt),
      replica_world_(hybrid(config_)
                         ? world.split(world.rank() % config_.placement.shard_group, world.rank())
                         : std::nullopt),
      shards_(shard_world_ ? *shard_world_ : world),
      size_(shards_.size()),
      rank_(shards_.rank()),
      replica_(replica_world_ ? replica_world_->rank() : 0),
      scheduler_(shards_, ops, config_.exchange, config_.overlap),
      plan_(plan_input(layout, config_, size_, scheduler_.exchange())),
      optimizer_(
          ops, layout, adamw, plan_, rank_,
          {.sharded = placement().shards_optimizer(),
           .shard_master = placement().master_in_optimizer,
           .own_gradients = placement().shards_gradients(),
           .gradient_dtype = placement().fp32_gradients ? kernels::DType::f32 : ops.compute_dtype(),
           .gathered = placement().shards_trained_weights()},
          weights) {
  if (shards_parameters() &&
      (!shards_gradients() || !placement().master_in_optimizer || !weights.compute.empty())) {
    throw core::internal_error(
        "parameter sharding (ZeRO-3) needs ZeRO-2, the master weights in the optimizers, and a "
        "model that holds no weights");
  }
  if (replica_world_ && replica_world_->size() > 1) {
    // Every rank must exchange the same way: a shard group whose ranks share a GPU falls back to
    // MPI while the others use NCCL, and the replicas' all-reduce spans both.
    const GradientExchange* shard_exchange = scheduler_.exchange();
    std::array<int, 2> queued{shard_exchange->queued() ? 1 : 0, shard_exchange->queued() ? 0 : 1};
    dist::all_reduce(world.comm(), std::span<int>(queued), dist::ReduceOp::max,
                     "hybrid sharding: the exchange of each group");
    if (queued[0] == 1 && queued[1] == 1) {
      throw core::usage_error(
          "--shard-group-size: some shard groups exchange over NCCL and others over MPI (ranks "
          "of a node share a GPU): give --grad-exchange mpi, or one rank per GPU");
    }
    // Queued right behind the group's reduce-scatter of each bucket (reduce_bucket).
    replica_exchange_ = scheduler_.exchange()->follower(*replica_world_);
  }
  if (shards_gradients()) {
    slots_ = std::make_unique<GradientSlots>(
        ops, plan_, scheduler_, optimizer_, rank_,
        layout.lm_head_tied() ? std::size_t{0} : GradientSlots::kNoGroup);
  }
  if (shards_parameters()) {
    // Its gathers run on the training thread (or its prefetch thread) while reductions run on
    // the communication thread: each on a communicator of its own.
    gather_ = std::make_unique<ParameterGather>(
        shards_, ops, plan_,
        [this](std::size_t bucket) -> kernels::ConstTensorView {
          return optimizer_.of_bucket(bucket).own_master();
        },
        config_.exchange, config_.prefetch_gathers,
        layout.lm_head_tied() ? std::size_t{0} : ParameterGather::kNoGroup);
  }
  scheduler_.start([this](std::size_t bucket) { reduce_bucket(bucket); });
}

DataParallel::~DataParallel() = default;

void DataParallel::begin_step(kernels::TensorView grads) {
  if (shards_gradients()
          ? !grads.empty()
          : grads.numel() != layout_.total() ||
                (grads.dtype() != ops_.compute_dtype() && grads.dtype() != kernels::DType::f32)) {
    throw core::internal_error(shards_gradients()
                                   ? "DataParallel: with sharded gradients the model holds none"
                                   : "DataParallel: the gradients must be the model's flat buffer");
  }
  grads_ = grads;
  times_ = {};
  if (gather_) {
    gather_->forget();
    (void)gather_->take_times();
  }
  if (slots_) slots_->begin_step();
  scheduler_.begin_step();
  next_launch_ = 0;
}

void DataParallel::gradients_ready(std::int64_t offset) {
  if (scheduler_.overlapping()) launch_until(offset);
}

void DataParallel::launch_until(std::int64_t offset) {
  const std::vector<model::FlatRange>& buckets = plan_.buckets();
  std::vector<std::size_t> ready;
  while (next_launch_ < buckets.size()) {
    const std::size_t b = buckets.size() - 1 - next_launch_;
    if (buckets[b].begin < offset) break;
    ready.push_back(b);
    ++next_launch_;
  }
  scheduler_.launch(ready);
}

void DataParallel::finish_reduction() {
  const core::Stopwatch watch;
  if (shards_gradients()) {
    slots_->finish();
  } else if (scheduler_.exchange() != nullptr) {
    launch_until(0);
    scheduler_.wait_all();
  } else {
    return;  // one rank: nothing was reduced, nothing waited for
  }
  times_.wait_seconds = watch.seconds();
  times_.reduce_seconds = scheduler_.reduce_seconds();
}

std::pair<kernels::TensorView, std::int64_t> DataParallel::bucket_storage(std::size_t b) const {
  if (slots_) return slots_->bucket_storage(b);
  return {grads_, 0};
}

kernels::TensorView DataParallel::reduced_piece(std::size_t bucket, int rank) {
  if (shards_gradients()) return optimizer_.of_bucket(bucket).own_gradients();
  const model::FlatRange p = plan_.piece(bucket, rank);
  return grads_.slice(p.begin, p.size());
}

// Runs where the scheduler puts it: the communication thread, or the training thread.
void DataParallel::reduce_bucket(std::size_t bucket) {
  // Positions relative to where the bucket is stored (a ZeRO-2 slot holds one group).
  const auto [values, origin] = bucket_storage(bucket);
  std::vector<model::FlatRange> pieces = plan_.pieces(bucket);
  for (model::FlatRange& p : pieces) p = {p.begin - origin, p.end - origin};
  const model::FlatRange whole = plan_.buckets()[bucket];
  const model::FlatRange b{whole.begin - origin, whole.end - origin};
  GradientExchange& exchange = *scheduler_.exchange();
  exchange.reduce_scatter(values, b, pieces);
  // Hybrid sharding: the shard groups' sums of this piece added up (each group holds it once).
  if (replica_exchange_)
    replica_exchange_->all_reduce(values, pieces[static_cast<std::size_t>(rank_)]);
  if (!sharded()) exchange.all_gather(values, b, pieces);
}

double DataParallel::gradient_norm() {
  // Partial sums of squares per (bucket, rank) piece, added up in that fixed order.
  const std::size_t nb = plan_.buckets().size();
  std::vector<double> table(nb * static_cast<std::size_t>(size_), 0.0);  // [rank][bucket]
  // The sums of the pieces this rank computes (all of them without sharding), in one call.
  const bool mine_only = sharded() && size_ > 1;
  std::vector<kernels::ConstTensorView> views;
  std::vector<std::size_t> slots;
  for (int r = 0; r < size_; ++r) {
    if (mine_only && r != rank_) continue;
    for (std::size_t b = 0; b < nb; ++b) {
      const model::FlatRange piece = plan_.piece(b, r);
      if (piece.size() == 0) continue;
      // Tensor parallelism: the replicated tensors' gradients count on tensor rank 0 only.
      const kernels::TensorView view = reduced_piece(b, r);
      std::int64_t from = piece.begin;
      const auto take = [&](std::int64_t to) {
        if (to > from) {
          views.push_back(view.slice(from - piece.begin, to - from));
          slots.push_back(static_cast<std::size_t>(r) * nb + b);
        }
      };
      for (const model::FlatRange& skip : config_.counted_by_tensor_rank_0) {
        if (skip.end <= from || skip.begin >= piece.end) continue;
        take(std::max(skip.begin, from));
        from = std::min(skip.end, piece.end);
      }
      take(piece.end);
    }
  }
  std::vector<double> sums(views.size());
  ops_.sum_squares_each(views, sums);
  for (std::size_t i = 0; i < sums.size(); ++i) table[slots[i]] += sums[i];
  if (mine_only) {
    std::vector<double> mine(table.begin() + static_cast<std::ptrdiff_t>(rank_ * nb),
                             table.begin() + static_cast<std::ptrdiff_t>((rank_ + 1) * nb));
    dist::all_gather(shards_.comm(), std::span<const double>(mine), std::span<double>(table),
                     "gradient norm");
  }
  double total = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    for (int r = 0; r < size_; ++r) total += table[static_cast<std::size_t>(r) * nb + b];
  }
  if (config_.tensor != nullptr) {
    // the group's slices, added in tensor-rank order on every rank
    std::vector<double> parts(static_cast<std::size_t>(config_.tensor->ranks()));
    config_.tensor->all_gather(std::span<const double>(&total, 1), parts);
    total = 0;
    for (const double part : parts) total += part;
  }
  return std::sqrt(total);
}

void DataParallel::update(float lr, float grad_scale) {
  optimizer_.update(grads_, lr, grad_scale);
  if (gather_) gather_->forget();  // ZeRO-3: the gathered weights are the old ones
  const core::Stopwatch watch;
  gather_parameters();
  times_.gather_seconds += watch.seconds();
  times_.gather_wait_seconds += watch.seconds();
}

void DataParallel::gather_parameters() {
  // ZeRO-3 gathers each group when the model reads it; weights loaded since are new ones.
  if (gather_) {
    gather_->forget();
    return;
  }
  GradientExchange* exchange = scheduler_.exchange();
  if (!sharded() || exchange == nullptr) return;
  const ModelWeights& w = optimizer_.weights();
  const kernels::TensorView target = w.compute.empty() ? w.master : w.compute;
  for (std::size_t b = 0; b < plan_.buckets().size(); ++b)
    exchange->all_gather(target, plan_.buckets()[b], plan_.pieces(b));
  exchange->join();
}

ReductionTimes DataParallel::times() {
  if (gather_) {
    const GatherTimes g = gather_->take_times();
    times_.gather_seconds += g.gather_seconds;
    times_.gather_wait_seconds += g.wait_seconds;
    times_.gathers += g.gathers;
    times_.gathers_prefetched += g.prefetched;
  }
  return times_;
}

}  // namespace l3::parallel
