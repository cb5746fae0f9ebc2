// A producer thread filling a ring of `depth` slots ahead of the consumer: with depth 2 the next
// step is assembled while the current one is used (double buffering); depth 1 gives no overlap.
// Slots are reused, so memory stays bounded after the first `depth` items. The consumer holds the
// slot it was last given until its next call. A failure in the producer surfaces in the
// consumer, at the item that failed, as the producer's exception: never as a hang or a short
// batch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/timer.hpp"

namespace l3::data {

template <typename T>
class Prefetcher {
 public:
  // produce(index, slot) fills `slot` with item `index` (first, first + 1, ...).
  using Produce = std::function<void(std::int64_t, T&)>;
  // Called by the producer before each item with whether this side is stopping; returns whether
  // to go on. Producers of several ranks that must stay in step (collective reads) agree here.
  using Gate = std::function<bool(bool stopping)>;

  Prefetcher(int depth, std::int64_t first, Produce produce, Gate gate = {})
      : slots_(static_cast<std::size_t>(depth)),
        state_(static_cast<std::size_t>(depth), State::empty),
        produce_(std::move(produce)),
        gate_(std::move(gate)),
        next_to_produce_(first),
        next_to_consume_(first) {
    if (depth < 1) throw core::usage_error("prefetch depth must be at least 1");
    thread_ = std::thread([this] { run(); });
  }
  ~Prefetcher() {
    {
      const std::scoped_lock lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  Prefetcher(Prefetcher&&) = delete;
  Prefetcher& operator=(Prefetcher&&) = delete;

  // The next item, once ready; valid until the following call. Rethrows a producer failure.
  T& next() {
    const core::Stopwatch waited;
    std::unique_lock lock(mutex_);
    if (held_ >= 0) {
      state_[static_cast<std::size_t>(held_)] = State::empty;  // give the previous slot back
      held_ = -1;
      changed_.notify_all();
    }
    const auto slot =
        static_cast<std::size_t>(next_to_consume_ % static_cast<std::int64_t>(slots_.size()));
    changed_.wait(lock, [&] { return state_[slot] == State::ready || failure_; });
    if (state_[slot] != State::ready) std::rethrow_exception(failure_);
    held_ = static_cast<int>(slot);
    ++next_to_consume_;
    last_wait_ = waited.seconds();
    return slots_[slot];
  }

  // Seconds the last next() waited for the producer.
  [[nodiscard]] double last_wait_seconds() const noexcept { return last_wait_; }

 private:
  enum class State { empty, filling, ready };

  void run() {
    while (true) {
      std::size_t slot = 0;
      std::int64_t index = 0;
      {
        std::unique_lock lock(mutex_);
        slot =
            static_cast<std::size_t>(next_to_produce_ % static_cast<std::int64_t>(slots_.size()));
        changed_.wait(lock, [&] { return stop_ || state_[slot] == State::empty; });
        const bool stopping = stop_;
        if (gate_) {
          lock.unlock();
          bool proceed = false;
          try {
            proceed = gate_(stopping);
          } catch (...) {
            lock.lock();
            failure_ = std::current_exception();
            changed_.notify_all();
            return;
          }
          lock.lock();
          if (!proceed) {  // stopped here or elsewhere: a consumer still waiting must not hang
            if (!stopping) {
              failure_ = std::make_exception_ptr(
                  core::internal_error("the data loader was stopped on another rank"));
            }
            changed_.notify_all();
            return;
          }
        } else if (stopping) {
          return;
        }
        state_[slot] = State::filling;
        index = next_to_produce_;
      }
      try {
        produce_(index, slots_[slot]);
      } catch (...) {
        const std::scoped_lock lock(mutex_);
        failure_ = std::current_exception();
        changed_.notify_all();
        return;
      }
      const std::scoped_lock lock(mutex_);
      state_[slot] = State::ready;
      ++next_to_produce_;
      changed_.notify_all();
    }
  }

  std::vector<T> slots_;
  std::vector<State> state_;
  Produce produce_;
  Gate gate_;
  std::int64_t next_to_produce_;
  std::int64_t next_to_consume_;
  int held_ = -1;
  bool stop_ = false;
  std::exception_ptr failure_;
  double last_wait_ = 0.0;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread thread_;  // last: starts after everything above is initialised
};

}  // namespace l3::data
