#include "kernels/cuda/pinned_uploads.hpp"

#include <fmt/format.h>

#include <cstring>

#include "kernels/cuda/cuda_check.hpp"

namespace l3::cuda {

PinnedUploads::~PinnedUploads() {
  for (Slot& slot : slots_) {
    if (slot.uploaded != nullptr) {
      cudaEventSynchronize(slot.uploaded);
      cudaEventDestroy(slot.uploaded);
    }
    if (slot.host != nullptr) cudaFreeHost(slot.host);
  }
}

bool PinnedUploads::upload(void* device_dst, const void* host_src, std::size_t bytes,
                           cudaStream_t stream) {
  if (bytes > kSlotBytes) return false;
  if (bytes == 0) return true;
  Slot& slot = slots_[static_cast<std::size_t>(next_)];
  next_ = (next_ + 1) % kSlots;
  if (slot.host == nullptr) {
    check(cudaHostAlloc(&slot.host, kSlotBytes, cudaHostAllocDefault),
          fmt::format("upload: cudaHostAlloc of {} bytes", kSlotBytes));
    check(cudaEventCreateWithFlags(&slot.uploaded, cudaEventDisableTiming), "upload: event");
  } else {
    // Normally long done: this slot's previous upload was queued kSlots uploads ago.
    check(cudaEventSynchronize(slot.uploaded), "upload: wait for the staging slot");
  }
  std::memcpy(slot.host, host_src, bytes);
  check(cudaMemcpyAsync(device_dst, slot.host, bytes, cudaMemcpyHostToDevice, stream),
        fmt::format("upload of {} bytes", bytes));
  check(cudaEventRecord(slot.uploaded, stream), "upload: record");
  return true;
}

}  // namespace l3::cuda
