// LoRA (Hu et al., 2021, as Hugging Face PEFT computes it): chosen linear layers W of the frozen
// model compute W x + scale * B (A dropout(x)), A (r, in) and B (out, r) the trained adapters,
// scale = alpha / r (alpha / sqrt(r) with rsLoRA). A starts Kaiming-uniform and B at zero, so
// that the untrained adapters leave the model exactly as it was.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace l3::model {

// The linear layers of a decoder block that can carry an adapter, in layout order.
enum class LoraTarget : std::uint8_t { q, k, v, o, gate, up, down };
inline constexpr int kLoraTargetCount = 7;
inline constexpr std::array<LoraTarget, kLoraTargetCount> kLoraTargets{
    LoraTarget::q,    LoraTarget::k,  LoraTarget::v,   LoraTarget::o,
    LoraTarget::gate, LoraTarget::up, LoraTarget::down};

// Short name ("q", "gate") and the module path inside a block ("self_attn.q_proj").
[[nodiscard]] std::string_view lora_target_name(LoraTarget t);
[[nodiscard]] std::string_view lora_target_module(LoraTarget t);

struct LoraConfig {
  // The largest alpha, from --lora-alpha or an adapter_config.json: a scale beyond it is a
  // typo, and makes every loss non-finite.
  static constexpr double kMaxAlpha = 1e6;

  int rank = 0;                 // r; 0: no adapters (full fine-tuning)
  double alpha = 8.0;           // PEFT's default
  bool rslora = false;          // scale alpha / sqrt(r) instead of alpha / r
  double dropout = 0.0;         // on each adapter's input while training, in [0, 1)
  std::uint8_t targets = 0x7F;  // bit i: kLoraTargets[i] carries an adapter (all by default)

  [[nodiscard]] bool enabled() const noexcept { return rank > 0; }
  [[nodiscard]] bool targets_layer(LoraTarget t) const noexcept {
    return (targets >> static_cast<unsigned>(t) & 1U) != 0;
  }
  [[nodiscard]] float scale() const;
  // A usage Error naming the option when a value is out of range (rank < 0 or over 65536, alpha
  // outside (0, kMaxAlpha], dropout outside [0, 1), no target).
  void validate() const;
  // "q,k,v,o,gate,up,down" (the targets, in layout order).
  [[nodiscard]] std::string targets_text() const;
};

// The target mask of a comma-separated list of "q", "k", "v", "o", "gate", "up", "down" or
// PEFT's module names ("q_proj", ..., "down_proj"); a usage Error names an unknown entry.
[[nodiscard]] std::uint8_t parse_lora_targets(std::string_view list);

}  // namespace l3::model
