#include "model/lora_config.hpp"

#include <fmt/format.h>

#include <cmath>

#include "core/error.hpp"

namespace l3::model {

namespace {
constexpr std::array<std::string_view, kLoraTargetCount> kNames{"q",    "k",  "v",   "o",
                                                                "gate", "up", "down"};
constexpr std::array<std::string_view, kLoraTargetCount> kModules{
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
constexpr int kMaxRank = 65536;
}  // namespace

std::string_view lora_target_name(LoraTarget t) { return kNames.at(static_cast<std::size_t>(t)); }
std::string_view lora_target_module(LoraTarget t) {
  return kModules.at(static_cast<std::size_t>(t));
}

float LoraConfig::scale() const {
  if (rank <= 0) return 0.0F;
  return static_cast<float>(rslora ? alpha / std::sqrt(static_cast<double>(rank))
                                   : alpha / static_cast<double>(rank));
}

void LoraConfig::validate() const {
  if (rank < 0 || rank > kMaxRank) {
    throw core::usage_error(fmt::format("--lora-rank {} is outside [0, {}]", rank, kMaxRank));
  }
  if (!enabled()) return;
  if (!(alpha > 0.0 && alpha <= kMaxAlpha)) {
    throw core::usage_error(
        fmt::format("--lora-alpha {} is outside (0, {:g}]: not a LoRA scale", alpha, kMaxAlpha));
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw core::usage_error(fmt::format("--lora-dropout {} is outside [0, 1)", dropout));
  }
  if ((targets & 0x7FU) == 0) throw core::usage_error("--lora-targets names no layer");
}

std::string LoraConfig::targets_text() const {
  std::string text;
  for (const LoraTarget t : kLoraTargets) {
    if (!targets_layer(t)) continue;
    if (!text.empty()) text += ',';
    text += lora_target_name(t);
  }
  return text;
}

std::uint8_t parse_lora_targets(std::string_view list) {
  std::uint8_t mask = 0;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t comma = std::min(list.find(',', begin), list.size());
    std::string_view entry = list.substr(begin, comma - begin);
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    bool known = false;
    for (std::size_t i = 0; i < kNames.size(); ++i) {
      const std::string_view module = kModules[i].substr(kModules[i].find('.') + 1);
      if (entry == kNames[i] || entry == module) {
        mask = static_cast<std::uint8_t>(mask | (1U << i));
        known = true;
      }
    }
    if (!known) {
      throw core::usage_error(fmt::format(
          "--lora-targets: unknown layer '{}' (known: q, k, v, o, gate, up, down, or q_proj, ..., "
          "down_proj)",
          entry));
    }
    begin = comma + 1;
  }
  return mask;
}

}  // namespace l3::model
