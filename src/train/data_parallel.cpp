#include "train/data_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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
                           AdamWConfig adamw)
    : world_(world),
      ops_(ops),
      layout_(layout),
      config_(config),
      size_(world.size()),
      rank_(world.rank()) {
  if (config_.bucket_elements < kAlign ||
      config_.bucket_elements > std::numeric_limits<int>::max() / 2) {
    throw core::usage_error(fmt::format("the gradient bucket must hold between {} and {} values",
                                        kAlign, std::numeric_limits<int>::max() / 2));
  }
  if (size_ > 1 && ops.compute_dtype() != kernels::DType::f32) {
    throw core::usage_error(fmt::format(
        "data parallelism over {} ranks on the {} backend needs NCCL gradient reduction, which "
        "this version does not have yet: run one rank per job or use --backend cpu",
        size_, ops.name()));
  }
  // Buckets from the end of the buffer (where the backward pass starts), aligned.
  const std::int64_t total = layout.total();
  const std::int64_t bucket = align_down(config_.bucket_elements);
  for (std::int64_t end = total; end > 0;) {
    const std::int64_t begin = std::max<std::int64_t>(0, align_down(end - bucket));
    buckets_.push_back({begin, end});
    end = begin;
  }
  std::reverse(buckets_.begin(), buckets_.end());

  std::int64_t largest_piece = 0;
  if (config_.shard_optimizer) {
    optimizers_.reserve(buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const Range p = piece(b, rank_);
      optimizers_.emplace_back(ops, layout, adamw, p.begin, p.end);
    }
  } else {
    optimizers_.emplace_back(ops, layout, adamw, 0, total);
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    largest_piece = std::max(largest_piece, piece(b, rank_).size());
  scratch_.resize(static_cast<std::size_t>(largest_piece));

  overlap_ = config_.overlap && size_ > 1 && world.thread_level() == MPI_THREAD_MULTIPLE;
  if (size_ > 1) comm_ = world.duplicate_comm();
  if (overlap_) worker_ = std::thread([this] { worker_loop(); });
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

Range DataParallel::piece(std::size_t bucket, int rank) const {
  const Range b = buckets_.at(bucket);
  // Even split in units of kAlign elements; the last rank takes the unaligned tail.
  const std::int64_t units = (b.size() + kAlign - 1) / kAlign;
  auto edge = [&](int r) {
    return r >= size_ ? b.end : std::min(b.end, b.begin + units * r / size_ * kAlign);
  };
  return {edge(rank), edge(rank + 1)};
}

void DataParallel::begin_step(kernels::TensorView grads) {
  if (grads.numel() != layout_.total() || grads.dtype() != kernels::DType::f32) {
    if (size_ > 1) throw core::internal_error("DataParallel: gradients must be the fp32 buffer");
  }
  grads_ = grads;
  times_ = {};
  const std::scoped_lock lock(mutex_);
  queue_.clear();
  next_launch_ = 0;
  done_ = 0;
  failure_ = nullptr;
}

void DataParallel::gradients_ready(std::int64_t offset) {
  if (size_ == 1) return;
  launch_until(offset);
}

void DataParallel::launch_until(std::int64_t offset) {
  if (!overlap_) return;  // finish_reduction does it all
  {
    const std::scoped_lock lock(mutex_);
    while (next_launch_ < buckets_.size()) {
      const std::size_t b = buckets_.size() - 1 - next_launch_;
      if (buckets_[b].begin < offset) break;
      queue_.push_back(b);
      ++next_launch_;
    }
  }
  changed_.notify_all();
}

void DataParallel::finish_reduction() {
  if (size_ == 1) return;
  const core::Stopwatch watch;
  if (overlap_) {
    launch_until(0);
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_ == buckets_.size() || failure_ != nullptr; });
    if (failure_) std::rethrow_exception(failure_);
    times_.wait_seconds = watch.seconds();
  } else {
    for (std::size_t i = 0; i < buckets_.size(); ++i) reduce_bucket(buckets_.size() - 1 - i);
    times_.wait_seconds = watch.seconds();
  }
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

void DataParallel::reduce_bucket(std::size_t bucket) {
  const core::Stopwatch watch;
  const Range b = buckets_[bucket];
  std::vector<int> counts(static_cast<std::size_t>(size_));
  std::vector<int> displacements(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const Range p = piece(bucket, r);
    counts[static_cast<std::size_t>(r)] = static_cast<int>(p.size());
    displacements[static_cast<std::size_t>(r)] = static_cast<int>(p.begin - b.begin);
  }
  auto* base = static_cast<float*>(grads_.data()) + b.begin;
  dist::check_mpi(
      MPI_Reduce_scatter(base, scratch_.data(), counts.data(), MPI_FLOAT, MPI_SUM, comm_.get()),
      "MPI_Reduce_scatter (gradients)");
  const Range mine = piece(bucket, rank_);
  std::memcpy(static_cast<float*>(grads_.data()) + mine.begin, scratch_.data(),
              static_cast<std::size_t>(mine.size()) * sizeof(float));
  if (!config_.shard_optimizer) {
    dist::check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base, counts.data(),
                                   displacements.data(), MPI_FLOAT, comm_.get()),
                    "MPI_Allgatherv (gradients)");
  }
  const double seconds = watch.seconds();
  const std::scoped_lock lock(mutex_);
  times_.reduce_seconds += seconds;
}

