#include "kernels/cuda/input_stager.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "kernels/cuda/cuda_check.hpp"

namespace l3::cuda {

InputStager::InputStager(cudaStream_t compute) : compute_(compute) {
  check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "input copy stream");
  for (cudaEvent_t& e : released_) {
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "input copy event");
  }
  check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "input copy event");
}

InputStager::~InputStager() {
  cudaStreamSynchronize(copy_);
  for (cudaEvent_t e : released_) cudaEventDestroy(e);
  for (const auto& pair : wait_timers_) {
    for (cudaEvent_t e : pair) cudaEventDestroy(e);
  }
  cudaEventDestroy(ready_);
  cudaStreamDestroy(copy_);
}

void InputStager::upload(int set, std::span<const kernels::HostUpload> uploads) {
  if (set != 0 && set != 1) {
    throw core::internal_error(fmt::format("input upload into set {} (0 or 1)", set));
  }
  // Everything queued so far is the work of the previous micro-batch, which read the other set.
  check(cudaEventRecord(released_[static_cast<std::size_t>(1 - set)], compute_),
        "input upload: record the other set's release");
  // This set was last read by the micro-batch before that (an event never recorded: no wait).
  check(cudaStreamWaitEvent(copy_, released_[static_cast<std::size_t>(set)], 0),
        "input upload: wait for the set's release");
  for (const kernels::HostUpload& u : uploads) {
    if (u.dst.dtype() != u.src.dtype() || u.dst.numel() != u.src.numel()) {
      throw core::internal_error(fmt::format("input upload: {} x {} into {} x {}", u.src.numel(),
                                             kernels::dtype_name(u.src.dtype()), u.dst.numel(),
                                             kernels::dtype_name(u.dst.dtype())));
    }
    const std::size_t bytes = u.src.bytes();
    if (pinned_.upload(u.dst.data(), u.src.data(), bytes, copy_)) continue;
    // Larger than a staging slot (millions of tokens): straight from the caller's memory, which
    // must then stay untouched until the copy is done.
    check(cudaMemcpyAsync(u.dst.data(), u.src.data(), bytes, cudaMemcpyHostToDevice, copy_),
          fmt::format("input upload of {} bytes", bytes));
    check(cudaStreamSynchronize(copy_), "input upload: wait for a large copy");
  }
  check(cudaEventRecord(ready_, copy_), "input upload: record");
  if (timers_used_ == kMaxTimers) {
    // Nobody has asked for a while (evaluation, a caller of the model alone): fold the waits so
    // far into one figure rather than keep growing (this waits for those uploads' waits).
    pending_ms_ = take_wait_ms();
  }
  if (timers_used_ == wait_timers_.size()) {
    std::array<cudaEvent_t, 2> pair{};
    for (cudaEvent_t& e : pair) check(cudaEventCreate(&e), "input upload: timing event");
    wait_timers_.push_back(pair);
  }
  const auto& timer = wait_timers_[timers_used_++];
  check(cudaEventRecord(timer[0], compute_), "input upload: record the wait's start");
  check(cudaStreamWaitEvent(compute_, ready_, 0), "input upload: compute waits for the copies");
  check(cudaEventRecord(timer[1], compute_), "input upload: record the wait's end");
}

double InputStager::take_wait_ms() {
  double total = pending_ms_;
  pending_ms_ = 0.0;
  for (std::size_t i = 0; i < timers_used_; ++i) {
    const auto& timer = wait_timers_[i];
    check(cudaEventSynchronize(timer[1]), "input wait: timing event");
    float ms = 0.0F;
    check(cudaEventElapsedTime(&ms, timer[0], timer[1]), "input wait: elapsed time");
    total += static_cast<double>(ms);
  }
  timers_used_ = 0;
  return total;
}

}  // namespace l3::cuda
