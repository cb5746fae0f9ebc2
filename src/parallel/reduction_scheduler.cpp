#include "parallel/reduction_scheduler.hpp"

#include <mpi.h>

#include "core/error.hpp"
#include "core/timer.hpp"

namespace l3::parallel {

ReductionScheduler::ReductionScheduler(const dist::World& world, kernels::Ops& ops,
                                       ExchangeChoice choice, bool overlap) {
  if (world.size() > 1 || choice == ExchangeChoice::nccl)
    exchange_ = make_gradient_exchange(world, ops, choice);
  // Overlap needs reductions that can start before the backward pass ends: queued on a
  // stream, or on a thread of their own over host memory (with MPI_THREAD_MULTIPLE).
  if (exchange_ && overlap) {
    threaded_ = !exchange_->queued() && exchange_->host_thread_safe() &&
                world.thread_level() == MPI_THREAD_MULTIPLE;
    overlap_ = exchange_->queued() || threaded_;
  }
}

ReductionScheduler::~ReductionScheduler() {
  if (worker_.joinable()) {
    {
      const std::scoped_lock lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }
}

std::string_view ReductionScheduler::name() const noexcept {
  return exchange_ ? exchange_->name() : "none";
}

void ReductionScheduler::start(Work work) {
  if (worker_.joinable()) throw core::internal_error("ReductionScheduler: started twice");
  work_ = std::move(work);
  if (threaded_) worker_ = std::thread([this] { worker_loop(); });
}

void ReductionScheduler::begin_step() {
  const std::scoped_lock lock(mutex_);
  queue_.clear();
  launched_ = 0;
  done_ = 0;
  reduce_seconds_ = 0;
  failure_ = nullptr;
}

void ReductionScheduler::launch(std::span<const std::size_t> buckets) {
  if (buckets.empty() || !exchange_) return;
  if (threaded_) {
    {
      const std::scoped_lock lock(mutex_);
      queue_.insert(queue_.end(), buckets.begin(), buckets.end());
      launched_ += buckets.size();
    }
    changed_.notify_all();
    return;
  }
  for (const std::size_t b : buckets) {
    const core::Stopwatch watch;
    work_(b);
    const double seconds = watch.seconds();
    const std::scoped_lock lock(mutex_);
    reduce_seconds_ += seconds;
    ++launched_;
    ++done_;
  }
}

std::uint64_t ReductionScheduler::ticket() {
  if (threaded_) {
    const std::scoped_lock lock(mutex_);
    return launched_;
  }
  return exchange_ ? exchange_->mark() : 0;
}

void ReductionScheduler::wait(std::uint64_t ticket) {
  if (threaded_) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_ >= ticket || failure_ != nullptr; });
    if (failure_) std::rethrow_exception(failure_);
  } else if (exchange_) {
    exchange_->join_ticket(ticket);
  }
}

void ReductionScheduler::wait_all() {
  if (threaded_) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return done_ == launched_ || failure_ != nullptr; });
    if (failure_) std::rethrow_exception(failure_);
  }
  if (exchange_) exchange_->join();
}

double ReductionScheduler::reduce_seconds() {
  const std::scoped_lock lock(mutex_);
  return reduce_seconds_;
}

void ReductionScheduler::worker_loop() {
  for (;;) {
    std::size_t b = 0;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      b = queue_.front();
      queue_.pop_front();
    }
    const core::Stopwatch watch;
    try {
      work_(b);
    } catch (...) {
      const std::scoped_lock lock(mutex_);
      failure_ = std::current_exception();
    }
    const double seconds = watch.seconds();
    {
      const std::scoped_lock lock(mutex_);
      reduce_seconds_ += seconds;
      ++done_;
    }
    changed_.notify_all();
  }
}

}  // namespace l3::parallel