double DataParallel::gradient_norm() {
  // Partial sums of squares per (bucket, rank) piece, added up in that fixed order.
  const std::size_t nb = buckets_.size();
  std::vector<double> table(nb * static_cast<std::size_t>(size_), 0.0);  // [rank][bucket]
  auto sum_of = [&](std::size_t b, int r) {
    const Range p = piece(b, r);
    return p.size() == 0 ? 0.0 : ops_.sum_squares(grads_.slice(p.begin, p.size()), p.size());
  };
  if (config_.shard_optimizer && size_ > 1) {
    std::vector<double> mine(nb);
    for (std::size_t b = 0; b < nb; ++b) mine[b] = sum_of(b, rank_);
    dist::check_mpi(MPI_Allgather(mine.data(), static_cast<int>(nb), MPI_DOUBLE, table.data(),
                                  static_cast<int>(nb), MPI_DOUBLE, world_.comm()),
                    "MPI_Allgather (gradient norm)");
  } else {
    for (int r = 0; r < size_; ++r) {
      for (std::size_t b = 0; b < nb; ++b)
        table[static_cast<std::size_t>(r) * nb + b] = sum_of(b, r);
    }
  }
  double total = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    for (int r = 0; r < size_; ++r) total += table[static_cast<std::size_t>(r) * nb + b];
  }
  return std::sqrt(total);
}

void DataParallel::update(kernels::TensorView master, kernels::TensorView weight_copy, float lr,
                          float grad_scale) {
  for (AdamW& optimizer : optimizers_) optimizer.step(master, weight_copy, grads_, lr, grad_scale);
  const core::Stopwatch watch;
  gather_parameters(master);
  times_.gather_seconds = watch.seconds();
}

void DataParallel::gather_parameters(kernels::TensorView master) {
  if (!config_.shard_optimizer || size_ == 1) return;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    std::vector<int> counts(static_cast<std::size_t>(size_));
    std::vector<int> displacements(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      const Range p = piece(b, r);
      counts[static_cast<std::size_t>(r)] = static_cast<int>(p.size());
      displacements[static_cast<std::size_t>(r)] = static_cast<int>(p.begin - buckets_[b].begin);
    }
    dist::check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL,
                                   static_cast<float*>(master.data()) + buckets_[b].begin,
                                   counts.data(), displacements.data(), MPI_FLOAT, comm_.get()),
                    "MPI_Allgatherv (parameters)");
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
