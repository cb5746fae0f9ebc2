// RMSNorm as in Hugging Face's LlamaRMSNorm, in fp32: out = (x * rstd) * w,
// rstd = 1 / sqrt(mean(x^2) + eps) per row.
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

// x, out (rows, H); w (H); rstd (rows), kept for the backward.
void rmsnorm(std::span<float> out, std::span<float> rstd, std::span<const float> x,
             std::span<const float> w, std::int64_t hidden, float eps);

// dx (rows, H) += d/dx; dw (H) += d/dw (skipped when empty: a frozen norm). With xhat = x * rstd
// and g = dout * w: dx = rstd * (g - xhat * mean(g * xhat)), dw = sum over rows of dout * xhat.
void rmsnorm_backward(std::span<float> dx, std::span<float> dw, std::span<const float> dout,
                      std::span<const float> x, std::span<const float> w,
                      std::span<const float> rstd, std::int64_t hidden);

}  // namespace l3::kernels::cpu
