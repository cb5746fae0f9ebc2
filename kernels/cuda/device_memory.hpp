// Device memory as kernels::Buffer, and where a pointer lives.
#pragma once

#include <cstdint>

#include "kernels/tensor.hpp"

namespace l3::cuda {

// Zero-initialised device memory on the current device.
[[nodiscard]] kernels::Buffer allocate_device(kernels::DType dtype, std::int64_t numel);
// True for memory the GPU owns (device or managed), false for host memory.
[[nodiscard]] bool is_device_pointer(const void* pointer);

}  // namespace l3::cuda
