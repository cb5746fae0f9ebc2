// The 16-bit float formats of safetensors files, converted to and from fp32 on the host:
// bfloat16 (fp32's top half, rounded to nearest even) and IEEE half (F16).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace l3::safetensors {

[[nodiscard]] inline float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16U);
}

// Round to nearest, ties to even; NaN stays NaN (quiet), infinities stay infinite.
[[nodiscard]] inline std::uint16_t float_to_bf16(float value) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16U) | 0x0040U);
  const std::uint32_t rounding = 0x7FFFU + ((bits >> 16U) & 1U);
  return static_cast<std::uint16_t>((bits + rounding) >> 16U);
}

[[nodiscard]] inline float f16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = (bits & 0x8000U) << 16U;
  const std::uint32_t exponent = (bits >> 10U) & 0x1FU;
  const std::uint32_t mantissa = bits & 0x3FFU;
  if (exponent == 0x1FU)  // infinity or NaN
    return std::bit_cast<float>(sign | 0x7F800000U | (mantissa << 13U));
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + 112U) << 23U) | (mantissa << 13U));
}

}  // namespace l3::safetensors
