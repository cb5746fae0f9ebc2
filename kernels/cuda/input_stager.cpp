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
  check(cudaStreamWaitEvent(compute_, ready_, 0), "input upload: compute waits for the copies");
}

}  // namespace l3::cuda
