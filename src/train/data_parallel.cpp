#include "train/data_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "dist/mpi_check.hpp"

namespace l3::train {

namespace {

constexpr std::int64_t kAlign = model::ParameterLayout::kAlignment;

std::int64_t align_down(std::int64_t x) { return x / kAlign * kAlign; }

}  // namespace

DataParallel::DataParallel(const dist::World& world, kernels::Ops& ops,
                           const model::ParameterLayout& layout, DataParallelConfig config,
                           AdamWConfig adamw, ModelWeights weights)
    : world_(world),
      ops_(ops),
      layout_(layout),
      config_(std::move(config)),
      weights_(weights),
      size_(world.size()),
      rank_(world.rank()) {
  if (config_.bucket_elements < kAlign ||
      config_.bucket_elements > std::numeric_limits<int>::max() / 2) {
    throw core::usage_error(fmt::format("the gradient bucket must hold between {} and {} values",
                                        kAlign, std::numeric_limits<int>::max() / 2));
  }
  if (config_.shard_master != weights_.master.empty() ||
      (ops.compute_dtype() != kernels::DType::f32 && weights_.compute.empty())) {
    throw core::internal_error("DataParallel: master weights and compute weights disagree");
  }
  if (config_.shard_gradients && !config_.shard_optimizer) {
    throw core::usage_error(
        "--shard-gradients (ZeRO-2) needs the sharded optimizer: drop --no-shard-optimizer");
  }
  // One rank needs no exchange, unless NCCL is asked for by name (its code path checked on a
  // machine with one GPU).
  if (size_ > 1 || config_.exchange == "nccl")
    exchange_ = make_gradient_exchange(world, ops, config_.exchange);
  // Buckets from the end of the buffer (where the backward pass starts), aligned; for an
  // exchange that prefers even pieces, a multiple of the ranks' share so that every bucket but
  // the first splits evenly.
  const std::int64_t total = layout.total();
  const std::int64_t unit = exchange_ && exchange_->prefers_even_pieces() ? kAlign * size_ : kAlign;
  const std::int64_t bucket = std::max(unit, config_.bucket_elements / unit * unit);
  if (config_.shard_gradients) {
    make_group_buckets(bucket);
  } else {
    buckets_ = cut_buckets({0, total}, bucket);
  }

  if (config_.shard_optimizer) {
    optimizers_.reserve(buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const Range p = piece(b, rank_);
      optimizers_.emplace_back(
          ops, layout, adamw, p.begin, p.end, config_.shard_master, config_.shard_gradients,
          config_.fp32_reduced_gradients ? kernels::DType::f32 : ops.compute_dtype());
    }
  } else {
    optimizers_.emplace_back(ops, layout, adamw, 0, total, config_.shard_master);
  }

  // Overlap needs reductions that can start before the backward pass ends: queued on a
  // stream, or on a thread of their own over host memory (with MPI_THREAD_MULTIPLE).
  if (exchange_ && config_.overlap) {
    worker_thread_ = !exchange_->queued() && exchange_->host_thread_safe() &&
                     world.thread_level() == MPI_THREAD_MULTIPLE;
    overlap_ = exchange_->queued() || worker_thread_;
  }
  if (config_.shard_gradients) setup_gradient_slots();
  if (worker_thread_) worker_ = std::thread([this] { worker_loop(); });
}

DataParallel::~DataParallel() {
  if (worker_.joinable()) {
    {
      const std::scoped_lock lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }
}

std::vector<Range> DataParallel::cut_buckets(Range span, std::int64_t bucket) {
  std::vector<Range> cut;
  for (std::int64_t end = span.end; end > span.begin;) {
    const std::int64_t begin = std::max(span.begin, align_down(end - bucket));
    cut.push_back({begin, end});
    end = begin;
  }
  std::reverse(cut.begin(), cut.end());
  return cut;
}

Range DataParallel::piece(std::size_t bucket, int rank) const {
  const Range b = buckets_.at(bucket);
  // Even split in units of kAlign elements; the last rank takes the unaligned tail.
  const std::int64_t units = (b.size() + kAlign - 1) / kAlign;
  auto edge = [&](int r) {
    return r >= size_ ? b.end : std::min(b.end, b.begin + units * r / size_ * kAlign);
  };
  return {edge(rank), edge(rank + 1)};
}

std::vector<Range> DataParallel::pieces_of(std::size_t bucket) const {
  std::vector<Range> pieces;
  pieces.reserve(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) pieces.push_back(piece(bucket, r));
  return pieces;
}

std::string_view DataParallel::exchange_name() const noexcept {
  return exchange_ ? exchange_->name() : "none";
}

void DataParallel::begin_step(kernels::TensorView grads) {
  if (config_.shard_gradients
          ? !grads.empty()
          : grads.numel() != layout_.total() ||
                (grads.dtype() != ops_.compute_dtype() && grads.dtype() != kernels::DType::f32)) {
    throw core::internal_error(config_.shard_gradients
                                   ? "DataParallel: with sharded gradients the model holds none"
                                   : "DataParallel: the gradients must be the model's flat buffer");
  }
  grads_ = grads;
  times_ = {};
  if (config_.shard_gradients) {
    for (AdamW& o : optimizers_) ops_.zero(o.own_gradients());
    for (GroupState& g : group_state_) g = {};
    slot_owner_.fill(kNoGroup);
  }
  const std::scoped_lock lock(mutex_);
  queue_.clear();
  next_launch_ = 0;
  done_ = 0;
  launched_ = 0;
  failure_ = nullptr;
}

void DataParallel::gradients_ready(std::int64_t offset) {
  if (overlap_) launch_until(offset);
}

void DataParallel::launch_until(std::int64_t offset) {
  std::vector<std::size_t> ready;
  {
    const std::scoped_lock lock(mutex_);
    while (next_launch_ < buckets_.size()) {
      const std::size_t b = buckets_.size() - 1 - next_launch_;
      if (buckets_[b].begin < offset) break;
      ready.push_back(b);
      ++next_launch_;
    }
    if (worker_thread_) queue_.insert(queue_.end(), ready.begin(), ready.end());
  }
  if (worker_thread_) {
    changed_.notify_all();
    return;
  }
  // Queued on the exchange's stream, or (no overlap) done here and now.
  for (const std::size_t b : ready) reduce_bucket(b);
}

void DataParallel::finish_reduction() {
  if (config_.shard_gradients) {
    const core::Stopwatch watch;
    finish_group_reductions();
    times_.wait_seconds = watch.seconds();
    return;
  }
  if (!exchange_) return;
  const core::Stopwatch watch;
  launch_until(0);
  if (worker_thread_) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_ == buckets_.size() || failure_ != nullptr; });
    if (failure_) std::rethrow_exception(failure_);
  }
  exchange_->join();
  times_.wait_seconds = watch.seconds();
}

