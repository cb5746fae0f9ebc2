#include "train/grpo/version_receiver.hpp"

#include <nlohmann/json.hpp>

#include "core/timer.hpp"

namespace l3::train::grpo {

VersionReceiver::VersionReceiver(const GenerationLink& link, std::int64_t values, WireType type,
                                 bool background)
    : link_(link), type_(type), staging_(static_cast<std::size_t>(values)) {
  if (background) thread_ = std::thread([this] { receive_loop(); });
}

VersionReceiver::~VersionReceiver() {
  if (!thread_.joinable()) return;
  {
    const std::scoped_lock lock(mutex_);
    stop_.store(true, std::memory_order_release);
  }
  changed_.notify_all();
  thread_.join();
}

bool VersionReceiver::receive(Version& into, const std::atomic<bool>* stop) {
  const MPI_Comm comm = link_.comm.get();
  if (stop != nullptr) {
    std::optional<std::string> control = receive_text(comm, 0, kControlTag, *stop);
    if (!control) return false;
    into.control = std::move(*control);
  } else {
    into.control = receive_text(comm, 0, kControlTag);
  }
  into.weights = {};
  into.transfer_ms = 0.0;
  into.bytes = 0;
  into.stop = nlohmann::json::parse(into.control).contains("stop");
  if (into.stop) return true;
  // Every training rank sends the ranges it owns; together they cover the layout.
  const core::Stopwatch watch;
  for (int r = 0; r < link_.trainers; ++r) {
    if (stop != nullptr) {
      const std::optional<std::int64_t> bytes = receive_pieces(comm, r, staging_, type_, *stop);
      if (!bytes) return false;
      into.bytes += *bytes;
    } else {
      into.bytes += receive_pieces(comm, r, staging_, type_);
    }
  }
  into.transfer_ms = watch.milliseconds();
  into.weights = staging_;
  return true;
}

void VersionReceiver::receive_loop() {
  try {
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return !staged_ || stop_.load(std::memory_order_acquire); });
        if (stop_.load(std::memory_order_acquire)) return;
      }
      Version received;
      if (!receive(received, &stop_)) return;
      const bool last = received.stop;
      {
        const std::scoped_lock lock(mutex_);
        version_ = std::move(received);
        staged_ = true;
      }
      changed_.notify_all();
      if (last) return;  // the stop: nothing follows
    }
  } catch (...) {
    {
      const std::scoped_lock lock(mutex_);
      failure_ = std::current_exception();
    }
    changed_.notify_all();
  }
}

VersionReceiver::Version VersionReceiver::take() {
  if (!thread_.joinable()) {
    Version received;
    (void)receive(received, nullptr);
    return received;
  }
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return staged_ || failure_ != nullptr; });
  if (!staged_) std::rethrow_exception(failure_);
  return version_;
}

void VersionReceiver::release() {
  if (!thread_.joinable()) return;
  {
    const std::scoped_lock lock(mutex_);
    staged_ = false;
  }
  changed_.notify_all();
}

}  // namespace l3::train::grpo
