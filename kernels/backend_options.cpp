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
  if (name == "auto") return Attention::automatic;
  if (name == "cudnn") return Attention::cudnn;
  if (name == "cudnn-nondeterministic") return Attention::cudnn_nondeterministic;
  if (name == "fallback") return Attention::fallback;
  throw core::usage_error("--attention takes auto, cudnn, cudnn-nondeterministic or fallback");
}

std::string_view attention_name(Attention attention) noexcept {
  switch (attention) {
    case Attention::cudnn:
      return "cudnn";
    case Attention::cudnn_nondeterministic:
      return "cudnn-nondeterministic";
    case Attention::fallback:
      return "fallback";
    case Attention::automatic:
      break;
  }
  return "auto";
}

AttentionChoice choose_attention(Attention attention, bool deterministic,
                                 const CudnnSupport& support) {
  switch (attention) {
    case Attention::fallback:
      return {.cudnn = false, .deterministic_backward = true, .fallback_reason = {}};
    case Attention::cudnn:
      // Asked for by name: cuDNN declines what it cannot run call by call, and says why.
      return {.cudnn = true, .deterministic_backward = true, .fallback_reason = {}};
    case Attention::cudnn_nondeterministic:
      if (deterministic) {
        throw core::usage_error(
            "--attention cudnn-nondeterministic gives up the bit-identical results that "
            "--deterministic asks for: drop one of them (--attention auto is deterministic)");
      }
      return {.cudnn = true, .deterministic_backward = false, .fallback_reason = {}};
    case Attention::automatic:
      break;
  }
  // auto: cuDNN only where its deterministic backward runs here, else the fallback throughout
  // (a cuDNN forward with the fallback's backward would gain little).
  if (!support.unavailable.empty()) {
    return {.cudnn = false, .deterministic_backward = true, .fallback_reason = support.unavailable};
  }
  if (!support.deterministic_unavailable.empty()) {
    return {.cudnn = false,
            .deterministic_backward = true,
            .fallback_reason = support.deterministic_unavailable};
  }
  return {.cudnn = true, .deterministic_backward = true, .fallback_reason = {}};
}

std::string describe_attention(Attention attention, const AttentionChoice& choice) {
  const std::string option = fmt::format("--attention {}", attention_name(attention));
  if (!choice.cudnn) {
    return choice.fallback_reason.empty()
               ? fmt::format(
                     "attention ({}): the fallback (cuBLAS GEMMs and softmax kernels), "
                     "deterministic backward",
                     option)
               : fmt::format(
                     "attention ({}): the fallback (cuBLAS GEMMs and softmax kernels), "
                     "deterministic backward; cuDNN not used: {}",
                     option, choice.fallback_reason);
  }
  if (choice.deterministic_backward) {
    return fmt::format(
        "attention ({}): cuDNN fused attention with its deterministic backward where cuDNN "
        "takes the shape, the fallback elsewhere; bit-identical reruns and restarts",
        option);
  }
  return fmt::format(
      "attention ({}): cuDNN fused attention with its non-deterministic backward (dQ summed in "
      "a varying order): reruns and restarts are not bit-identical",
      option);
}

}  // namespace l3::kernels