void DataParallel::worker_loop() {
  for (;;) {
    std::size_t b = 0;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      b = queue_.front();
      queue_.pop_front();
    }
    try {
      reduce_bucket(b);
    } catch (...) {
      const std::scoped_lock lock(mutex_);
      failure_ = std::current_exception();
    }
    {
      const std::scoped_lock lock(mutex_);
      ++done_;
    }
    changed_.notify_all();
  }
}

std::pair<kernels::TensorView, std::int64_t> DataParallel::bucket_storage(std::size_t b) const {
  if (!config_.shard_gradients) return {grads_, 0};
  const std::size_t g = bucket_group_[b];
  return {slot_view(g), groups_[g].begin};
}

kernels::TensorView DataParallel::reduced_piece(std::size_t bucket, int rank) const {
  if (config_.shard_gradients) return optimizers_.at(bucket).own_gradients();
  const Range p = piece(bucket, rank);
  return grads_.slice(p.begin, p.size());
}

void DataParallel::reduce_bucket(std::size_t bucket) {
  const core::Stopwatch watch;
  // Positions relative to where the bucket is stored (a ZeRO-2 slot holds one group).
  const auto [values, origin] = bucket_storage(bucket);
  std::vector<Range> pieces = pieces_of(bucket);
  for (Range& p : pieces) p = {p.begin - origin, p.end - origin};
  const Range b{buckets_[bucket].begin - origin, buckets_[bucket].end - origin};
  exchange_->reduce_scatter(values, b, pieces);
  if (!config_.shard_optimizer) exchange_->all_gather(values, b, pieces);
  const double seconds = watch.seconds();
  const std::scoped_lock lock(mutex_);
  times_.reduce_seconds += seconds;
}

double DataParallel::gradient_norm() {
  // Partial sums of squares per (bucket, rank) piece, added up in that fixed order.
  const std::size_t nb = buckets_.size();
  std::vector<double> table(nb * static_cast<std::size_t>(size_), 0.0);  // [rank][bucket]
  // The sums of the pieces this rank computes (all of them without sharding), in one call.
  const bool mine_only = config_.shard_optimizer && size_ > 1;
  std::vector<kernels::TensorView> views;
  std::vector<std::size_t> slots;
  for (int r = 0; r < size_; ++r) {
    if (mine_only && r != rank_) continue;
    for (std::size_t b = 0; b < nb; ++b) {
      const Range p = piece(b, r);
      if (p.size() == 0) continue;
      views.push_back(reduced_piece(b, r));
      slots.push_back(static_cast<std::size_t>(r) * nb + b);
    }
  }
  std::vector<double> sums(views.size());
  ops_.sum_squares_each(views, sums);
  for (std::size_t i = 0; i < sums.size(); ++i) table[slots[i]] = sums[i];
  if (mine_only) {
    std::vector<double> mine(table.begin() + static_cast<std::ptrdiff_t>(rank_ * nb),
                             table.begin() + static_cast<std::ptrdiff_t>((rank_ + 1) * nb));
    dist::check_mpi(MPI_Allgather(mine.data(), static_cast<int>(nb), MPI_DOUBLE, table.data(),
                                  static_cast<int>(nb), MPI_DOUBLE, world_.comm()),
                    "MPI_Allgather (gradient norm)");
  }
  double total = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    for (int r = 0; r < size_; ++r) total += table[static_cast<std::size_t>(r) * nb + b];
  }
  return std::sqrt(total);
}

