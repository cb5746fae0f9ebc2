#include "core/phase.hpp"

namespace l3::core {

std::string_view phase_name(Phase phase) noexcept {
  switch (phase) {
    case Phase::reward:
      return "reward";
    case Phase::dpo:
      return "dpo";
    case Phase::grpo:
      return "grpo";
    case Phase::sft:
      break;
  }
  return "sft";
}

std::optional<Phase> parse_phase(std::string_view name) noexcept {
  for (const Phase phase : {Phase::sft, Phase::reward, Phase::dpo, Phase::grpo}) {
    if (name == phase_name(phase)) return phase;
  }
  return std::nullopt;
}

}  // namespace l3::core
