// The Llama MLP's gate: out = silu(gate) * up, silu(g) = g * sigmoid(g).
#pragma once

#include <cstdint>
#include <span>

namespace l3::kernels::cpu {

void swiglu(std::span<float> out, std::span<const float> gate, std::span<const float> up);

// dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))), dup = dout * silu(g).
void swiglu_backward(std::span<float> dgate, std::span<float> dup, std::span<const float> dout,
                     std::span<const float> gate, std::span<const float> up);

}  // namespace l3::kernels::cpu
