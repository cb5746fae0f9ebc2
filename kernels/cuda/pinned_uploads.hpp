// Host-to-device copies that do not synchronise the stream: the CPU copies the source into a
// pinned staging slot, the slot is uploaded asynchronously on the stream, and it is reused once
// the event recorded after that upload has completed. For the small inputs of every micro-batch
// (tokens, positions, targets, loss mask, segment table: about 20 bytes per token), which would
// otherwise drain the GPU's queue before each micro-batch (a pageable copy returns only when done).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>

namespace l3::cuda {

class PinnedUploads {
 public:
  static constexpr std::size_t kSlotBytes = std::size_t{8} << 20U;
  static constexpr int kSlots = 8;  // more than one micro-batch's inputs

  PinnedUploads() = default;
  ~PinnedUploads();
  PinnedUploads(const PinnedUploads&) = delete;
  PinnedUploads& operator=(const PinnedUploads&) = delete;
  PinnedUploads(PinnedUploads&&) = delete;
  PinnedUploads& operator=(PinnedUploads&&) = delete;

  // Queues the copy of `bytes` from host memory to device memory on `stream` and returns at once
  // (the source may be reused immediately). false when bytes > kSlotBytes: copy another way.
  bool upload(void* device_dst, const void* host_src, std::size_t bytes, cudaStream_t stream);

 private:
  struct Slot {
    void* host = nullptr;            // kSlotBytes of pinned memory, allocated on first use
    cudaEvent_t uploaded = nullptr;  // recorded after the slot's last upload
  };
  std::array<Slot, kSlots> slots_{};
  int next_ = 0;
};

}  // namespace l3::cuda
