// The names of the backend choices as options spell them (--backend, --attention), and back:
// the one place where these strings become enums.
#pragma once

#include <string_view>

#include "kernels/backends.hpp"

namespace l3::kernels {

// "auto", "cpu" or "cuda"; usage Error naming --backend for anything else.
[[nodiscard]] Backend parse_backend(std::string_view name);
[[nodiscard]] std::string_view backend_name(Backend backend) noexcept;

// "auto", "cudnn", "cudnn-nondeterministic" or "fallback"; usage Error naming --attention for
// anything else.
[[nodiscard]] Attention parse_attention(std::string_view name);
[[nodiscard]] std::string_view attention_name(Attention attention) noexcept;

}  // namespace l3::kernels
