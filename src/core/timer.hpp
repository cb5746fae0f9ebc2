// Wall-clock timing for logs, metrics and benchmarks (the CUDA backend adds event timers).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace l3::core {

// Monotonic elapsed time since construction or the last reset().
class Stopwatch {
 public:
  using Clock = std::chrono::steady_clock;

  Stopwatch() noexcept : start_(Clock::now()) {}
  void reset() noexcept { start_ = Clock::now(); }
  [[nodiscard]] double seconds() const noexcept {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }
  [[nodiscard]] double milliseconds() const noexcept { return seconds() * 1e3; }

 private:
  Clock::time_point start_;
};

// Running total, count and maximum of repeated intervals (e.g. data-wait per step).
class TimeAccumulator {
 public:
  void add(double seconds) noexcept {
    total_ += seconds;
    max_ = std::max(max_, seconds);
    ++count_;
  }
  void clear() noexcept { *this = TimeAccumulator{}; }
  [[nodiscard]] double total_seconds() const noexcept { return total_; }
  [[nodiscard]] double max_seconds() const noexcept { return max_; }
  [[nodiscard]] std::int64_t count() const noexcept { return count_; }
  [[nodiscard]] double mean_seconds() const noexcept {
    return count_ == 0 ? 0.0 : total_ / static_cast<double>(count_);
  }

 private:
  double total_ = 0.0;
  double max_ = 0.0;
  std::int64_t count_ = 0;
};

// Adds the lifetime of the scope to an accumulator: { ScopedTimer t(data_wait); next_batch(); }
class ScopedTimer {
 public:
  explicit ScopedTimer(TimeAccumulator& into) noexcept : into_(into) {}
  ~ScopedTimer() { into_.add(watch_.seconds()); }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;
  ScopedTimer(ScopedTimer&&) = delete;
  ScopedTimer& operator=(ScopedTimer&&) = delete;

 private:
  TimeAccumulator& into_;
  Stopwatch watch_;
};

}  // namespace l3::core
