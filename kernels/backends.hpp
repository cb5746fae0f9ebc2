// Which compute backends this build has and what they can see at run time.
#pragma once

#include <string>
#include <vector>

namespace l3::kernels {

struct BackendReport {
  std::string name;  // "cpu", "cuda"
  bool compiled = false;
  bool usable = false;  // compiled and (for cuda) at least one device visible
  std::string summary;  // one line for humans: versions, devices, or why it is unusable
};

// Every backend known to the program, compiled or not.
[[nodiscard]] std::vector<BackendReport> describe_backends();

// CUDA devices visible to this process; 0 when the CUDA backend is not compiled in or no
// driver/device is present.
[[nodiscard]] int visible_cuda_devices() noexcept;

}  // namespace l3::kernels
