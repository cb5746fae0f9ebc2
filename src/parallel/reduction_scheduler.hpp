// Where and when a step's bucket reductions run: on the exchange's stream (NCCL, queued
// behind the backward pass), on a communication thread of their own (MPI over host memory,
// with MPI_THREAD_MULTIPLE), or right away on the training thread. The reduction of a bucket
// itself is the caller's (the Work); the scheduler orders, overlaps and waits.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>

#include "dist/world.hpp"
#include "kernels/ops.hpp"
#include "parallel/exchange_choice.hpp"
#include "parallel/gradient_exchange.hpp"

namespace l3::parallel {

class ReductionScheduler {
 public:
  using Work = std::function<void(std::size_t bucket)>;

  // Collective over `world` (the exchange duplicates its communicator). One rank needs no
  // exchange, unless NCCL is asked for by name (its code path checked on one GPU). `overlap`:
  // run reductions during the backward pass where the exchange allows it.
  ReductionScheduler(const dist::World& world, kernels::Ops& ops, ExchangeChoice choice,
                     bool overlap);
  ~ReductionScheduler();
  ReductionScheduler(const ReductionScheduler&) = delete;
  ReductionScheduler& operator=(const ReductionScheduler&) = delete;
  ReductionScheduler(ReductionScheduler&&) = delete;
  ReductionScheduler& operator=(ReductionScheduler&&) = delete;

  // Null: nothing to exchange (one rank).
  [[nodiscard]] GradientExchange* exchange() const noexcept { return exchange_.get(); }
  [[nodiscard]] bool overlapping() const noexcept { return overlap_; }
  [[nodiscard]] std::string_view name() const noexcept;  // "none" on one rank

  // What a launched bucket runs; the communication thread (if any) starts here.
  void start(Work work);

  // A new step: nothing launched, nothing failed, the reduction time at 0.
  void begin_step();
  // Runs `buckets`' Work, in that order: queued to the thread, or here (queued on the
  // exchange's stream, or done before this returns). Nothing without an exchange.
  void launch(std::span<const std::size_t> buckets);
  // A ticket for what was launched so far; wait(ticket) returns once that is done (the
  // backend's later work ordered after it, for a stream).
  [[nodiscard]] std::uint64_t ticket();
  void wait(std::uint64_t ticket);
  // Waits for everything launched, and orders the backend's later work after it.
  void wait_all();
  // Seconds spent in the Work this step (host time to queue it, on a stream).
  [[nodiscard]] double reduce_seconds();

 private:
  void worker_loop();

  std::unique_ptr<GradientExchange> exchange_;
  bool overlap_ = false;
  bool threaded_ = false;
  Work work_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::size_t> queue_;
  std::uint64_t launched_ = 0;  // this step
  std::uint64_t done_ = 0;
  double reduce_seconds_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::thread worker_;
};

}  // namespace l3::parallel
