// The CUDA runtime, driver, libraries and devices this process sees. Works (and reports why)
// on machines without a GPU or driver: the build machines compile the CUDA backend but have none.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace l3::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  std::size_t memory_bytes = 0;
  int sm_count = 0;
};

struct RuntimeInfo {
  int runtime_version = 0;  // CUDA encoding: 1000 * major + 10 * minor
  int driver_version = 0;   // 0 when no driver is installed
  std::vector<DeviceInfo> devices;
  std::string no_device_reason;  // why `devices` is empty
  int cublaslt_version = 0;      // libraries' encoding: 10000 * major + 100 * minor + patch
  int cudnn_version = 0;
  int nccl_version = 0;
};

[[nodiscard]] RuntimeInfo query_runtime();
// Number of visible devices, 0 when there is no driver or device.
[[nodiscard]] int device_count() noexcept;

[[nodiscard]] std::string version_string(int cuda_version);             // 13000 -> "13.0"
[[nodiscard]] std::string library_version_string(int library_version);  // 91900 -> "9.19.0"

}  // namespace l3::cuda
