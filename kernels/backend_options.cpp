#include "kernels/backend_options.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace l3::kernels {

Backend parse_backend(std::string_view name) {
  if (name == "auto") return Backend::automatic;
  if (name == "cpu") return Backend::cpu;
  if (name == "cuda") return Backend::cuda;
  throw core::usage_error(fmt::format("unknown backend '{}' (use auto, cpu or cuda)", name));
}

std::string_view backend_name(Backend backend) noexcept {
  switch (backend) {
    case Backend::cpu:
      return "cpu";
    case Backend::cuda:
      return "cuda";
    case Backend::automatic:
      break;
  }
  return "auto";
}

Attention parse_attention(std::string_view name) {
  if (name == "fallback") return Attention::fallback;
  if (name == "cudnn") return Attention::cudnn;
  throw core::usage_error("--attention takes fallback or cudnn");
}

std::string_view attention_name(Attention attention) noexcept {
  return attention == Attention::cudnn ? "cudnn" : "fallback";
}

}  // namespace l3::kernels
