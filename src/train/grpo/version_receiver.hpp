// A generating rank's receipt of the policy versions (asynchronous GRPO, generation_link.hpp).
// With MPI_THREAD_MULTIPLE a thread of its own receives each version's control and weights into
// a staging buffer as soon as the training ranks send them, while the model generates with the
// version before (the model's own weights are the other buffer): the transfer leaves the
// generating ranks' critical path. Without it, take() receives them itself, in the same order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "train/grpo/generation_link.hpp"

namespace l3::train::grpo {

class VersionReceiver {
 public:
  struct Version {
    std::string control;             // the control message (JSON): a version or the stop
    bool stop = false;               // the control is the stop: no weights
    std::span<const float> weights;  // the trainable layout's values
    double transfer_ms = 0.0;        // from the control's arrival to the last piece's
    std::int64_t bytes = 0;          // the weights' bytes received
  };

  // `values`: the trainable layout's size; `type`: how the weights travel. background: receive
  // on a thread (needs MPI_THREAD_MULTIPLE).
  VersionReceiver(const GenerationLink& link, std::int64_t values, WireType type, bool background);
  // Calls off the thread's receipt (its pending receive cancelled) and joins it.
  ~VersionReceiver();
  VersionReceiver(const VersionReceiver&) = delete;
  VersionReceiver& operator=(const VersionReceiver&) = delete;
  VersionReceiver(VersionReceiver&&) = delete;
  VersionReceiver& operator=(VersionReceiver&&) = delete;

  // The next version (or the stop), once received; its weights stay valid until release().
  // Rethrows the thread's failure.
  [[nodiscard]] Version take();
  // The staging buffer is free for the next version.
  void release();
  [[nodiscard]] bool background() const noexcept { return thread_.joinable(); }

 private:
  // One version into the staging buffer; false when called off (`stop` set).
  bool receive(Version& into, const std::atomic<bool>* stop);
  void receive_loop();

  const GenerationLink& link_;
  WireType type_;
  std::vector<float> staging_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool staged_ = false;  // a version waits in staging_ (version_), not yet released
  Version version_;
  std::exception_ptr failure_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: started once the rest is in place
};

}  // namespace l3::train::grpo
