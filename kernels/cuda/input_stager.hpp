// A micro-batch's inputs uploaded on a copy stream of their own, double-buffered, so that the
// upload of micro-batch k+1 overlaps the compute of micro-batch k instead of waiting its turn in
// the compute stream. The caller alternates two sets of device input buffers; events order the
// rest:
//   - a copy into set s waits for the work queued on the compute stream before the previous
//     upload (micro-batch k-1, which read set s): `released_[s]`, recorded on the compute stream
//     at that previous upload;
//   - the compute stream waits for the copies (`ready_`) before the work queued after them.
// Sources are staged through pinned slots, so the caller's host arrays are free on return.
// Timing events around each compute-stream wait measure how long the compute stream stood
// waiting for its inputs (the GPU side of data_wait_ms).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <span>
#include <vector>

#include "kernels/cuda/pinned_uploads.hpp"
#include "kernels/ops.hpp"

namespace l3::cuda {

class InputStager {
 public:
  explicit InputStager(cudaStream_t compute);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;
  InputStager(InputStager&&) = delete;
  InputStager& operator=(InputStager&&) = delete;

  void upload(int set, std::span<const kernels::HostUpload> uploads);
  // Milliseconds the compute stream waited for uploads since the last call; the waits must
  // have happened (call after a synchronisation).
  [[nodiscard]] double take_wait_ms();

 private:
  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  std::array<cudaEvent_t, 2> released_{};  // per set: the compute work that may still read it
  cudaEvent_t ready_ = nullptr;            // the last upload's copies are done
  // (before, after) the compute stream's wait, one pair per upload since take_wait_ms()
  std::vector<std::array<cudaEvent_t, 2>> wait_timers_;
  std::size_t timers_used_ = 0;
  static constexpr std::size_t kMaxTimers = 256;
  double pending_ms_ = 0.0;  // waits folded in when kMaxTimers were in use
  PinnedUploads pinned_;
};

}  // namespace l3::cuda
