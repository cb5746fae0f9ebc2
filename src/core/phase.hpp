// The training phase (the public l3::Phase) by name: the one place its spelling ("sft",
// "reward", "dpo") is turned into the enum and back, for the option parser, manifests, metrics
// and logs. Everything else compares the enum.
#pragma once

#include <optional>
#include <string_view>

#include "l3/l3.hpp"

namespace l3::core {

[[nodiscard]] std::string_view phase_name(Phase phase) noexcept;
// The phase `name` spells; nothing for any other text.
[[nodiscard]] std::optional<Phase> parse_phase(std::string_view name) noexcept;

}  // namespace l3::core
