// Helpers for testing the CUDA backend against the CPU reference: bf16 rounding on the host (so
// that both backends see identical inputs), uploads, downloads and poisoned outputs.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"
#include "kernels/cuda/cuda_ops.hpp"
#include "kernels/tensor.hpp"
#include "numeric_support.hpp"

namespace l3::test {

// Built against the CPU emulation (L3_CUDA=EMULATED, tests/emulated): work whose only purpose is
// to keep a real GPU busy is sized down there.
#if defined(L3_CUDA_EMULATED) && L3_CUDA_EMULATED
inline constexpr bool kEmulatedDevice = true;
#else
inline constexpr bool kEmulatedDevice = false;
#endif

// Round to the nearest bf16, ties to even (what __float2bfloat16 does), and back to float.
inline float round_bf16(float x) {
  if (std::isnan(x)) return x;
  std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  bits += 0x7FFFU + ((bits >> 16U) & 1U);
  return std::bit_cast<float>(bits & 0xFFFF0000U);
}
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// A device array holding `values` converted to `dtype`, of `shape` (1-D when not given).
inline kernels::Buffer upload(cuda::CudaOps& ops, const std::vector<float>& values,
                              const kernels::Shape& shape,
                              kernels::DType dtype = kernels::DType::bf16) {
  kernels::Buffer b = ops.allocate(dtype, static_cast<std::int64_t>(values.size()));
  b.reshape(shape);
  ops.copy(b.view(), kernels::ConstTensorView(std::span<const float>(values)));
  return b;
}
inline kernels::Buffer upload(cuda::CudaOps& ops, const std::vector<float>& values,
                              kernels::DType dtype = kernels::DType::bf16) {
  return upload(ops, values, static_cast<std::int64_t>(values.size()), dtype);
}
template <typename T>
kernels::Buffer upload_raw(cuda::CudaOps& ops, const std::vector<T>& values) {
  kernels::Buffer b = ops.allocate(kernels::dtype_of<T>, static_cast<std::int64_t>(values.size()));
  ops.copy(b.view(), kernels::ConstTensorView(std::span<const T>(values)));
  return b;
}
inline std::vector<float> download(cuda::CudaOps& ops, kernels::ConstTensorView x) {
  std::vector<float> host(static_cast<std::size_t>(x.numel()));
  ops.copy(kernels::TensorView(std::span<float>(host)), x);
  return host;
}
template <typename T>
std::vector<T> download_raw(cuda::CudaOps& ops, kernels::ConstTensorView x) {
  std::vector<T> host(static_cast<std::size_t>(x.numel()));
  ops.copy(kernels::TensorView(std::span<T>(host)), x);
  return host;
}
// A device array of `shape` (a count: 1-D) filled with NaN: an element the kernel does not
// write fails.
inline kernels::Buffer poisoned(cuda::CudaOps& ops, const kernels::Shape& shape,
                                kernels::DType dtype = kernels::DType::bf16) {
  return upload(ops,
                std::vector<float>(static_cast<std::size_t>(shape.numel()),
                                   std::numeric_limits<float>::quiet_NaN()),
                shape, dtype);
}

// ||actual - expected|| / ||expected|| under `tolerance` (NaN never is), named in the report.
inline void expect_close(const std::string& what, const std::vector<float>& actual,
                         const std::vector<float>& expected, double tolerance) {
  REQUIRE(actual.size() >= expected.size());
  const double error = rel_error(actual, expected);
  INFO(what << ": relative error " << error << " (tolerance " << tolerance << ")");
  CHECK(error < tolerance);
}

}  // namespace l3::test
