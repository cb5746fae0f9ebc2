// GRPO's settings (`llama3-hpc grpo`, docs/TRAINING.md), named and defaulted after TRL's
// GRPOConfig: how a step samples its completions, scores them, turns the rewards into
// advantages and weighs the clipped surrogate loss.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace l3::train {

// How the per-token losses of a step become its loss (TRL's loss_type):
//   grpo:    each completion's mean over its tokens, then the mean over the completions
//   bnpo:    the mean over each micro-batch's tokens, then the mean over the micro-batches
//   dr_grpo: the sum over all tokens / (completions x max_completion_length)
//   dapo:    the sum over all tokens / the step's tokens (TRL's default)
enum class PolicyLossType : std::uint8_t { grpo, bnpo, dr_grpo, dapo };
// What a completion's reward minus its group's baseline is divided by (TRL's scale_rewards):
// its group's standard deviation, the whole step's, or nothing; + 1e-4 in the first two.
enum class RewardScaling : std::uint8_t { group, batch, none };
// The baseline: the group's mean (GRPO), or the mean of the group's other completions (RLOO).
enum class AdvantageEstimator : std::uint8_t { grpo, rloo };
// TRL's vllm_importance_sampling_mode: the ratio of the trainer's to the generator's probability
// per completion (sequence_*) or per token (token_*), masked to 0 or truncated outside its
// bounds (kernels::ImportanceSampling).
enum class ImportanceSamplingMode : std::uint8_t {
  sequence_mask,
  sequence_truncate,
  token_mask,
  token_truncate
};

struct GrpoSettings {
  // Sampling.
  std::int64_t num_generations = 8;          // completions per prompt (a group)
  std::int64_t max_completion_length = 256;  // tokens a completion may have
  double temperature = 1.0;
  double top_p = 1.0;
  std::int64_t top_k = 0;  // 0: off
  // The loss.
  double beta = 0.0;  // KL to the reference (k3); 0: no reference is kept
  double epsilon = 0.2;
  double epsilon_high = -1;  // < 0: epsilon
  PolicyLossType loss_type = PolicyLossType::dapo;
  RewardScaling scale_rewards = RewardScaling::group;
  AdvantageEstimator advantage = AdvantageEstimator::grpo;
  std::int64_t num_iterations = 1;  // optimizer steps per generation batch
  bool mask_truncated_completions = false;
  // TRL's vllm_importance_sampling_correction (on by default): each token's loss times the
  // ratio of the trainer's probability of the completion (or token) before this generation
  // batch's updates to the generator's, in [clip_min, clip_max] (no bound: nullopt).
  bool importance_sampling_correction = true;
  ImportanceSamplingMode importance_sampling_mode = ImportanceSamplingMode::sequence_mask;
  std::optional<double> importance_sampling_clip_max = 3.0;
  std::optional<double> importance_sampling_clip_min;
  // Every log-probability the loss uses (the policy's, the old policy's, the reference's, the
  // generator's) and the entropy are of softmax(logits / temperature), as TRL computes them;
  // false (--raw-logprobs): of the raw logits.
  bool tempered_logprobs = true;
  // How the training passes (policy, old policy, reference) lay out a micro-batch's completions:
  // true, end to end in one row, each with its prompt as a segment of its own (padding-free,
  // as SFT packs documents); false (--pad-completions): one row of --seq-len per completion.
  bool pack_completions = true;
  // Rewards, in this order: the built-in answer match, the verifier command, the reward model.
  // Weights: one per reward in use (empty: all 1).
  bool reward_match_answer = false;
  std::string reward_command;
  double reward_timeout = 60;  // seconds a verifier may take to answer one request
  std::string reward_model;    // a reward checkpoint or HF sequence classifier; empty: none
  std::string reward_adapter;  // a PEFT reward adapter folded into reward_model; empty: none
  std::vector<double> reward_weights;
  std::string log_completions;  // JSONL of every sample (rank 0 writes it); empty: none

  // What the loss's logits are multiplied by (kernels::logit_scale: 1/temperature, or 1).
  [[nodiscard]] float logit_scale() const noexcept;
  [[nodiscard]] double clip_high() const noexcept {
    return epsilon_high < 0 ? epsilon : epsilon_high;
  }
  // The rewards in use, by name (rewards/NAME/mean): "answer_match", "command", "reward_model".
  [[nodiscard]] std::vector<std::string> reward_names() const;
  // usage Error for settings that cannot work (no reward, weights that do not match).
  void validate() const;
  void add_to(nlohmann::json& config) const;  // the manifest's "config"
};

[[nodiscard]] PolicyLossType parse_policy_loss_type(std::string_view name);
[[nodiscard]] std::string_view policy_loss_type_name(PolicyLossType type) noexcept;
[[nodiscard]] RewardScaling parse_reward_scaling(std::string_view name);
[[nodiscard]] std::string_view reward_scaling_name(RewardScaling scaling) noexcept;
[[nodiscard]] AdvantageEstimator parse_advantage_estimator(std::string_view name);
[[nodiscard]] std::string_view advantage_estimator_name(AdvantageEstimator estimator) noexcept;
[[nodiscard]] ImportanceSamplingMode parse_importance_sampling_mode(std::string_view name);
[[nodiscard]] std::string_view importance_sampling_mode_name(ImportanceSamplingMode mode) noexcept;
// --importance-sampling-clip-max/-min (`option`): a number >= 0, or "none".
[[nodiscard]] std::optional<double> parse_importance_sampling_bound(std::string_view option,
                                                                    std::string_view text);

}  // namespace l3::train
