#include "train/grpo_settings.hpp"

#include <fmt/format.h>

#include <cmath>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.hpp"
#include "kernels/ops.hpp"

namespace l3::train {

std::vector<std::string> GrpoSettings::reward_names() const {
  std::vector<std::string> names;
  if (!environment.empty()) names.emplace_back("environment");
  if (reward_match_answer) names.emplace_back("answer_match");
  if (!reward_command.empty()) names.emplace_back("command");
  if (!reward_model.empty()) names.emplace_back("reward_model");
  return names;
}

void GrpoSettings::validate() const {
  const std::vector<std::string> names = reward_names();
  if (names.empty()) {
    throw core::usage_error(
        "grpo needs a reward: --environment \"CMD ARGS\", --reward-match answer, "
        "--reward-command \"CMD ARGS\" and/or --reward-model CKPT");
  }
  if (max_turns > 0 && environment.empty()) {
    throw core::usage_error(
        "--max-turns N needs --environment \"CMD ARGS\" (without one an episode is one turn)");
  }
  if (!reward_adapter.empty() && reward_model.empty())
    throw core::usage_error("--reward-adapter DIR needs --reward-model, the model it adapts");
  if (!reward_weights.empty() && reward_weights.size() != names.size()) {
    throw core::usage_error(
        fmt::format("--reward-weights gives {} weight{} for {} reward{} ({}: in this order)",
                    reward_weights.size(), reward_weights.size() == 1 ? "" : "s", names.size(),
                    names.size() == 1 ? "" : "s", fmt::join(names, ", ")));
  }
  if (num_generations < 2) {
    throw core::usage_error(
        "--num-generations must be at least 2 (advantages compare a prompt's completions)");
  }
  if (max_staleness >= 0 && generation_ranks == 0) {
    throw core::usage_error(
        "--max-staleness S needs --generation-ranks N (the lag between the generating and the "
        "training ranks)");
  }
  if (advantage == AdvantageEstimator::rloo && num_generations < 2)
    throw core::usage_error("--advantage rloo needs --num-generations >= 2");
  if (importance_sampling_clip_min && importance_sampling_clip_max &&
      *importance_sampling_clip_min > *importance_sampling_clip_max) {
    throw core::usage_error(
        fmt::format("--importance-sampling-clip-min {} is above --importance-sampling-clip-max {}",
                    *importance_sampling_clip_min, *importance_sampling_clip_max));
  }
}

float GrpoSettings::logit_scale() const noexcept {
  return tempered_logprobs ? kernels::logit_scale(temperature) : 1.0F;
}

void GrpoSettings::add_to(nlohmann::json& j) const {
  j["num_generations"] = num_generations;
  j["max_completion_length"] = max_completion_length;
  j["temperature"] = temperature;
  j["top_p"] = top_p;
  j["top_k"] = top_k;
  j["beta"] = beta;
  j["epsilon"] = epsilon;
  j["epsilon_high"] = clip_high();
  j["loss_type"] = policy_loss_type_name(loss_type);
  j["scale_rewards"] = reward_scaling_name(scale_rewards);
  j["advantage"] = advantage_estimator_name(advantage);
  j["num_iterations"] = num_iterations;
  j["mask_truncated_completions"] = mask_truncated_completions;
  j["importance_sampling_correction"] = importance_sampling_correction;
  j["importance_sampling_mode"] = importance_sampling_mode_name(importance_sampling_mode);
  j["importance_sampling_clip_max"] = importance_sampling_clip_max
                                          ? nlohmann::json(*importance_sampling_clip_max)
                                          : nlohmann::json(nullptr);
  j["importance_sampling_clip_min"] = importance_sampling_clip_min
                                          ? nlohmann::json(*importance_sampling_clip_min)
                                          : nlohmann::json(nullptr);
  j["logprobs"] = tempered_logprobs ? "tempered" : "raw";
  j["completions_layout"] = pack_completions ? "packed" : "padded";
  j["environment"] = environment;
  j["max_turns"] = environment.empty() ? 1 : turns();
  j["reward_match"] = reward_match_answer ? "answer" : "";
  j["reward_command"] = reward_command;
  j["reward_timeout"] = reward_timeout;
  j["reward_model"] = reward_model;
  j["reward_adapter"] = reward_adapter;
  j["reward_weights"] = reward_weights;
  j["generation_ranks"] = generation_ranks;
  j["max_staleness"] = staleness();
}

PolicyLossType parse_policy_loss_type(std::string_view name) {
  if (name == "grpo") return PolicyLossType::grpo;
  if (name == "bnpo") return PolicyLossType::bnpo;
  if (name == "dr_grpo") return PolicyLossType::dr_grpo;
  if (name == "dapo") return PolicyLossType::dapo;
  throw core::usage_error(
      fmt::format("--loss-type {}: use grpo, bnpo, dr_grpo or dapo", std::string(name)));
}

std::string_view policy_loss_type_name(PolicyLossType type) noexcept {
  switch (type) {
    case PolicyLossType::grpo:
      return "grpo";
    case PolicyLossType::bnpo:
      return "bnpo";
    case PolicyLossType::dr_grpo:
      return "dr_grpo";
    case PolicyLossType::dapo:
      break;
  }
  return "dapo";
}

RewardScaling parse_reward_scaling(std::string_view name) {
  // TRL's booleans too: true is "group", false "none".
  if (name == "group" || name == "true") return RewardScaling::group;
  if (name == "batch") return RewardScaling::batch;
  if (name == "none" || name == "false") return RewardScaling::none;
  throw core::usage_error(
      fmt::format("--scale-rewards {}: use group, batch or none", std::string(name)));
}

std::string_view reward_scaling_name(RewardScaling scaling) noexcept {
  switch (scaling) {
    case RewardScaling::batch:
      return "batch";
    case RewardScaling::none:
      return "none";
    case RewardScaling::group:
      break;
  }
  return "group";
}

AdvantageEstimator parse_advantage_estimator(std::string_view name) {
  if (name == "grpo") return AdvantageEstimator::grpo;
  if (name == "rloo") return AdvantageEstimator::rloo;
  throw core::usage_error(fmt::format("--advantage {}: use grpo or rloo", std::string(name)));
}

std::string_view advantage_estimator_name(AdvantageEstimator estimator) noexcept {
  return estimator == AdvantageEstimator::rloo ? "rloo" : "grpo";
}

ImportanceSamplingMode parse_importance_sampling_mode(std::string_view name) {
  if (name == "sequence_mask") return ImportanceSamplingMode::sequence_mask;
  if (name == "sequence_truncate") return ImportanceSamplingMode::sequence_truncate;
  if (name == "token_mask") return ImportanceSamplingMode::token_mask;
  if (name == "token_truncate") return ImportanceSamplingMode::token_truncate;
  throw core::usage_error(fmt::format(
      "--importance-sampling-mode {}: use sequence_mask, sequence_truncate, token_mask or "
      "token_truncate",
      std::string(name)));
}

std::string_view importance_sampling_mode_name(ImportanceSamplingMode mode) noexcept {
  switch (mode) {
    case ImportanceSamplingMode::sequence_truncate:
      return "sequence_truncate";
    case ImportanceSamplingMode::token_mask:
      return "token_mask";
    case ImportanceSamplingMode::token_truncate:
      return "token_truncate";
    case ImportanceSamplingMode::sequence_mask:
      break;
  }
  return "sequence_mask";
}

std::optional<double> parse_importance_sampling_bound(std::string_view option,
                                                      std::string_view text) {
  if (text == "none") return std::nullopt;
  const std::string item(text);
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(item, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != item.size() || !std::isfinite(value) || value < 0) {
    throw core::usage_error(
        fmt::format("--{} {}: give a number >= 0, or none", std::string(option), item));
  }
  return value;
}

}  // namespace l3::train