void DataParallel::update(float lr, float grad_scale) {
  for (AdamW& optimizer : optimizers_)
    optimizer.step(weights_.master, weights_.compute, grads_, lr, grad_scale);
  const core::Stopwatch watch;
  gather_parameters();
  times_.gather_seconds = watch.seconds();
}

void DataParallel::gather_parameters() {
  if (!config_.shard_optimizer || !exchange_) return;
  const kernels::TensorView target = weights_.compute.empty() ? weights_.master : weights_.compute;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    exchange_->all_gather(target, buckets_[b], pieces_of(b));
  exchange_->join();
}

kernels::TensorView DataParallel::master_of(Range r) {
  if (!config_.shard_master) return weights_.master.slice(r.begin, r.size());
  const auto [optimizer, offset] = optimizer_at(r.begin);
  return optimizer->own_master().slice(offset, r.size());
}

void DataParallel::save_master(const std::vector<Range>& ranges, std::span<float> values) {
  std::size_t at = 0;
  for (const Range& r : ranges) {
    const auto n = static_cast<std::size_t>(r.size());
    ops_.copy(kernels::TensorView(values.subspan(at, n)), master_of(r));
    at += n;
  }
  ops_.synchronize();
}

void DataParallel::load_master(const std::vector<Range>& ranges, std::span<const float> values) {
  std::size_t at = 0;
  for (const Range& r : ranges) {
    const auto n = static_cast<std::size_t>(r.size());
    const kernels::TensorView master = master_of(r);
    ops_.copy(master, kernels::TensorView(values.subspan(at, n)));
    if (!weights_.compute.empty()) ops_.copy(weights_.compute.slice(r.begin, r.size()), master);
    at += n;
  }
  ops_.synchronize();
}

void DataParallel::load_master_from_whole(std::span<const float> all) {
  if (static_cast<std::int64_t>(all.size()) != layout_.total()) {
    throw core::internal_error("load_master_from_whole: not the whole layout");
  }
  for (const Range& r : state_ranges()) {
    load_master({r},
                all.subspan(static_cast<std::size_t>(r.begin), static_cast<std::size_t>(r.size())));
  }
}

std::vector<Range> DataParallel::write_ranges() const {
  std::vector<Range> ranges;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Range p = piece(b, rank_);
    if (p.size() > 0) ranges.push_back(p);
  }
  return ranges;
}

std::vector<Range> DataParallel::state_ranges() const {
  if (!config_.shard_optimizer) return {{0, layout_.total()}};
  return write_ranges();
}

std::pair<AdamW*, std::int64_t> DataParallel::optimizer_at(std::int64_t begin) {
  for (AdamW& o : optimizers_) {
    if (begin >= o.begin() && begin < o.end()) return {&o, begin - o.begin()};
  }
  throw core::internal_error(fmt::format("no optimizer of this rank holds position {}", begin));
}

void DataParallel::save_moments(const std::vector<Range>& ranges, std::span<float> m,
                                std::span<float> v) {
  std::size_t at = 0;
  for (const Range& r : ranges) {
    const auto [optimizer, offset] = optimizer_at(r.begin);
    const auto n = static_cast<std::size_t>(r.size());
    ops_.copy(kernels::TensorView(m.subspan(at, n)),
              optimizer->first_moment().slice(offset, r.size()));
    ops_.copy(kernels::TensorView(v.subspan(at, n)),
              optimizer->second_moment().slice(offset, r.size()));
    at += n;
  }
  ops_.synchronize();
}

void DataParallel::load_moments(const std::vector<Range>& ranges, std::span<const float> m,
                                std::span<const float> v) {
  std::size_t at = 0;
  for (const Range& r : ranges) {
    const auto [optimizer, offset] = optimizer_at(r.begin);
    const auto n = static_cast<std::size_t>(r.size());
    ops_.copy(optimizer->first_moment().slice(offset, r.size()),
              kernels::TensorView(m.subspan(at, n)));
    ops_.copy(optimizer->second_moment().slice(offset, r.size()),
              kernels::TensorView(v.subspan(at, n)));
    at += n;
  }
  ops_.synchronize();
}

std::int64_t DataParallel::adamw_steps() const noexcept {
  return optimizers_.empty() ? 0 : optimizers_.front().steps_taken();
}

void DataParallel::set_adamw_steps(std::int64_t steps) noexcept {
  for (AdamW& o : optimizers_) o.set_steps_taken(steps);
}

}  // namespace l3::train
