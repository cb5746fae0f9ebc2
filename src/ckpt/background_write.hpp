// One checkpoint write at a time, on a background thread (or on the caller's when not
// asynchronous): the job writes a host snapshot, its report or its failure is kept for wait(),
// and the snapshot's buffers are kept for the next write (their pages are mapped already: on
// large models, allocating a fresh snapshot costs more than filling it). Used by the writers of
// both checkpoint levels.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <optional>
#include <thread>
#include <utility>

#include "ckpt/rank_state.hpp"

namespace l3::ckpt {

template <typename Report>
class BackgroundWrite {
 public:
  explicit BackgroundWrite(bool async) : async_(async) {}
  ~BackgroundWrite() { join(); }  // a failure still pending is dropped: callers wait()
  BackgroundWrite(const BackgroundWrite&) = delete;
  BackgroundWrite& operator=(const BackgroundWrite&) = delete;
  BackgroundWrite(BackgroundWrite&&) = delete;
  BackgroundWrite& operator=(BackgroundWrite&&) = delete;

  // Runs job(state); the previous write must have been waited for.
  void start(std::function<Report(const RankState&)> job, RankState state) {
    join();
    in_flight_ = true;
    finished_ = false;
    report_.reset();
    error_ = nullptr;
    auto task = [this, job = std::move(job), state = std::move(state)]() mutable {
      try {
        report_ = job(state);
      } catch (...) {
        error_ = std::current_exception();
      }
      spare_ = std::move(state);
      finished_ = true;
    };
    if (async_) {
      thread_ = std::thread(std::move(task));
    } else {
      task();
    }
  }
  // Waits for the write in flight, if any, and returns its report; rethrows its failure.
  std::optional<Report> wait() {
    if (!in_flight_) return std::nullopt;
    join();
    in_flight_ = false;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return std::exchange(report_, std::nullopt);
  }
  // The last finished write's snapshot (empty while one is in flight).
  [[nodiscard]] RankState take_spare() {
    if (in_flight_) return {};
    return std::exchange(spare_, RankState{});
  }
  void provide_spare(RankState spare) {
    if (!in_flight_) spare_ = std::move(spare);
  }
  [[nodiscard]] bool busy() const noexcept { return in_flight_; }
  // A write is in flight and done on this rank (wait() will not block).
  [[nodiscard]] bool ready() const noexcept { return in_flight_ && finished_.load(); }

 private:
  void join() {
    if (thread_.joinable()) thread_.join();
  }

  bool async_;
  std::thread thread_;
  bool in_flight_ = false;
  std::atomic<bool> finished_{false};
  std::optional<Report> report_;
  std::exception_ptr error_;
  RankState spare_;
};

}  // namespace l3::ckpt
